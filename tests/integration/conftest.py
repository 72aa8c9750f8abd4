"""Fixtures for integration tests against a real Kubernetes API server.

Which cluster:
  * If $KUBECONFIG points at a reachable cluster (kind, the local one started
    by `e2e/cluster.sh up`, anything), it is used as is and never torn down.
  * Otherwise the local control plane (e2e/cluster.py: real etcd,
    kube-apiserver, kube-controller-manager, kube-scheduler + kwok GPU nodes)
    is built if its binaries are missing and started. It is stopped at the end
    of the session only if this session started it; set PD_KEEP_CLUSTER=1 to
    keep it running for the next run (warm start is then a no-op).

Every test gets its own namespace (``namespace`` fixture), deleted afterwards.
Tests in this directory are marked ``@pytest.mark.integration``.
"""
from __future__ import annotations

import dataclasses
import os
import re
import time
import uuid

import pytest

kubernetes = pytest.importorskip("kubernetes", reason="integration tests need the kubernetes client")
from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from tests.conftest import load_e2e_module  # noqa: E402



def load_local_cluster_module():
    """e2e/cluster.py, imported by path (e2e/ is not a package)."""
    return load_e2e_module("cluster")


@dataclasses.dataclass(frozen=True)
class Cluster:
    kubeconfig: str
    local: bool  # True: the kwok-based local control plane (GPU nodes are kwok nodes)


def _reachable(kubeconfig: str) -> bool:
    try:
        api = config.new_client_from_config(config_file=kubeconfig)
    except Exception:
        return False
    try:
        with api:
            client.VersionApi(api).get_code(_request_timeout=5)
        return True
    except Exception:
        return False


# The tests get a local cluster of their own, apart from the main job's
# (e2e/run.sh, cluster "pd-local"): what a user left running there, say the
# example service holding 16 GPUs, must not change what the tests can schedule.
TEST_CLUSTER = os.environ.get("PD_TEST_CLUSTER", "pd-test")


@pytest.fixture(scope="session")
def kube_cluster():
    external = os.environ.get("KUBECONFIG")
    mod = load_local_cluster_module()
    if external and _reachable(external):
        local = os.path.abspath(external) in (str(mod.kubeconfig_path()), str(mod.kubeconfig_path(TEST_CLUSTER)))
        yield Cluster(kubeconfig=external, local=local)
        return
    was_running = mod.is_running(TEST_CLUSTER)
    kc = str(mod.up(TEST_CLUSTER))
    clear_leftovers(kc)
    try:
        yield Cluster(kubeconfig=kc, local=True)
    finally:
        if not was_running and not os.environ.get("PD_KEEP_CLUSTER"):
            _wait_test_namespaces_gone(kc)
            mod.down(TEST_CLUSTER)


def clear_leftovers(kubeconfig: str, timeout: float = 180.0) -> None:
    """A test session killed midway leaves its namespaces in the cluster's etcd, and a warm
    start brings them back with pods bound to nodes: every later test would count the GPUs
    they hold (seen: "the free GPUs fit 0 more" in test_autoscaler after a killed run).
    Delete them before any test: the namespace first (nothing new can be created in it),
    then its pods at once (grace 0: no process runs them any more, so nothing drains), and
    wait until they are gone."""
    api = config.new_client_from_config(config_file=kubeconfig)
    deadline = time.monotonic() + timeout
    with api:
        core = client.CoreV1Api(api)
        while left := core.list_namespace(label_selector="pdserving.io/test=integration").items:
            assert time.monotonic() < deadline, f"leftover test namespaces not gone: {[n.metadata.name for n in left]}"
            for ns in left:
                name = ns.metadata.name
                try:
                    if ns.metadata.deletion_timestamp is None:
                        core.delete_namespace(name, propagation_policy="Background")
                    for pod in core.list_namespaced_pod(name).items:
                        core.delete_namespaced_pod(pod.metadata.name, name, grace_period_seconds=0)
                except ApiException as e:
                    if e.status != 404:
                        raise
            time.sleep(1)


def _wait_test_namespaces_gone(kubeconfig: str, timeout: float = 60.0) -> None:
    """Let the test namespaces (deleted in the background) finish going before the
    cluster stops: pods deleted across a restart make kwok free their IPs after it
    has handed them out again (seen: two running pods with one IP)."""
    api = config.new_client_from_config(config_file=kubeconfig)
    deadline = time.monotonic() + timeout
    with api:
        core = client.CoreV1Api(api)
        while time.monotonic() < deadline:
            if not core.list_namespace(label_selector="pdserving.io/test=integration").items:
                return
            time.sleep(0.5)


@pytest.fixture(scope="session")
def api_client(kube_cluster) -> client.ApiClient:
    api = config.new_client_from_config(config_file=kube_cluster.kubeconfig)
    yield api
    api.close()


@pytest.fixture(scope="session")
def core_v1(api_client) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def apps_v1(api_client) -> client.AppsV1Api:
    return client.AppsV1Api(api_client)


@pytest.fixture(scope="session")
def apiextensions_v1(api_client) -> client.ApiextensionsV1Api:
    return client.ApiextensionsV1Api(api_client)


@pytest.fixture(scope="session")
def custom_objects(api_client) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item (``item.rep_call``) so that
    fixtures can tell, at teardown, whether the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


def failed(request) -> bool:
    report = getattr(request.node, "rep_call", None)
    return bool(report and report.failed)


def _describe_namespace(api_client, namespace: str) -> str:
    """What a failed test's namespace holds: the workloads' and pods' states and
    the services' conditions, one line each (to read a CI failure without the
    cluster)."""
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    lines = []
    for sts in apps.list_namespaced_stateful_set(namespace).items:
        st = sts.status
        lines.append(f"StatefulSet {sts.metadata.name}: gen {sts.metadata.generation} observed {st.observed_generation} "
                     f"replicas {sts.spec.replicas} ready {st.ready_replicas} updated {st.updated_replicas} "
                     f"current {st.current_revision} update {st.update_revision}")
    for dep in apps.list_namespaced_deployment(namespace).items:
        lines.append(f"Deployment {dep.metadata.name}: replicas {dep.spec.replicas} ready {dep.status.ready_replicas}")
    for pod in core.list_namespaced_pod(namespace).items:
        ready = [c.status for c in pod.status.conditions or [] if c.type == "Ready"]
        lines.append(f"Pod {pod.metadata.name}: {pod.status.phase} ready {ready} node {pod.spec.node_name} "
                     f"revision {(pod.metadata.labels or {}).get('controller-revision-hash')} "
                     f"deleting {pod.metadata.deletion_timestamp is not None}")
    try:
        services = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
            "pdserving.io", "v1alpha1", namespace, "pdinferenceservices")["items"]
    except ApiException:
        services = []
    for svc in services:
        st = svc.get("status") or {}
        lines.append(f"PDInferenceService {svc['metadata']['name']}: generation {svc['metadata'].get('generation')} "
                     f"observed {st.get('observedGeneration')}")
        lines += [f"  {c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message', '')[:200]}"
                  for c in st.get("conditions") or []]
    return "\n".join(lines)


@pytest.fixture
def namespace(request, core_v1) -> str:
    """A fresh namespace for one test, deleted (not waited for) afterwards."""
    base = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{base}-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={"pdserving.io/test": "integration"})))
    try:
        # Pods are refused until the service-account controller has made the
        # namespace's "default" ServiceAccount (ServiceAccount admission).
        deadline = time.monotonic() + 30
        while True:
            try:
                core_v1.read_namespaced_service_account("default", name)
                break
            except ApiException as e:
                if e.status != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield name
    finally:
        if failed(request):
            try:
                print(f"\n[namespace {name} at the failure]\n{_describe_namespace(core_v1.api_client, name)}")
            except Exception as err:  # a report, never a second failure
                print(f"[namespace {name}: not described: {err}]")
        try:
            core_v1.delete_namespace(name, propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise


def free_gpus(core: client.CoreV1Api, resource: str = "nvidia.com/gpu") -> dict[str, int]:
    """node -> GPUs not requested by any unfinished pod bound to it."""
    free = {n.metadata.name: int(n.status.allocatable.get(resource, 0)) for n in core.list_node().items}
    for pod in core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items:
        if pod.spec.node_name in free:
            free[pod.spec.node_name] -= _gpus_requested(pod, resource)
    return free


def _gpus_requested(pod, resource: str) -> int:
    return sum(int(((c.resources and c.resources.requests) or {}).get(resource, 0)) for c in pod.spec.containers)


def gpu_holders(core: client.CoreV1Api, resource: str = "nvidia.com/gpu") -> list[str]:
    """Every unfinished pod that requests GPUs: namespace/name, node, GPUs, and whether it or
    its namespace is being deleted (for a failure message)."""
    going = {ns.metadata.name for ns in core.list_namespace().items if ns.metadata.deletion_timestamp}
    return [f"{p.metadata.namespace}/{p.metadata.name} on {p.spec.node_name}: {_gpus_requested(p, resource)}"
            + (" (being deleted)" if p.metadata.deletion_timestamp or p.metadata.namespace in going else "")
            for p in core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items
            if _gpus_requested(p, resource)]


def wait_gpus_released(core: client.CoreV1Api, timeout: float = 180, resource: str = "nvidia.com/gpu") -> None:
    """Wait until no pod left over by an earlier test still holds GPUs: a pod being
    deleted, or any pod of a namespace being deleted (the namespace controller has
    not reached it yet). Tests delete their namespaces without waiting, and a pod
    that drains (preStop, SIGTERM) keeps its GPUs until its process exits: a test
    that counts free GPUs would otherwise count a cluster that is still emptying."""
    def leftovers() -> list[str]:
        going = {ns.metadata.name for ns in core.list_namespace().items if ns.metadata.deletion_timestamp}
        return [f"{p.metadata.namespace}/{p.metadata.name}"
                for p in core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items
                if (p.metadata.deletion_timestamp or p.metadata.namespace in going) and _gpus_requested(p, resource)]
    deadline = time.monotonic() + timeout
    while (left := leftovers()):
        if time.monotonic() > deadline:
            raise AssertionError(f"GPUs still held after {timeout:.0f}s by pods being deleted: {left[:10]}")
        time.sleep(1)
