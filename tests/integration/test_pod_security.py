"""Pod Security admission: in a namespace enforcing baseline, an RDMA service's
engine pods (IPC_LOCK) are refused; status says so with the level to set.
The local API server enforces PSA on labelled namespaces; its StatefulSet
controller records the refusal as a FailedCreate event. Run by the lead."""

from __future__ import annotations

import pytest

from tests.conftest import minimal
from tests.integration.test_operator import crd, operator, wait_for  # noqa: F401  (fixtures)

pytestmark = pytest.mark.integration


def test_baseline_namespace_refuses_rdma_engines_and_status_says_the_fix(core_v1, custom_objects, namespace, operator):
    core_v1.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}})
    obj = minimal(kvTransfer={"rdma": {"resourceName": "rdma/rdma_shared_device_a", "ibDevices": ["mlx5_0"]}})
    obj["metadata"] = {"name": "psa", "namespace": namespace}
    custom_objects.create_namespaced_custom_object("pdserving.io", "v1alpha1", namespace, "pdinferenceservices", obj)

    def prefill_condition():
        st = custom_objects.get_namespaced_custom_object("pdserving.io", "v1alpha1", namespace,
                                                         "pdinferenceservices", "psa").get("status") or {}
        c = next((c for c in st.get("conditions", []) if c["type"] == "PrefillReady"), None)
        return c if c and c.get("reason") == "PodSecurityForbidden" else None

    cond = wait_for(prefill_condition, 120, "PrefillReady PodSecurityForbidden")
    assert "IPC_LOCK" in cond["message"] and "enforce=privileged" in cond["message"]
