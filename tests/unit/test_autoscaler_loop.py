"""The operator's autoscaler loop (controller/autoscaler.py) with a fake cluster:
per-service intervals, the Prometheus bearer token from its Secret, and what
status says when the token cannot be read. The loop on the real API server is
tests/integration/test_autoscaler.py and test_autoscale_closed_loop.py."""

from __future__ import annotations

import base64

import pytest

from pd_operator.autoscale.promql import Observation
from pd_operator.controller.autoscaler import Autoscaler, Prometheus


class FakeKube:
    def __init__(self, secrets: dict | None = None, forbidden: bool = False, gpu_view=None):
        self.secrets, self.forbidden, self.gpu_view = secrets or {}, forbidden, gpu_view
        self.replicas: dict[str, int] = {"svc-prefill": 1, "svc-decode": 1}
        self.status: dict = {}
        self.services: dict = {}

    def get(self, kind, namespace, name):
        n = self.replicas.get(name)
        template = {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        return None if n is None else {"spec": {"replicas": n, "template": template},
                                       "status": {"replicas": n, "readyReplicas": n}}

    def cluster_gpu_view(self):
        return self.gpu_view

    def get_service(self, namespace, name):
        """The service as the cache holds it now: the one the tests' body() makes, unless a
        test edited (or deleted: None) it."""
        return self.services.get((namespace, name), {"metadata": {"namespace": namespace, "name": name,
                                                                  "generation": 1}})

    def pods(self, namespace, selector):
        return []

    def apply_replicas(self, kind, namespace, name, replicas):
        self.replicas[name] = replicas

    def patch_status(self, namespace, name, patch, manager=None):
        self.status = patch

    def secret_value(self, namespace, name, key):
        if self.forbidden:
            raise PermissionError("forbidden")
        try:
            return base64.b64decode(self.secrets[name][key]).decode()
        except KeyError:
            raise LookupError(f"Secret {namespace}/{name} not found") from None


PROM_URL = "http://prometheus.monitoring:9090"


def body(interval: str = "30s", token_ref: dict | None = None, url: str = PROM_URL) -> dict:
    prom = {"url": url}
    if token_ref:
        prom["bearerTokenSecretRef"] = token_ref
    auto = {"enabled": True, "minReplicas": 1, "maxReplicas": 4}
    return {
        "apiVersion": "pdserving.io/v1alpha1", "kind": "PDInferenceService",
        "metadata": {"name": "svc", "namespace": "ns", "generation": 1},
        "spec": {"model": {"name": "Qwen/Qwen3-8B"}, "engine": {"kind": "vllm"}, "router": {"image": "registry.example.com/pd/router:test"},
                 "prefill": {"replicas": 1, "autoscaling": dict(auto)}, "decode": {"replicas": 1, "autoscaling": dict(auto)},
                 "autoscaling": {"prometheus": prom, "interval": interval}},
    }


class Signals:
    def __init__(self, ttft: float = 3.0, itl: float = 0.02):
        self.calls: list[tuple] = []
        self.values = {"prefill": ttft, "decode": itl}

    def __call__(self, prom, engine, role, quantile, secondaries=frozenset()):
        self.calls.append((prom, engine, role, quantile))
        return {("ns", "svc"): Observation(self.values[role], None)}


def conditions(kube: FakeKube) -> dict[str, dict]:
    return {c["type"]: c for c in kube.status["conditions"]}


def test_each_service_is_decided_at_its_own_interval():
    kube, signals, now = FakeKube(), Signals(), [1000.0]
    scaler = Autoscaler(kube, signals, lambda *a: None, clock=lambda: now[0])
    fast, slow = body("5s"), body("60s")
    slow["metadata"] = {**slow["metadata"], "name": "slow"}
    kube.replicas.update({"slow-prefill": 1, "slow-decode": 1})
    rounds = {"svc": 0, "slow": 0}
    for _ in range(12):  # a minute of 5-s ticks
        before = len(signals.calls)
        scaler.run_once([fast, slow])
        if len(signals.calls) > before:
            for key in ("svc", "slow"):
                if scaler.last_round.get(("ns", key)) == now[0]:
                    rounds[key] += 1
        now[0] += 5
    assert rounds == {"svc": 12, "slow": 1}
    # both services share one query per (prometheus, engine, role, quantile) when due together
    signals.calls.clear()
    scaler.run_once([fast, slow], force=True)
    assert len(signals.calls) == 2


def test_bearer_token_is_read_from_the_secret_and_used():
    token = "s3cr3t-token"
    kube = FakeKube({"prom-auth": {"token": base64.b64encode(f"{token}\n".encode()).decode()}})
    signals = Signals()
    scaler = Autoscaler(kube, signals, lambda *a: None, clock=lambda: 1000.0, token_urls=[PROM_URL])
    scaler.run_once([body(token_ref={"name": "prom-auth", "key": "token"})])
    prom = signals.calls[0][0]
    assert prom == Prometheus("http://prometheus.monitoring:9090", token)
    assert token not in repr(prom) and token not in str(prom)  # never in logs
    assert kube.replicas["svc-prefill"] == 3  # TTFT 3 s against 1 s: decided on the authenticated answer
    assert conditions(kube)["MetricsAvailable"]["status"] == "True"


@pytest.mark.parametrize("forbidden, secrets, expect", [
    (True, {}, "rbac.secretReads=true"),
    (False, {}, "Secret ns/prom-auth not found"),
])
def test_unreadable_token_holds_and_names_the_field_and_the_fix(forbidden, secrets, expect):
    kube, signals = FakeKube(secrets, forbidden=forbidden), Signals()
    scaler = Autoscaler(kube, signals, lambda *a: None, clock=lambda: 1000.0, token_urls=[PROM_URL])
    scaler.run_once([body(token_ref={"name": "prom-auth", "key": "token"})])
    assert signals.calls == []  # no unauthenticated query either
    assert kube.replicas == {"svc-prefill": 1, "svc-decode": 1}
    conds = conditions(kube)
    for type_ in ("AutoscalingActive", "MetricsAvailable"):
        assert conds[type_]["status"] == "False" and conds[type_]["reason"] == "PrometheusAuth"
        assert "spec.autoscaling.prometheus.bearerTokenSecretRef" in conds[type_]["message"]
        assert expect in conds[type_]["message"]


def test_secondary_signals_are_queried_only_when_asked_for_and_drive_the_decision():
    kube, now = FakeKube(), [1000.0]
    seen: list[frozenset] = []

    def signals(prom, engine, role, quantile, secondaries=frozenset()):
        seen.append((role, frozenset(secondaries)))
        # latency in band; the decode queue is 3x its per-replica target
        latency = {"prefill": 1.0, "decode": 0.05}[role]
        return {("ns", "svc"): Observation(latency, None, queue=12.0 if role == "decode" else None)}

    scaler = Autoscaler(kube, signals, lambda *a: None, clock=lambda: now[0])
    plain = body()
    scaler.run_once([plain])
    assert sorted(seen) == [("decode", frozenset()), ("prefill", frozenset())]
    assert kube.replicas == {"svc-prefill": 1, "svc-decode": 1}

    seen.clear()
    queued = body()
    queued["spec"]["decode"]["autoscaling"]["secondaryTargets"] = [{"metric": "queueDepth", "averageValue": 4}]
    now[0] += 30
    scaler.run_once([queued])
    assert ("decode", frozenset({"queueDepth"})) in seen and ("prefill", frozenset()) in seen
    assert kube.replicas["svc-decode"] == 3 and kube.replicas["svc-prefill"] == 1
    assert "queueDepth" in kube.status["decode"]["lastScaleReason"]


def test_scale_up_stops_at_the_free_gpus_and_books_them_for_the_next_pool():
    node = {"metadata": {"name": "n1", "labels": {}}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}}
    used = {"spec": {"nodeName": "n1", "containers": [{"resources": {"requests": {"nvidia.com/gpu": "6"}}}]},
            "status": {"phase": "Running"}}
    kube = FakeKube(gpu_view=([node], [used]))  # 2 GPUs free
    # TTFT 3x and ITL 3x their targets: each pool alone would take 3 replicas
    scaler = Autoscaler(kube, Signals(ttft=3.0, itl=0.15), lambda *a: None, clock=lambda: 1000.0)
    kube.status = {}
    scaler.run_once([body()])
    # exactly the 2 free GPUs are granted, the pool under more pressure first (decode, 3x vs 3x: a tie -> both
    # would take 2, so one gets 1 extra); the other is told why
    assert kube.replicas["svc-prefill"] + kube.replicas["svc-decode"] == 2 + 2
    assert "the free GPUs fit" in conditions(kube)["AutoscalingActive"]["message"]


@pytest.mark.parametrize("url, allowed", [
    ("http://attacker.example:9090", []),                                    # nothing allowed: never sent
    ("http://attacker.example:9090", [PROM_URL]),                             # another host
    ("https://prometheus.monitoring:9090", [PROM_URL]),                       # another scheme
    ("http://prometheus.monitoring:9091", [PROM_URL]),                        # another port
    ("http://prometheus.monitoring:9090@attacker.example", [PROM_URL]),       # user info: the host is attacker
    ("http://prometheus.monitoring:9090/other", [PROM_URL + "/thanos"]),      # outside the allowed path
])
def test_a_token_never_reaches_a_url_the_administrator_did_not_allow(url, allowed):
    kube = FakeKube({"prom-auth": {"token": base64.b64encode(b"tenant-secret").decode()}})
    read: list = []
    secret_value = kube.secret_value
    kube.secret_value = lambda *a: read.append(a) or secret_value(*a)
    signals = Signals()
    scaler = Autoscaler(kube, signals, lambda *a: None, clock=lambda: 1000.0, token_urls=allowed)
    scaler.run_once([body(token_ref={"name": "prom-auth", "key": "token"}, url=url)])
    assert signals.calls == [] and read == []  # the Secret is not even read
    cond = conditions(kube)["AutoscalingActive"]
    assert cond["reason"] == "PrometheusAuth" and "spec.autoscaling.prometheus.url" in cond["message"]
    assert "autoscaling.prometheusTokenURLs" in cond["message"]


def test_an_allowed_endpoint_with_a_path_prefix_receives_the_token():
    kube = FakeKube({"prom-auth": {"token": base64.b64encode(b"tok").decode()}})
    signals = Signals()
    scaler = Autoscaler(kube, signals, lambda *a: None, clock=lambda: 1000.0,
                        token_urls=["HTTP://Prometheus.Monitoring:9090/thanos/"])
    scaler.run_once([body(token_ref={"name": "prom-auth", "key": "token"}, url=PROM_URL + "/thanos/q")])
    assert {c[0].token for c in signals.calls} == {"tok"}


def test_the_autoscalers_memory_survives_a_failover_in_status():
    """Issue 15: the replica taking over reads the stabilization history from
    status, so it does not scale down inside the window the previous leader
    was honouring (a fresh memory would)."""
    import copy

    kube = FakeKube()
    b = body()
    b["spec"]["decode"]["autoscaling"]["behavior"] = {"scaleDown": {"stabilizationWindowSeconds": 300}}
    clock = [1000.0]
    first = Autoscaler(kube, Signals(ttft=3.0, itl=0.2), lambda *a: None, clock=lambda: clock[0])
    first.run_once([b], force=True)  # high ITL: decode scales up
    up = kube.replicas["svc-decode"]
    assert up > 1
    memory = kube.status["decode"]["autoscaler"]
    assert memory["recommendations"] and memory["recommendations"][-1][1] == up
    # the leader dies; status holds what it wrote
    b_after = copy.deepcopy(b)
    b_after["status"] = copy.deepcopy(kube.status)
    clock[0] += 60  # load gone, well inside the 300 s scale-down window
    calm = Signals(ttft=0.01, itl=0.001)
    second = Autoscaler(kube, calm, lambda *a: None, clock=lambda: clock[0])
    second.run_once([b_after], force=True)
    assert kube.replicas["svc-decode"] == up  # held by the remembered recommendation
    # without the memory, the window starts afresh: HPA seeds it with the current size when it
    # first sees a target (horizontal.go:802-808), so the amnesiac holds now, but until 300 s
    # after its own first round, where the remembered window ends 300 s after the scale-up
    kube2 = FakeKube()
    kube2.replicas["svc-decode"] = up
    amnesiac = Autoscaler(kube2, calm, lambda *a: None, clock=lambda: clock[0])
    amnesiac.run_once([b], force=True)
    assert kube2.replicas["svc-decode"] == up
    clock[0] = 1000.0 + 301
    b_later = copy.deepcopy(b)
    b_later["status"] = copy.deepcopy(kube.status)
    second.run_once([b_later], force=True)
    assert kube.replicas["svc-decode"] < up
    amnesiac.run_once([b], force=True)
    assert kube2.replicas["svc-decode"] == up


def test_what_the_law_learned_survives_a_failover_in_status():
    """The capacity correction (3b), the engines' measured step time (3b'), the pods' start
    time and the demand of the trend window (3d) go through status, and the status the
    autoscaler writes is what the CRD's schema accepts."""
    from pd_operator.api.models import AutoscalerMemory
    from pd_operator.autoscale.decide import Change, History, Overload
    from pd_operator.controller.autoscaler import histories_from_status, history_to_status

    learned = History(changes=[Change(1000.0, 2, 4)], capacity_factor=0.83, step_ratio=0.812, basis="0123abcd",
                      start_seconds=118.0, demands=[(1000.0 + 30 * i, 40_000.0 + 5_000 * i) for i in range(7)],
                      saturated_since=1150.0, futile=1.85, overloads=[Overload(900.0, 2, 24_000.0, 2.2)])
    memory = history_to_status(learned)
    AutoscalerMemory.model_validate(memory)  # the CRD's status schema (generated from this model)
    back = histories_from_status({"decode": {"autoscaler": memory}})["decode"]
    assert (back.capacity_factor, back.step_ratio, back.start_seconds, back.basis) == (0.83, 0.812, 118.0, "0123abcd")
    # the saturation's start (3b) and the futility latch (2b): a new leader neither waits another
    # rate window to correct the capacity nor grows a pool whose latency replicas did not lower
    assert (back.saturated_since, back.futile) == (1150.0, 1.85)
    # the sizes seen too small (2d): a new leader does not scale back into one
    assert back.overloads == learned.overloads
    # a clock stepped back must not write what the schema refuses (startSeconds >= 0)
    AutoscalerMemory.model_validate(history_to_status(History(start_seconds=-3.0)))
    assert back.demands == learned.demands and back.demand_slope() == pytest.approx(learned.demand_slope())
    # nothing learned: nothing written (a pruned field is dropped by server-side apply), read back as fresh
    fresh = history_to_status(History())
    assert not {"capacityFactor", "stepRatio", "startSeconds", "saturatedSince", "futile", "overloads"} & set(fresh)
    again = histories_from_status({"decode": {"autoscaler": fresh}})["decode"]
    assert (again.capacity_factor, again.step_ratio, again.start_seconds) == (1.0, None, None)
    assert (again.saturated_since, again.futile) == (None, None)
    # a hand-edited record the schema accepts but no pool could show (size 0 or 1.7, a load
    # or latency not above 0) is dropped, not held on
    edited = {"overloads": [[900.0, 0, 1000.0, 2.0], [900.0, 1.7, 1000.0, 2.0], [900.0, 1, -5.0, 2.0],
                            [900.0, 2, 1000.0, 0.0], [900.0, 3, 1000.0, 2.0]]}
    assert [x.ready for x in histories_from_status({"decode": {"autoscaler": edited}})["decode"].overloads] == [3]
    # unreadable memory: a fresh history, not a crash
    assert histories_from_status({"decode": {"autoscaler": {"stepRatio": "fast"}}})["decode"].step_ratio is None


def test_a_failover_keeps_the_measured_engine_speed():
    import copy

    from pd_operator.api import validate_service
    from pd_operator.autoscale.decide import History, Overload
    from pd_operator.autoscale.plan import learning_basis

    kube = FakeKube()
    b = body()
    first = Autoscaler(kube, Signals(), lambda *a: None, clock=lambda: 1000.0)
    basis = learning_basis(validate_service(b), "decode")
    first.histories[("ns", "svc")] = {"decode": History(step_ratio=0.8, basis=basis,
                                                        overloads=[Overload(900.0, 1, 6_000.0, 0.08)])}
    first.run_once([b], force=True)
    assert kube.status["decode"]["autoscaler"]["stepRatio"] == 0.8
    b_after = copy.deepcopy(b)
    b_after["status"] = copy.deepcopy(kube.status)
    second = Autoscaler(kube, Signals(), lambda *a: None, clock=lambda: 1030.0)
    second.run_once([b_after], force=True)
    assert second.histories[("ns", "svc")]["decode"].step_ratio == 0.8
    assert [x.ready for x in second.histories[("ns", "svc")]["decode"].overloads] == [1]
    # a new engine image while the standby takes over: what was learned on the old one is forgotten
    b_new = copy.deepcopy(b_after)
    b_new["spec"]["engine"]["image"] = "registry.example.com/vllm/vllm-openai:v0.34.0"
    third = Autoscaler(kube, Signals(), lambda *a: None, clock=lambda: 1060.0)
    third.run_once([b_new], force=True)
    assert third.histories[("ns", "svc")]["decode"].step_ratio is None
    assert third.histories[("ns", "svc")]["decode"].overloads == []
    assert not {"stepRatio", "overloads"} & set(kube.status["decode"]["autoscaler"])


def test_a_reason_longer_than_the_status_field_is_cut_not_refused(monkeypatch):
    # the CRD caps status.<pool>.lastScaleReason (1024): a longer one would have the API server
    # refuse the whole status patch, replicas and conditions with it
    import pd_operator.controller.autoscaler as loop
    from pd_operator.api.models import SCALE_REASON_MAX
    from pd_operator.autoscale.decide import Decision

    long_reason = "1 -> 2: " + "x" * 3000
    monkeypatch.setattr(loop, "plan_service",
                        lambda svc, inputs, histories, now, room=None: {"prefill": Decision(2, long_reason, True, 2)})
    kube = FakeKube()
    Autoscaler(kube, Signals(), lambda *a: None, clock=lambda: 1000.0).run_once([body()])
    assert kube.replicas["svc-prefill"] == 2
    why = kube.status["prefill"]["lastScaleReason"]
    assert len(why) == SCALE_REASON_MAX and why.startswith("1 -> 2: xxx") and why.endswith("...")


def test_a_replica_that_leads_again_starts_from_status_not_from_its_old_memory():
    """A leads while calm, B takes over and scales decode up (status records it), A leads
    again inside the scale-down window: with its old in-memory history A scaled down at
    once and overwrote B's record; after reset() (handlers call it when leading starts) it
    reads status and holds."""
    import copy

    kube = FakeKube()
    b = body()
    b["spec"]["decode"]["autoscaling"]["behavior"] = {"scaleDown": {"stabilizationWindowSeconds": 300}}
    clock = [1000.0]
    calm = Signals(ttft=0.01, itl=0.001)
    a = Autoscaler(kube, calm, lambda *a_: None, clock=lambda: clock[0])
    a.run_once([b], force=True)  # A's term: calm, decode at 1
    clock[0] += 30
    other = Autoscaler(kube, Signals(ttft=3.0, itl=0.2), lambda *a_: None, clock=lambda: clock[0])
    other.run_once([copy.deepcopy(b) | {"status": copy.deepcopy(kube.status)}], force=True)  # B's term
    up = kube.replicas["svc-decode"]
    assert up > 1
    b_now = copy.deepcopy(b) | {"status": copy.deepcopy(kube.status)}
    clock[0] += 60  # A leads again, load gone, inside B's 300 s window
    a.reset()
    a.run_once([b_now], force=True)
    assert kube.replicas["svc-decode"] == up
    assert kube.status["decode"]["autoscaler"]["recommendations"][-2][1] == up  # B's record kept
    # and B's last scale, which A's status apply would otherwise drop (it omitted the fields)
    assert kube.status["decode"]["lastScaleTime"] == b_now["status"]["decode"]["lastScaleTime"]


def test_a_round_does_not_scale_a_service_edited_or_deleted_while_its_queries_ran():
    """A round reads the services, then waits for Prometheus (up to its deadline): a
    maxReplicas lowered meanwhile (or the service deleted) must not be scaled on the old
    spec; the next round decides on the new one."""
    for change in ("edited", "deleted"):
        kube = FakeKube()

        class Editing(Signals):
            def __call__(self, *args, **kw):
                kube.services[("ns", "svc")] = (None if change == "deleted" else
                                                {"metadata": {"namespace": "ns", "name": "svc", "generation": 2}})
                return super().__call__(*args, **kw)

        scaler = Autoscaler(kube, Editing(ttft=3.0, itl=0.2), lambda *a: None, clock=lambda: 1000.0)
        scaler.run_once([body()], force=True)
        assert kube.replicas == {"svc-prefill": 1, "svc-decode": 1}, change
        assert kube.status == {}, change


def test_one_services_failure_does_not_stop_the_round_for_the_others():
    kube = FakeKube()
    kube.replicas.update({"other-prefill": 1, "other-decode": 1})
    applied = kube.apply_replicas

    def apply_replicas(kind, namespace, name, replicas):
        if name.startswith("svc-"):
            raise RuntimeError("422: the pool went meanwhile")
        applied(kind, namespace, name, replicas)

    kube.apply_replicas = apply_replicas
    first, second = body(), body()
    second["metadata"] = {**second["metadata"], "name": "other"}
    class Both(Signals):
        def __call__(self, *args, **kw):
            return {**super().__call__(*args, **kw), ("ns", "other"): Observation(self.values[args[2]], None)}

    scaler = Autoscaler(kube, Both(ttft=3.0, itl=0.2), lambda *a: None, clock=lambda: 1000.0)
    scaler.run_once([first, second], force=True)  # svc's write fails first
    assert kube.replicas["other-decode"] > 1


def test_with_the_free_gpu_cap_off_the_cluster_is_not_read_and_nothing_caps_a_scale_up():
    kube = FakeKube(gpu_view=([], []))  # a cluster whose nodes are all gone: the cap would be 0
    Autoscaler(kube, Signals(ttft=3.0, itl=0.2), lambda *a: None, clock=lambda: 1000.0,
               free_gpu_cap=False).run_once([body()], force=True)
    assert kube.replicas["svc-decode"] > 1
    capped = FakeKube(gpu_view=([], []))
    Autoscaler(capped, Signals(ttft=3.0, itl=0.2), lambda *a: None, clock=lambda: 1000.0).run_once([body()], force=True)
    assert capped.replicas["svc-decode"] == 1


def test_no_scale_up_while_the_pools_pods_cannot_be_created():
    """A StatefulSet that has seen its size but could not create its pods (a ResourceQuota on
    GPUs, Pod Security) has no Pending pod to stop the scale-up: the pods are missing, not
    Unschedulable. Each round added replicas up to maxReplicas that would never exist (and
    that the GPU budget counted)."""
    class QuotaKube(FakeKube):
        def get(self, kind, namespace, name):
            sts = super().get(kind, namespace, name)
            if sts is not None and name == "svc-decode":
                sts["metadata"] = {"generation": 7}
                sts["status"] = {"replicas": 1, "readyReplicas": 1, "observedGeneration": 7}
            return sts

    kube = QuotaKube()
    kube.replicas["svc-decode"] = 2  # one pod created, the other refused by the quota
    scaler = Autoscaler(kube, Signals(ttft=0.5, itl=0.2), lambda *a: None, clock=lambda: 1000.0)
    scaler.run_once([body()])
    assert kube.replicas["svc-decode"] == 2
    assert "not created" in conditions(kube)["AutoscalingActive"]["message"]
    # while the StatefulSet has not yet seen the new size, its pods are merely not created yet
    class LaggingKube(QuotaKube):
        def get(self, kind, namespace, name):
            sts = super().get(kind, namespace, name)
            if sts is not None and name == "svc-decode":
                sts["status"]["observedGeneration"] = 6
            return sts

    kube = LaggingKube()
    kube.replicas["svc-decode"] = 2
    Autoscaler(kube, Signals(ttft=0.5, itl=0.2), lambda *a: None, clock=lambda: 1000.0).run_once([body()])
    assert kube.replicas["svc-decode"] > 2  # not seen yet: nothing is known to have failed


def test_status_metrics_are_the_figures_read_this_round_never_stale_ones_restamped():
    """status.metrics.observedAt is 'when these figures were read' and TTFT/ITL are kubectl's
    columns: a round that read nothing (Prometheus down, no series) stamped observedAt anew
    over the last round's figures, showing a TTFT of any age as current."""
    import copy

    kube = FakeKube()
    Autoscaler(kube, Signals(ttft=0.5, itl=0.04), lambda *a: None, clock=lambda: 1000.0).run_once([body()])
    assert kube.status["metrics"]["ttft"] == "500ms p99" and kube.status["metrics"]["observedAt"]
    b = body()
    b["status"] = copy.deepcopy(kube.status)
    b["status"]["metrics"]["observedAt"] = "2026-01-01T00:00:00Z"

    def down(*a, **kw):
        raise ConnectionError("prometheus down")

    Autoscaler(kube, down, lambda *a: None, clock=lambda: 2000.0).run_once([b])
    metrics = kube.status["metrics"]
    assert "ttft" not in metrics and "itl" not in metrics
    assert metrics.get("observedAt") in (None, "2026-01-01T00:00:00Z")
    # one pool read, the other not: only the figure read
    class Half(Signals):
        def __call__(self, prom, engine, role, quantile, secondaries=frozenset()):
            return super().__call__(prom, engine, role, quantile, secondaries) if role == "decode" else {}

    Autoscaler(kube, Half(itl=0.04), lambda *a: None, clock=lambda: 3000.0).run_once([b])
    metrics = kube.status["metrics"]
    assert "ttft" not in metrics and metrics["itl"] == "40ms p99" and metrics["observedAt"] != "2026-01-01T00:00:00Z"
