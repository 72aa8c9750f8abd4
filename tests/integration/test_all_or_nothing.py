"""Issue 15 on the real API server: every generated malformed spec
(tests/unit/malformed_specs.py, >= 200) is refused at admission or reported
InvalidSpec with no child created; none is half-created."""

from __future__ import annotations

import collections
import copy
import re

import pytest
from kubernetes.client.rest import ApiException

from tests.integration.test_operator import (  # noqa: F401 - fixtures
    CHILD_KINDS, GROUP, PLURAL, VERSION, Operator, children, condition, crd, expected, service, wait_for,
)
from tests.unit.malformed_specs import malformed_specs

pytestmark = pytest.mark.integration


def test_every_malformed_spec_is_refused_or_creates_nothing(kube_cluster, crd, namespace, custom_objects,  # noqa: F811
                                                           api_client, tmp_path):
    log = tmp_path / "operator.log"
    op = Operator(kube_cluster.kubeconfig, namespace, log).start()
    try:
        cases = malformed_specs()
        assert len(cases) >= 200
        admitted: dict[str, str] = {}
        at_admission: dict[str, str] = {}
        for i, (case, body) in enumerate(cases):
            body = copy.deepcopy(body)
            name = f"m{i}"
            body["metadata"] = {"name": name, "namespace": namespace, "annotations": {"test/case": case}}
            try:
                custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
                admitted[name] = case
            except ApiException as err:
                assert err.status in (400, 422), (case, err.status, err.body)
                at_admission[case] = err.body
        # a good service alongside: the operator does create what is valid
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, service("good", namespace))

        def reported():
            items = custom_objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
            out = {}
            for obj in items:
                name = obj["metadata"]["name"]
                c = condition(obj, "Ready")
                if name in admitted and c and c["reason"] in ("InvalidSpec", "ApplyFailed") \
                        and obj["status"].get("observedGeneration") == obj["metadata"]["generation"]:
                    out[name] = c
            return out if len(out) == len(admitted) else None

        try:
            statuses = wait_for(reported, 240, f"all {len(admitted)} admitted malformed services reported", interval=2)
        except AssertionError:
            items = custom_objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
            for obj in items:
                c = condition(obj, "Ready")
                if obj["metadata"]["name"] in admitted and not (c and c["reason"] == "InvalidSpec"):
                    print("NOT REPORTED", admitted[obj["metadata"]["name"]], c)
            print(log.read_text()[-5000:])
            raise
        # nothing half-created: no child of any malformed service exists
        leftovers = collections.Counter()
        for kind, api_version, plural in CHILD_KINDS:
            base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
            resp = api_client.call_api(*api_client.param_serialize(
                "GET", f"{base}/namespaces/{namespace}/{plural}",
                query_params=[("labelSelector", "app.kubernetes.io/managed-by=pd-operator,pdserving.io/service!=good")],
                auth_settings=["BearerToken"]))
            import json

            for item in json.loads(resp.read())["items"]:
                leftovers[(item["metadata"]["labels"]["pdserving.io/service"], kind)] += 1
        half = {admitted.get(svc, svc): kind for (svc, kind) in leftovers}
        assert not half, f"half-created: {half}"
        # the good service was created after the malformed ones: it may still be in the queue
        wait_for(lambda: set(children(api_client, namespace, "good")) == expected("good"), 120,
                 "the good service's children", interval=1)
        # every report names a field path
        by = collections.Counter()
        for name, c in statuses.items():
            assert c["reason"] == "InvalidSpec", (admitted[name], c)
            # the spec field, or the child and its field the API server named (e.g. Service/x metadata.annotations)
            assert re.search(r"(^|[ /])(spec|metadata)\.\w", c["message"]), (admitted[name], c["message"])
            by["dry-run (a child refused)" if re.match(r"^\w+/\S+ ", c["message"]) else "operator validation"] += 1
        print(f"\n{len(cases)} malformed specs: {len(at_admission)} refused at admission, "
              f"{len(admitted)} reported InvalidSpec ({dict(by)}); none half-created")
    finally:
        op.stop()


def test_a_quota_filled_by_a_service_of_the_same_spec_leaves_nothing_of_the_next(  # noqa: F811
        kube_cluster, crd, namespace, custom_objects, api_client, core_v1, tmp_path):
    """A ResourceQuota on count/statefulsets.apps that the first service fills: the second,
    of the same spec, reuses the first's dry-run verdicts, and the API server refuses its
    first StatefulSet only at the write (a dry-run adds nothing to a quota's usage). It is
    reported ApplyFailed with the quota's words, and none of its children is left."""
    core_v1.create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "sts"}, "spec": {"hard": {"count/statefulsets.apps": "2"}}})
    log = tmp_path / "operator.log"
    op = Operator(kube_cluster.kubeconfig, namespace, log).start()
    try:
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, service("a", namespace))
        wait_for(lambda: set(children(api_client, namespace, "a")) == expected("a"), 120, "a's children", interval=1)
        custom_objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, service("b", namespace))

        def failed():
            c = condition(custom_objects.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "b"), "Ready")
            return c if c and c["reason"] == "ApplyFailed" else None

        try:
            c = wait_for(failed, 120, "b reported ApplyFailed", interval=1)
        except AssertionError:
            print(log.read_text()[-5000:])
            raise
        assert "exceeded quota" in c["message"], c
        assert children(api_client, namespace, "b") == {}
        assert set(children(api_client, namespace, "a")) == expected("a")
    finally:
        op.stop()
