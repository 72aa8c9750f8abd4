"""Issue 15: reads from the watches (no request when nothing changes), one
keyed work queue (coalescing, per-key backoff, eviction) and the Lease that
makes one replica of several the writer."""

from __future__ import annotations

import copy
import json
import threading

from kubernetes.client.rest import ApiException

from pd_operator.controller import handlers
from pd_operator.controller.cache import SERVICE_KIND, Cache, CachedKube
from pd_operator.controller.leader import LeaderElector
from pd_operator.controller.reconcile import reconcile
from pd_operator.controller.workqueue import WorkQueue
from tests.conftest import minimal
from tests.unit.fakeapi import FakeApi

NS = "ns"


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# --------------------------------------------------------------------------
# the watch cache: an idle reconcile sends nothing
# --------------------------------------------------------------------------


def watched(api: FakeApi, cache: Cache) -> None:
    """What the watches deliver: every object the fake API server holds (the
    StatefulSets with the pods their controller made)."""
    for (kind, _, _), obj in api.objects.items():
        if kind == "StatefulSet":
            obj["status"] = {"replicas": obj["spec"]["replicas"]}
        cache.put(kind, copy.deepcopy(obj))
    for body in api.services.values():
        cache.put(SERVICE_KIND, copy.deepcopy(body))


def one_service(engine: dict | None = None, **metadata) -> tuple[FakeApi, Cache, CachedKube]:
    """A fake API server holding one service "svc", its watch cache, and the cached client."""
    api, cache = FakeApi(), Cache()
    body = minimal(engine=engine or {"kind": "vllm"})
    body["metadata"] = {"namespace": NS, "name": "svc", "uid": "u1", "generation": 1, **metadata}
    api.services[(NS, "svc")] = body
    watched(api, cache)
    return api, cache, CachedKube(api, cache)


def test_an_idle_reconcile_from_the_cache_sends_no_request_at_all():
    api, cache, kube = one_service({"kind": "vllm", "apiKeySecretRef": {"name": "key", "key": "k"}})
    for _ in range(2):  # created; then the status with the pods the StatefulSet controller made
        reconcile(kube, kube.get_service(NS, "svc"), lambda *a: None)
        watched(api, cache)
    api.calls.clear()
    for _ in range(3):
        reconcile(kube, kube.get_service(NS, "svc"), lambda *a: None)
        watched(api, cache)
    # before: ~28 requests per reconcile (GET and PATCH of every child, nine LISTs to prune, pods, events, the Secret)
    assert api.calls == []


def test_a_status_write_is_cached_so_the_next_reconcile_does_not_repeat_it():
    api, cache, kube = one_service()
    reconcile(kube, kube.get_service(NS, "svc"), lambda *a: None)
    watched(api, cache)  # the children and the pods the StatefulSet controller made
    api.services[(NS, "svc")]["metadata"]["resourceVersion"] = "0"  # the status write's echo comes later
    api.calls.clear()
    reconcile(kube, kube.get_service(NS, "svc"), lambda *a: None)
    reconcile(kube, kube.get_service(NS, "svc"), lambda *a: None)  # before the watch brings the status back
    assert [c for c in api.calls if c[0] == "patch_status"] == [("patch_status", "pd-operator")]


def test_a_status_write_never_hides_a_spec_edit_the_watch_has_not_delivered():
    from pd_operator.controller.handlers import _spec_changed

    api, cache, kube = one_service(resourceVersion="1")
    seen = copy.deepcopy(kube.get_service(NS, "svc"))
    api.services[(NS, "svc")]["spec"].setdefault("decode", {})["replicas"] = 3  # an edit, not yet delivered
    api.services[(NS, "svc")]["metadata"]["generation"] = 2
    kube.patch_status(NS, "svc", {"observedGeneration": 1})
    cached = cache.get(SERVICE_KIND, NS, "svc")
    assert cached["metadata"]["generation"] == 1
    # the edit's watch event then still reads as a change, and queues its reconcile
    assert _spec_changed(cached, api.get_service(NS, "svc"))
    # with no edit in between, the write's response is what the cache holds
    api.services[(NS, "svc")] = seen
    watched(api, cache)
    kube.patch_status(NS, "svc", {"observedGeneration": 1})
    assert cache.get(SERVICE_KIND, NS, "svc")["status"]["observedGeneration"] == 1


def test_creating_a_service_reads_nothing_but_its_two_pools():
    # the children are new: the cache not having them is the answer, except for the pools
    # (one taken for absent would be created at its initial size over an autoscaled one)
    api, cache, kube = one_service()
    reconcile(kube, kube.get_service(NS, "svc"), lambda *a: None)
    reads = [c for c in api.calls if c[0] in ("get", "list")]
    assert sorted(set(reads)) == [("get", "StatefulSet")] and len(reads) == 2, reads
    applied = sorted(kind for verb, kind in api.calls if verb == "apply")
    assert sorted(kind for verb, kind in api.calls if verb == "apply-dry-run") == applied and len(applied) >= 10


def test_a_service_created_while_this_replica_writes_reads_nothing_at_all(monkeypatch):
    """Its pools can only be ones this replica wrote (and cached); one listed at start,
    or added while another replica led, still has its pools asked for."""
    monkeypatch.setattr(handlers, "reconcile_service", lambda *a, **k: None)
    body = minimal(engine={"kind": "vllm"})

    def created(name: str, type_: str | None) -> list:
        api = FakeApi()
        b = copy.deepcopy(body)
        b["metadata"] = {"namespace": NS, "name": name, "uid": f"u-{name}", "generation": 1}
        api.services[(NS, name)] = b
        handlers.on_service_event({"type": type_, "object": copy.deepcopy(b)})
        kube = CachedKube(api, handlers.CACHE)
        reconcile(kube, kube.get_service(NS, name), lambda *a: None)
        return [c for c in api.calls if c[0] in ("get", "list")]

    try:
        assert created("new", "ADDED") == []
        assert created("listed", None) == [("get", "StatefulSet")] * 2  # kopf's initial listing has no type
        handlers.ACTIVE.clear()  # a standby sees it created; the leader creates its pools
        assert created("standby", "ADDED") == [("get", "StatefulSet")] * 2
        handlers.ACTIVE.set()
        handlers.CACHE.forget_service(NS, "new")
        handlers.CACHE.mark_born_here(NS, "again")
        handlers.CACHE.forget_born_here()  # the lead lost: another replica may write its pools
        assert not handlers.CACHE.born_here(NS, "again") and not handlers.CACHE.born_here(NS, "new")
    finally:
        handlers.ACTIVE.set()
        for name in ("new", "listed", "standby"):
            handlers.forget_service(NS, name)


def test_an_autoscaled_pool_that_drops_out_of_the_watch_is_not_created_again_at_its_initial_size(monkeypatch):
    """A service created here (born here: its pools are taken as absent without a GET) whose
    decode was scaled to 8; its StatefulSet's managed-by label is edited, and the label-selected
    watch reports it DELETED. The next reconcile asks for the pool (it exists) and keeps its 8
    replicas; it used to force-apply the pool at its initial size, killing 7 serving pods."""
    monkeypatch.setattr(handlers, "reconcile_service", lambda *a, **k: None)
    api = FakeApi()
    b = minimal(engine={"kind": "vllm"})
    b["metadata"] = {"namespace": NS, "name": "grown", "uid": "u-grown", "generation": 1}
    api.services[(NS, "grown")] = b
    try:
        handlers.on_service_event({"type": "ADDED", "object": copy.deepcopy(b)})
        kube = CachedKube(api, handlers.CACHE)
        reconcile(kube, kube.get_service(NS, "grown"), lambda *a: None)
        kube.apply_replicas("StatefulSet", NS, "grown-decode", 8)  # the autoscaler
        sts = api.objects[("StatefulSet", NS, "grown-decode")]
        handlers.on_child_event("StatefulSet", {"type": "DELETED", "object": copy.deepcopy(sts)})
        reconcile(kube, kube.get_service(NS, "grown"), lambda *a: None)
        assert api.objects[("StatefulSet", NS, "grown-decode")]["spec"]["replicas"] == 8
    finally:
        handlers.forget_service(NS, "grown")


def test_the_cache_keeps_the_fingerprint_of_our_fields_not_the_field_sets():
    from pd_operator.controller.reconcile import _our_fields

    obj = {"kind": "Service", "metadata": {"namespace": NS, "name": "x", "resourceVersion": "5", "managedFields": [
        {"manager": "pd-operator", "operation": "Apply", "time": "t1", "fieldsV1": {"f:spec": {"f:ports": {}}}},
        {"manager": "kubectl-edit", "operation": "Update", "time": "t2", "fieldsV1": {"f:metadata": {"f:labels": {}}}}]}}
    cache = Cache()
    cache.put("Service", obj)
    kept = cache.get("Service", NS, "x")
    assert all("fieldsV1" not in e for e in kept["metadata"]["managedFields"])
    assert [(e["manager"], e["time"]) for e in kept["metadata"]["managedFields"]] == [("pd-operator", "t1"), ("kubectl-edit", "t2")]
    assert _our_fields(kept) == _our_fields(obj) is not None
    # a hand edit moving one of our fields to another manager changes it
    edited = copy.deepcopy(obj)
    edited["metadata"]["managedFields"][0]["fieldsV1"] = {"f:spec": {}}
    cache.put("Service", {**edited, "metadata": {**edited["metadata"], "resourceVersion": "6"}})
    assert _our_fields(cache.get("Service", NS, "x")) != _our_fields(obj)


def test_the_cache_keeps_no_command_lines_but_what_status_and_the_gpu_fit_read():
    from pd_operator.autoscale import fit

    container = {"name": "engine", "image": "vllm/vllm-openai:v0.33.0", "command": ["vllm"], "args": ["serve"] * 50,
                 "env": [{"name": "X", "value": "y"}], "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    template = {"metadata": {"labels": {"a": "b"}}, "spec": {"nodeSelector": {"gpu": "h200"}, "containers": [container],
                                                             "tolerations": [{"key": "gpu", "operator": "Exists"}],
                                                             "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
                                                             "terminationGracePeriodSeconds": 600}}
    sts = {"kind": "StatefulSet", "metadata": {"namespace": NS, "name": "p", "resourceVersion": "1"},
           "spec": {"replicas": 3, "template": template}, "status": {"readyReplicas": 2}}
    pod = {"kind": "Pod", "metadata": {"namespace": NS, "name": "p-0", "resourceVersion": "2", "managedFields": [{}]},
           "spec": {"nodeName": "n1", "containers": [container]}, "status": {"phase": "Running", "podIP": "1.2.3.4"}}
    cache = Cache()
    cache.put("StatefulSet", sts)
    cache.put("Pod", pod)
    kept, kept_pod = cache.get("StatefulSet", NS, "p"), cache.get("Pod", NS, "p-0")
    c = kept["spec"]["template"]["spec"]["containers"][0]
    assert not {"command", "args", "env"} & set(c) and c["resources"] == container["resources"]
    # the GPU fit reads the same of the cached pool as of the pool
    nodes = [{"metadata": {"name": f"n{i}", "labels": {"gpu": "h200" if i else "a100"}},
              "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
              "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}}
             for i in range(3)]
    free = {"n0": 8, "n1": 5, "n2": 8}
    for whole in (sts, kept):
        got_template, size = fit.workload_template(whole)
        assert fit.template_gpus(got_template, "nvidia.com/gpu") == 2 and size == 1
        assert fit.room(free, nodes, got_template, "nvidia.com/gpu") == 6
    assert "volumes" not in kept["spec"]["template"]["spec"]
    assert kept["spec"]["replicas"] == 3 and kept["status"] == sts["status"]
    assert "args" not in kept_pod["spec"]["containers"][0] and "managedFields" not in kept_pod["metadata"]
    assert kept_pod["spec"]["nodeName"] == "n1" and kept_pod["status"] == pod["status"]
    assert sts["spec"]["template"]["spec"]["containers"][0]["args"]  # the object given is left as it was
    # of the other children, only the metadata (hash annotation, owners, managers)
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": NS, "name": "r", "resourceVersion": "3",
                                                               "annotations": {"h": "1"}},
           "spec": {"ports": [{"port": 80}] * 20}, "status": {}}
    cache.put("Service", svc)
    assert cache.get("Service", NS, "r") == {k: svc[k] for k in ("apiVersion", "kind", "metadata")}


def test_the_echo_of_our_own_write_queues_nothing(monkeypatch):
    added = []
    monkeypatch.setattr(handlers, "reconcile_service", lambda ns, name, settle=0.0: added.append(name))
    handlers.CACHE.put(SERVICE_KIND, {"metadata": {"namespace": NS, "name": "echo"}})
    written = {"kind": "Service", "metadata": {"namespace": NS, "name": "echo-router", "resourceVersion": "7",
                                               "labels": {"pdserving.io/service": "echo"}}}
    handlers.CACHE.put("Service", written)  # the write's response
    handlers.on_child_event("Service", {"type": "MODIFIED", "object": written})
    assert added == []
    handlers.on_child_event("Service", {"type": "MODIFIED", "object": {
        **written, "metadata": {**written["metadata"], "resourceVersion": "8"}}})  # someone else's write
    handlers.on_child_event("Service", {"type": "DELETED", "object": written})
    assert added == ["echo", "echo"]
    handlers.forget_service(NS, "echo")


def test_prune_reads_the_cache_and_deletes_what_the_spec_no_longer_renders():
    api, cache = FakeApi(), Cache()
    body = minimal()
    body["metadata"] = {"namespace": NS, "name": "svc", "uid": "u1", "generation": 1}
    api.services[(NS, "svc")] = body
    kube = CachedKube(api, cache)
    watched(api, cache)
    for _ in range(2):
        reconcile(kube, kube.get_service(NS, "svc"), lambda *a: None)
        watched(api, cache)
    stray = {  # a child an earlier spec rendered
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "svc-old", "namespace": NS,
                     "labels": {"pdserving.io/service": "svc", "app.kubernetes.io/managed-by": "pd-operator"}}}
    api.objects[("ConfigMap", NS, "svc-old")] = stray
    watched(api, cache)
    api.calls.clear()
    reconcile(kube, kube.get_service(NS, "svc"), lambda *a: None)
    assert api.calls == [("delete", "ConfigMap")]
    assert ("ConfigMap", NS, "svc-old") not in api.objects and not cache.has("ConfigMap", NS, "svc-old")


def test_a_stale_watch_event_does_not_overwrite_a_newer_write_response():
    cache = Cache()
    cache.put("Deployment", {"metadata": {"namespace": NS, "name": "a", "resourceVersion": "20"}, "spec": {"replicas": 2}})
    cache.put("Deployment", {"metadata": {"namespace": NS, "name": "a", "resourceVersion": "19"}, "spec": {"replicas": 1}})
    assert cache.get("Deployment", NS, "a")["spec"] == {"replicas": 2}


def test_events_are_read_only_while_a_pool_misses_pods():
    api, cache = FakeApi(), Cache()
    kube = CachedKube(api, cache)
    sts = {"metadata": {"namespace": NS, "name": "p"}, "spec": {"replicas": 2}, "status": {"replicas": 2}}
    cache.put("StatefulSet", sts)
    assert kube.create_failures(NS, "StatefulSet", "p") == [] and api.calls == []
    cache.put("StatefulSet", {**sts, "status": {"replicas": 1}})
    kube.create_failures(NS, "StatefulSet", "p")
    assert api.calls == [("list", "Event")]
    # just created or edited (generation 3, its controller has acted on 2): not yet
    cache.put("StatefulSet", {"metadata": {**sts["metadata"], "generation": 3}, "spec": {"replicas": 3},
                              "status": {"replicas": 2, "observedGeneration": 2}})
    kube.create_failures(NS, "StatefulSet", "p")
    assert api.calls == [("list", "Event")]


# --------------------------------------------------------------------------
# the work queue
# --------------------------------------------------------------------------


def test_requests_for_one_key_coalesce_into_one_run():
    seen = []
    q = WorkQueue(seen.append, clock=Clock())
    for _ in range(5):
        q.add(("ns", "a"))
    q.add(("ns", "b"))
    while q.run_once():
        pass
    assert sorted(seen) == [("ns", "a"), ("ns", "b")]


def test_a_key_added_while_it_runs_runs_once_more_afterwards():
    seen = []
    q: WorkQueue

    def process(key):
        seen.append(key)
        if len(seen) == 1:
            q.add(key)
            q.add(key)

    q = WorkQueue(process, clock=Clock())
    q.add("a")
    while q.run_once():
        pass
    assert seen == ["a", "a"]


def test_a_delayed_add_waits_and_an_earlier_request_wins():
    clock = Clock()
    q = WorkQueue(lambda k: None, clock=clock)
    q.add("a", delay=0.5)
    assert q.run_once() is None
    q.add("a", delay=10)  # does not put it off
    clock.t += 0.5
    assert q.run_once() == "a"


def test_a_run_that_asks_to_be_looked_at_later_is_not_repeated_at_once():
    """A reconcile that queues its own key with a delay (a Secret not there yet: look
    again in 10 s) while it runs: the key runs again after the delay, not at once (it
    used to run again at once, 210 reconciles and Secret reads a second)."""
    clock = Clock()
    seen = []
    q: WorkQueue

    def process(key):
        seen.append(clock())
        q.add(key, delay=10)

    q = WorkQueue(process, clock=clock)
    q.add("a")
    assert q.run_once() == "a"
    assert q.run_once() is None and q.due_in("a") == 10
    clock.t += 10
    assert q.run_once() == "a" and seen == [1000.0, 1010.0]


def test_an_edit_during_a_failing_run_does_not_wait_out_the_backoff():
    clock = Clock()
    q: WorkQueue

    def process(key):
        if clock() == 1000.0:
            q.add(key)  # the user's fix arrives while the run that fails is in progress
            raise RuntimeError("refused")

    q = WorkQueue(process, clock=clock, backoff=(30,))
    q.add("a")
    q.run_once()
    assert q.failures("a") == 1 and q.due_in("a") == 0
    clock.t += 0.1
    assert q.run_once() == "a" and q.failures("a") == 0


def test_failures_back_off_per_key_and_a_success_resets():
    clock = Clock()
    fail = {"a": 3}

    def process(key):
        if fail.get(key, 0) > 0:
            fail[key] -= 1
            raise RuntimeError("refused")

    q = WorkQueue(process, clock=clock, backoff=(1, 2, 5))
    q.add("a")
    q.add("b")
    assert {q.run_once(), q.run_once()} == {"a", "b"}
    assert q.failures("a") == 1 and q.due_in("a") == 1 and q.due_in("b") is None
    clock.t += 1
    assert q.run_once() == "a" and q.due_in("a") == 2
    clock.t += 2
    assert q.run_once() == "a" and q.due_in("a") == 5
    clock.t += 5
    assert q.run_once() == "a" and q.failures("a") == 0 and q.due_in("a") is None


def test_forget_drops_a_deleted_services_key_and_its_backoff():
    clock = Clock()
    q = WorkQueue(lambda k: (_ for _ in ()).throw(RuntimeError()), clock=clock)
    q.add("gone")
    q.run_once()
    assert q.state_size() == 1
    q.forget("gone")
    clock.t += 100
    assert q.run_once() is None and q.state_size() == 0


def test_a_standby_queue_takes_nothing_until_it_leads():
    active = threading.Event()
    seen = []
    q = WorkQueue(seen.append, clock=Clock(), active=active)
    q.add("a")
    assert q.run_once() is None
    active.set()
    assert q.run_once() == "a" and seen == ["a"]


def test_a_status_only_change_of_a_service_queues_nothing_but_a_spec_edit_does(monkeypatch):
    q = WorkQueue(lambda k: None, clock=Clock())
    monkeypatch.setattr(handlers, "QUEUE", q)
    body = minimal()
    body["metadata"] = {"namespace": "qns", "name": "s", "uid": "u", "generation": 1}
    handlers.on_service_event({"type": "ADDED", "object": copy.deepcopy(body)})
    assert q.run_once() == ("qns", "s")
    handlers.on_service_event({"type": "MODIFIED", "object": {**copy.deepcopy(body), "status": {"x": 1}}})
    assert q.run_once() is None
    body["metadata"]["generation"] = 2
    handlers.on_service_event({"type": "MODIFIED", "object": copy.deepcopy(body)})
    assert q.run_once() == ("qns", "s")
    handlers.on_service_event({"type": "DELETED", "object": copy.deepcopy(body)})
    assert handlers.CACHE.get(SERVICE_KIND, "qns", "s") is None


# --------------------------------------------------------------------------
# the Lease
# --------------------------------------------------------------------------


class LeaseApi:
    """One Lease object with resourceVersion checks, as the API server keeps it."""

    def __init__(self):
        self.lease: dict | None = None
        self.rv = 0
        self.down: set[str] = set()
        self.calls: list[tuple[str, str]] = []  # (who, method)

    def client(self, who: str):
        api = self

        class Client:
            def _call(self, method, path, body=None, **kw):
                if who in api.down:
                    raise ConnectionError("unreachable")
                api.calls.append((who, method))
                if method == "GET":
                    if api.lease is None:
                        raise ApiException(status=404, reason="Not Found")
                    return copy.deepcopy(api.lease)
                if method == "POST":
                    if api.lease is not None:
                        raise ApiException(status=409, reason="Conflict")
                    new = copy.deepcopy(body)
                else:  # a merge patch; its resourceVersion is a precondition
                    assert method == "PATCH" and kw.get("content_type") == "application/merge-patch+json"
                    if body["metadata"].get("resourceVersion") != str(api.rv):
                        raise ApiException(status=409, reason="Conflict", body=json.dumps({"reason": "Conflict"}))
                    new = copy.deepcopy(api.lease)
                    new["spec"].update(body["spec"])
                api.rv += 1
                new["metadata"]["resourceVersion"] = str(api.rv)
                api.lease = new
                return copy.deepcopy(api.lease)

        return Client()


def test_one_replica_leads_and_the_standby_takes_over_when_it_stops_renewing():
    store, clock = LeaseApi(), Clock()
    a = LeaderElector(store.client("a"), NS, identity="a", duration=15, renew=5, clock=clock)
    b = LeaderElector(store.client("b"), NS, identity="b", duration=15, renew=5, clock=clock)
    assert a.try_once() is True
    assert b.try_once() is False
    for _ in range(5):  # a renews; b keeps seeing a live lease
        clock.t += 5
        assert a.try_once() and not b.try_once()
    store.down.add("a")  # kill -9 of a: no more renewals
    clock.t += 5
    assert not b.try_once()
    clock.t += 5
    assert not b.try_once()  # 10 s after it last saw a change: not yet
    clock.t += 5
    assert b.try_once() is True and store.lease["spec"]["holderIdentity"] == "b"
    assert store.lease["spec"]["leaseTransitions"] == 1
    # a, cut off, steps down by itself before b could have taken over
    assert a.leading.is_set() is False or a._failed(clock(), ConnectionError()) is False


def test_the_holder_renews_with_one_request_and_steps_down_when_its_lease_was_taken():
    store, clock = LeaseApi(), Clock()
    a = LeaderElector(store.client("a"), NS, identity="a", duration=15, renew=5, clock=clock)
    b = LeaderElector(store.client("b"), NS, identity="b", duration=15, renew=5, clock=clock)
    assert a.try_once()
    store.calls.clear()
    for _ in range(10):
        clock.t += 5
        assert a.try_once()
    assert store.calls == [("a", "PATCH")] * 10  # a conditional patch per renewal, no read
    store.down.add("a")  # a cut off: b takes over once the record stood still for 15 s
    for _ in range(4):
        clock.t += 5
        b.try_once()
    assert store.lease["spec"]["holderIdentity"] == "b"
    store.down.discard("a")
    clock.t += 1
    assert a.try_once() is False and not a.leading.is_set()  # its patch: 409; its read: b's live lease
    assert store.lease["spec"]["holderIdentity"] == "b"


def test_a_released_lease_is_taken_at_the_next_check():
    store, clock = LeaseApi(), Clock()
    a = LeaderElector(store.client("a"), NS, identity="a", clock=clock)
    b = LeaderElector(store.client("b"), NS, identity="b", clock=clock)
    a.try_once()
    b.try_once()
    a.release()
    assert not a.leading.is_set()
    assert b.try_once() is True


def test_a_takeover_from_a_stale_read_loses_to_the_one_that_wrote_first():
    store, clock = LeaseApi(), Clock()
    a = LeaderElector(store.client("a"), NS, identity="a", clock=clock)
    a.try_once()
    b = LeaderElector(store.client("b"), NS, identity="b", clock=clock)
    c = LeaderElector(store.client("c"), NS, identity="c", clock=clock)
    b.try_once(), c.try_once()
    store.down.add("a")
    clock.t += 20
    before = copy.deepcopy(store.lease)  # what c reads, just before b writes
    assert b.try_once() is True
    real = store.client("c")

    class StaleRead:
        def _call(self, method, path, body=None, **kw):
            return copy.deepcopy(before) if method == "GET" else real._call(method, path, body=body, **kw)

    c.kube = StaleRead()
    assert c.try_once() is False  # its PUT carries the old resourceVersion: 409
    assert store.lease["spec"]["holderIdentity"] == "b"


def test_a_standby_with_queued_keys_sleeps_instead_of_spinning():
    """Seen on the cluster: a standby's workers spun on due keys they may not
    take (1.3 cores for 4 workers), starving its watch loop."""
    import time

    active = threading.Event()
    q = WorkQueue(lambda k: None, active=active)
    for i in range(20):
        q.add(i)
    threads = q.start(4)

    def workers_cpu() -> float:  # the workers' own CPU time, not the rest of a long pytest process's
        return sum(time.clock_gettime(time.pthread_getcpuclockid(t.ident)) for t in threads)

    try:
        t0 = workers_cpu()
        time.sleep(1.0)
        assert workers_cpu() - t0 < 0.2
        active.set()
        q.wake()
        deadline = time.monotonic() + 5
        while q.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert q.pending() == 0
    finally:
        q.stop()


def test_the_cache_selects_a_services_objects_by_index_and_keeps_the_index_true():
    cache = Cache()

    def pod(name: str, service: str | None, rv: str, **labels) -> dict:
        lab = {**({"pdserving.io/service": service} if service else {}), **labels}
        return {"kind": "Pod", "metadata": {"namespace": NS, "name": name, "resourceVersion": rv, "labels": lab}}

    for i in range(50):
        cache.put("Pod", pod(f"a-{i}", "a" if i % 2 else "b", "1", **{"pdserving.io/role": "decode" if i % 5 else "prefill"}))
    cache.put("Pod", {"kind": "Pod", "metadata": {"namespace": "elsewhere", "name": "x", "resourceVersion": "1",
                                                  "labels": {"pdserving.io/service": "a"}}})
    names = lambda objs: sorted(o["metadata"]["name"] for o in objs)  # noqa: E731
    assert names(cache.select("Pod", NS, {"pdserving.io/service": "a"})) == sorted(f"a-{i}" for i in range(1, 50, 2))
    assert names(cache.select("Pod", NS, {"pdserving.io/service": "a", "pdserving.io/role": "prefill"})) == \
        sorted(f"a-{i}" for i in range(1, 50, 2) if i % 5 == 0)
    # a relabelled object moves; a removed one goes; an older event changes nothing
    cache.put("Pod", pod("a-1", "b", "2"))
    cache.put("Pod", pod("a-3", "a", "0"))
    cache.remove("Pod", NS, "a-5")
    got = names(cache.select("Pod", NS, {"pdserving.io/service": "a"}))
    assert "a-1" not in got and "a-5" not in got and "a-3" in got
    assert "a-1" in names(cache.select("Pod", NS, {"pdserving.io/service": "b"}))
    # the same answers as a scan of everything
    scan = [o for o in cache.select("Pod", None, {}) if o["metadata"]["namespace"] == NS
            and o["metadata"]["labels"].get("pdserving.io/service") == "b"]
    assert names(scan) == names(cache.select("Pod", NS, {"pdserving.io/service": "b"}))
    cache.forget_service(NS, "b")
    assert cache.select("Pod", NS, {"pdserving.io/service": "b"}) == []
    assert not [o for o in cache.select("Pod", None, {}) if o["metadata"]["labels"].get("pdserving.io/service") == "b"]
    assert names(cache.select("Pod", "elsewhere", {"pdserving.io/service": "a"})) == ["x"]


def test_a_holder_whose_renewal_hangs_stops_writing_before_the_standby_may_take_over():
    """A renews at t0; its next renewal hangs on a slow API server. A may write only until
    t0 + 10 (renew deadline: duration - renew), before B, which saw the record change at t0,
    may take over (t0 + 15). Lease calls are bounded by that deadline, so the hung renewal
    fails and A steps down, judged on the clock after the call (it used to compare the
    reading taken before the call, and kept leading for the 60 s its call could hang)."""
    store, clock = LeaseApi(), Clock()
    a = LeaderElector(store.client("a"), NS, identity="a", duration=15, renew=5, clock=clock)
    b = LeaderElector(store.client("b"), NS, identity="b", duration=15, renew=5, clock=clock)
    assert a.try_once() and not b.try_once()
    clock.t += 5
    t0 = clock.t
    assert a.try_once() and not b.try_once()
    clock.t = t0 + 9.9
    assert a.holds()
    clock.t = t0 + 10
    assert not a.holds() and a.leading.is_set()  # the lease thread has not noticed yet; writes stop anyway
    timeouts = []

    class Hanging:
        def _call(self, method, path, **kw):
            timeouts.append(kw.get("timeout"))
            clock.t += kw["timeout"]  # runs into its timeout
            raise ApiException(status=504, reason="Gateway Timeout")

    a.kube = Hanging()
    assert a.try_once() is False and not a.leading.is_set()
    assert timeouts == [10.0] and clock.t == t0 + 20
    assert b.try_once() is True  # B takes over only now, when A has long stopped writing


def test_writes_are_refused_while_this_replica_may_not_write():
    from pd_operator.controller.cache import NotLeading

    api, cache, _ = one_service()
    allowed = [True]
    kube = CachedKube(api, cache, may_write=lambda: allowed[0])
    reconcile(kube, kube.get_service(NS, "svc"), lambda *a: None)
    sts = next(o for (k, _, _), o in api.objects.items() if k == "StatefulSet")
    kube.apply_replicas("StatefulSet", NS, sts["metadata"]["name"], 3)
    allowed[0] = False
    writes = [lambda: kube.apply(copy.deepcopy(sts)),
              lambda: kube.apply_replicas("StatefulSet", NS, sts["metadata"]["name"], 4),
              lambda: kube.patch_status(NS, "svc", {"conditions": []}),
              lambda: kube.delete("StatefulSet", NS, sts["metadata"]["name"]),
              lambda: kube.post_event(api.services[(NS, "svc")], "Normal", "Test", "x")]
    for write in writes:
        try:
            write()
        except NotLeading:
            continue
        raise AssertionError("a write went through while this replica may not write")
    assert kube.apply(copy.deepcopy(sts), dry_run=True) is not None  # a dry run writes nothing
    assert api.objects[("StatefulSet", NS, sts["metadata"]["name"])]["spec"]["replicas"] == 3


def test_the_resync_sweeps_out_what_was_deleted_while_a_watch_was_down(monkeypatch):
    """kopf restarts a watch on 410 Gone with a fresh list and sends no DELETED for what went
    in the gap: the resync's metadata-only LIST per kind drops those from the cache (a deleted
    NetworkPolicy looked present and was never restored; a deleted service kept being
    reconciled). What is listed stays, and so does a newer copy (another uid) that a watch
    brought while the list ran."""
    cache = Cache()
    monkeypatch.setattr(handlers, "CACHE", cache)
    monkeypatch.setattr(handlers, "reconcile_service", lambda *a, **k: None)

    def obj(kind, name, uid, service="svc"):
        return {"kind": kind, "metadata": {"namespace": NS, "name": name, "uid": uid,
                                           "labels": {"pdserving.io/service": service}}}

    for kind, name, uid, service in [(SERVICE_KIND, "svc", "s1", None), (SERVICE_KIND, "gone", "s2", None),
                                     ("NetworkPolicy", "svc-engines", "n1", "svc"),
                                     ("NetworkPolicy", "svc-router", "n2", "svc"),
                                     ("Pod", "svc-decode-0", "p1", "svc")]:
        cache.put(kind, obj(kind, name, uid, service) if service else obj(kind, name, uid, name))
    lists = []

    class Lister:
        def list_names(self, api_version, plural, namespace, selector=""):
            lists.append((plural, selector))
            if plural == "networkpolicies":
                # meanwhile a watch brings a new copy of svc-router (recreated: another uid)
                cache.put("NetworkPolicy", obj("NetworkPolicy", "svc-router", "n3"))
                return set()
            if plural == "leaderworkersets":
                return None
            return {(NS, "svc", "s1"), (NS, "svc-decode-0", "p1")}

    monkeypatch.setitem(handlers.STATE, "kube", Lister())
    assert handlers.sweep(None) == 2
    assert cache.get(SERVICE_KIND, NS, "gone") is None and cache.get(SERVICE_KIND, NS, "svc") is not None
    assert cache.get("NetworkPolicy", NS, "svc-engines") is None
    assert cache.get("NetworkPolicy", NS, "svc-router")["metadata"]["uid"] == "n3"
    assert cache.get("Pod", NS, "svc-decode-0") is not None
    # only the kinds with something cached are listed, children by the operator's labels
    assert sorted(p for p, _ in lists) == ["networkpolicies", "pdinferenceservices", "pods"]
    assert dict(lists)["networkpolicies"] == "app.kubernetes.io/managed-by=pd-operator,pdserving.io/service"


def test_a_service_deleted_while_it_is_reconciled_leaves_nothing_behind(monkeypatch):
    """The DELETED event arrives while the reconcile runs: forget_service clears the service's
    entries, then the reconcile in flight put its owned fields back; the queue's work
    function forgets the service again once the run ends."""
    from pd_operator.controller.reconcile import OWNED

    cache = Cache()
    monkeypatch.setattr(handlers, "CACHE", cache)
    api = FakeApi()
    b = minimal(engine={"kind": "vllm"})
    b["metadata"] = {"namespace": NS, "name": "brief", "uid": "u-brief", "generation": 1}
    api.services[(NS, "brief")] = b
    cache.put(SERVICE_KIND, copy.deepcopy(b))
    kube = CachedKube(api, cache)
    monkeypatch.setitem(handlers.STATE, "kube", kube)
    before = len(OWNED)

    def deleted_midway(kube_, body, event):
        handlers.on_service_event({"type": "DELETED", "object": copy.deepcopy(b)})
        return reconcile(kube_, body, event)

    monkeypatch.setattr(handlers, "reconcile", deleted_midway)
    handlers.process((NS, "brief"))
    assert len(OWNED) == before and OWNED.get(NS, "brief", "StatefulSet", "brief-decode") is None


def test_a_released_lease_is_not_taken_again_by_a_later_round():
    """A clean shutdown releases the Lease once its writes are done; a round of the lease
    loop after that (its thread still running) must not take the free Lease back."""
    store, clock = LeaseApi(), Clock()
    a = LeaderElector(store.client("a"), NS, identity="a", clock=clock)
    assert a.try_once()
    a.release()
    assert store.lease["spec"]["holderIdentity"] == ""
    clock.t += 5
    assert a.try_once() is False and store.lease["spec"]["holderIdentity"] == ""


def test_a_standby_counts_the_lease_duration_from_when_its_read_returned():
    """A read that took 5 s may show a renewal made just before it returned: the standby's
    15 s count starts when the read returned, not when it was sent."""
    store, clock = LeaseApi(), Clock()
    a = LeaderElector(store.client("a"), NS, identity="a", duration=15, renew=5, clock=clock)
    assert a.try_once()
    slow = store.client("b")

    renewals = [1]

    class SlowRead:
        def _call(self, method, path, **kw):
            if method == "GET" and renewals:
                renewals.pop()
                clock.t += 5
                a.try_once()  # A renews while B's (first) read is on its way
            return slow._call(method, path, **kw)

    b = LeaderElector(SlowRead(), NS, identity="b", duration=15, renew=5, clock=clock)
    assert not b.try_once()
    seen = clock.t
    store.down.add("a")
    clock.t = seen + 14.9  # 19.9 s after the read was sent, but A's renewal may be 14.9 s old
    assert not b.try_once()
    clock.t = seen + 15.1
    assert b.try_once() is True


def test_the_cache_keeps_what_the_gpu_fit_reads_of_init_containers():
    """A sidecar's GPUs add to the containers' (fit.template_gpus): the cached template
    keeps the init containers' restartPolicy and the pod's overhead."""
    from pd_operator.autoscale import fit

    cache = Cache()
    sts = {"kind": "StatefulSet", "metadata": {"namespace": NS, "name": "s"},
           "spec": {"template": {"spec": {
               "containers": [{"name": "engine", "image": "x", "command": ["serve"],
                               "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
               "initContainers": [{"name": "side", "image": "y", "restartPolicy": "Always",
                                   "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
               "overhead": {"nvidia.com/gpu": "1"}}}}}
    cache.put("StatefulSet", sts)
    tmpl, _ = fit.workload_template(cache.get("StatefulSet", NS, "s"))
    assert fit.template_gpus(tmpl, "nvidia.com/gpu") == 7
    assert "command" not in tmpl["spec"]["containers"][0]  # still slim
