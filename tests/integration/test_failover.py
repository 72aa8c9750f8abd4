"""Issue 15: two operator replicas, one Lease. kill -9 of the active one while
services are being created and edited: the standby takes over and converges
every service; at no moment do both write."""

from __future__ import annotations

import re
import time

import pytest

from tests.integration.test_operator import (  # noqa: F401 - fixtures
    GROUP, PLURAL, VERSION, Operator, children, condition, create, crd, expected, get_svc, service, wait_for,
)

pytestmark = pytest.mark.integration

LEASE = "pd-operator-leader"


def holder(api_client, namespace: str) -> str | None:
    import json

    try:
        resp = api_client.call_api(*api_client.param_serialize(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}", auth_settings=["BearerToken"]))
    except Exception:
        return None
    return (json.loads(resp.read()).get("spec") or {}).get("holderIdentity") or None


def test_kill_the_active_replica_while_services_are_created_and_edited(kube_cluster, crd, namespace,  # noqa: F811
                                                                       custom_objects, api_client, apps_v1, tmp_path):
    env = {"PD_OPERATOR_WARMUP_SECONDS": "1"}
    a = Operator(kube_cluster.kubeconfig, namespace, tmp_path / "a.log", env=env).start()
    b = Operator(kube_cluster.kubeconfig, namespace, tmp_path / "b.log", env=env).start()
    try:
        first = wait_for(lambda: holder(api_client, namespace), 30, "a lease holder")
        logs = {op: (tmp_path / f"{n}.log") for n, op in (("a", a), ("b", b))}

        def identity(op):
            m = re.search(r"(\S+) holds the lease", logs[op].read_text())
            return m.group(1) if m else None

        wait_for(lambda: identity(a) or identity(b), 30, "the holder's log line")
        active, standby = (a, b) if identity(a) == first else (b, a)
        names = [f"s{i}" for i in range(12)]
        for n in names[:6]:
            create(custom_objects, service(n, namespace))
        # edits in flight as the active one dies
        for n in names[:3]:
            custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, n,
                                                          {"spec": {"router": {"replicas": 2}}})
        killed_at = time.monotonic()
        active.kill()  # SIGKILL: no release of the lease
        for n in names[6:]:
            create(custom_objects, service(n, namespace))
        for n in names[3:6]:
            custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, n,
                                                          {"spec": {"router": {"replicas": 2}}})
        wait_for(lambda: identity(standby) is not None and holder(api_client, namespace) == identity(standby),
                 40, "the standby holding the lease")
        takeover = time.monotonic() - killed_at

        def converged():
            for n in names:
                obj = get_svc(custom_objects, namespace, n)
                c = condition(obj, "Ready")
                if not c or obj["status"].get("observedGeneration") != obj["metadata"]["generation"]:
                    return False
                # (a router with 2 replicas gets more children, e.g. its own PDB: expected() is the minimum)
                if expected(n) - set(children(api_client, namespace, n)):
                    return False
            return True

        try:
            wait_for(converged, 120, "every service converged after the failover", interval=1)
        except AssertionError:
            lines = []
            for n in names:
                obj = get_svc(custom_objects, namespace, n)
                missing = expected(n) - set(children(api_client, namespace, n))
                lines.append(f"{n} gen={obj['metadata']['generation']} "
                             f"observed={(obj.get('status') or {}).get('observedGeneration')} "
                             f"ready={condition(obj, 'Ready')} missing={sorted(missing)}")
            for op, path in logs.items():
                lines.append(f"--- {path.name}\n" + path.read_text()[-4000:])
            raise AssertionError("not converged:\n" + "\n".join(lines)) from None
        for n in names[:6]:
            assert apps_v1.read_namespaced_deployment(f"{n}-router", namespace).spec.replicas == 2, n
        # one writer: every child is written only by the operator's managers, and
        # the killed replica never wrote after the standby took over (it is dead;
        # the standby wrote nothing before it held the lease: its log says when)
        for n in names:
            for (kind, child), obj in children(api_client, namespace, n).items():
                managers = {m["manager"] for m in obj["metadata"].get("managedFields") or []
                            if not m.get("subresource")}
                assert managers <= {"pd-operator", "pd-operator-replicas", "kube-controller-manager"}, (kind, child, managers)
        standby_log = logs[standby].read_text()
        assert standby_log.count("holds the lease") == 1
        print(f"\ntakeover {takeover:.1f}s after kill -9 (lease 15 s, renew 5 s); {len(names)} services converged")
    finally:
        a.stop()
        b.stop()


def test_a_rolling_update_hands_the_lease_over_without_a_gap(kube_cluster, crd, namespace,  # noqa: F811
                                                             custom_objects, api_client, apps_v1, tmp_path):
    """What ``helm upgrade`` does to the chart's two replicas (maxSurge 1, maxUnavailable
    0): a new replica starts, then the old ones get SIGTERM in turn. The active one
    releases the Lease as it stops, so a standby takes over at its next check (renew
    5 s), not after the 15-s expiry a kill -9 costs; an edit made as the active one stops
    is applied within that."""
    env = {"PD_OPERATOR_WARMUP_SECONDS": "1"}
    logs = {n: tmp_path / f"{n}.log" for n in ("a", "b", "c")}
    ops = {n: Operator(kube_cluster.kubeconfig, namespace, logs[n], env=env) for n in logs}
    ops["a"].start()
    ops["b"].start()
    try:
        first = wait_for(lambda: holder(api_client, namespace), 30, "a lease holder")

        def identity(n):
            m = re.search(r"(\S+) holds the lease", logs[n].read_text()) if logs[n].exists() else None
            return m.group(1) if m else None

        wait_for(lambda: identity("a") or identity("b"), 30, "the holder's log line")
        old_active = "a" if identity("a") == first else "b"
        old_standby = "b" if old_active == "a" else "a"
        create(custom_objects, service("r0", namespace))
        wait_for(lambda: apps_v1.read_namespaced_deployment("r0-router", namespace).spec.replicas == 1, 60, "r0 created")
        ops["c"].start()  # the surge replica of the new ReplicaSet
        time.sleep(3)  # up and watching (the rollout waits for it to be Ready)
        gaps = []
        for stopping, replicas in ((old_active, 2), (old_standby, 3)):
            was = holder(api_client, namespace)
            started = time.monotonic()
            ops[stopping].stop()  # SIGTERM: kopf's cleanup releases the Lease if it holds it
            if was == identity(stopping):  # released as it exited, not left to expire
                assert holder(api_client, namespace) != was, f"{stopping} exited holding the lease"
            custom_objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "r0",
                                                          {"spec": {"router": {"replicas": replicas}}})
            wait_for(lambda: apps_v1.read_namespaced_deployment("r0-router", namespace).spec.replicas == replicas,
                     30, f"the edit applied after {stopping} stopped")
            gaps.append((stopping, was == identity(stopping), time.monotonic() - started))
        # each stop handed over (or cost nothing, a standby's) before the Lease would have
        # expired (15 s after its last renewal, 10-15 s after the SIGTERM, then up to 5 s to
        # the standby's next check): the edit made as it stopped is applied; the bound leaves
        # a loaded CI machine time to shut the old replica down, the release is checked above
        (_, was_active, gap), (_, _, second) = gaps
        assert was_active and gap < 14.0 and second < 14.0, gaps
        wait_for(lambda: holder(api_client, namespace) == identity("c"), 10, "the new replica holding the lease")
        print(f"\nrolling update: edit applied {gap:.1f}s after SIGTERM to the active replica, "
              f"{second:.1f}s after SIGTERM to the standby")
    finally:
        for op in ops.values():
            op.stop()
