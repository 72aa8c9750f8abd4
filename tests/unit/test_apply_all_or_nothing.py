"""Issue 15: a reconcile writes nothing unless the API server accepts every
child that would be written (server-side dry-run first), and writes only the
children whose rendering differs from what is there."""

from __future__ import annotations

import copy

import pytest

from pd_operator.controller.kube import FIELD_MANAGER
from pd_operator.controller.reconcile import reconcile
from tests.conftest import minimal
from tests.unit.fakeapi import FakeApi, toleration_exists_with_value

NS = "ns"


def add_service(api: FakeApi, name: str = "svc", **spec) -> None:
    body = minimal(**spec)
    body["metadata"] = {"namespace": NS, "name": name, "uid": f"uid-{name}", "generation": 1}
    api.services[(NS, name)] = body


def run(api: FakeApi, name: str = "svc") -> tuple[dict | None, list]:
    events: list = []
    body = api.get_service(NS, name)
    try:
        status = reconcile(api, body, lambda b, t, r, m: events.append((t, r, m)))
    except RuntimeError:
        status = None
    return status, events


BAD_TOLERATION = {"tolerations": [{"key": "gpu", "operator": "Exists", "value": "yes"}]}


def test_a_child_the_api_server_refuses_means_nothing_is_created():
    api = FakeApi(refuse=toleration_exists_with_value)
    add_service(api, decode=BAD_TOLERATION)
    run(api)
    # before: the Services, PDB and the prefill StatefulSet were applied, then the decode one failed
    assert api.objects == {}, sorted(api.objects)
    assert [c for c in api.calls if c[0] == "apply"] == []
    ready = api.services[(NS, "svc")]["status"]["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    # the object and the field path the API server named, and its words
    assert "StatefulSet/svc-decode spec.template.spec.tolerations[0].operator" in ready["message"]
    assert "value must be empty when `operator` is 'Exists'" in ready["message"]


def test_a_refused_edit_leaves_the_running_children_as_they_were():
    api = FakeApi(refuse=toleration_exists_with_value)
    add_service(api)
    run(api)
    before = copy.deepcopy(api.objects)
    assert before
    svc = api.services[(NS, "svc")]
    svc["spec"]["decode"] = copy.deepcopy(BAD_TOLERATION)
    svc["spec"]["router"]["replicas"] = 2  # a good change in the same edit is not applied either
    svc["metadata"]["generation"] = 2
    api.calls.clear()
    run(api)
    assert [c for c in api.calls if c[0] in ("apply", "apply_replicas", "delete")] == []
    assert api.objects == before
    assert api.services[(NS, "svc")]["status"]["conditions"][0]["reason"] == "InvalidSpec"


def test_the_same_refused_spec_is_not_dry_run_again_at_every_resync():
    api = FakeApi(refuse=toleration_exists_with_value)
    add_service(api, name="again", decode=BAD_TOLERATION)
    run(api, "again")
    api.calls.clear()
    run(api, "again")
    assert [c for c in api.calls if c[0].startswith("apply")] == []


def test_an_unchanged_service_is_not_written_again():
    api = FakeApi()
    add_service(api)
    run(api)
    assert len([c for c in api.calls if c[0] == "apply"]) == 13
    api.calls.clear()
    run(api)
    # before: every child applied again at every reconcile (13 PATCHes per service per resync)
    assert api.writes() == []


def test_only_the_edited_child_is_written_when_the_spec_changes():
    api = FakeApi()
    add_service(api)
    run(api)
    svc = api.services[(NS, "svc")]
    svc["spec"]["router"]["resources"] = {"requests": {"cpu": "2"}}
    svc["metadata"]["generation"] = 2
    api.calls.clear()
    run(api)
    assert [c for c in api.calls if c[0] in ("apply", "apply-dry-run")] == \
        [("apply-dry-run", "Deployment"), ("apply", "Deployment")]


def test_a_hand_edit_is_restored_and_a_controller_status_write_is_not_mistaken_for_one():
    api = FakeApi()
    add_service(api)
    run(api)
    key = ("StatefulSet", NS, "svc-prefill")
    rendered_image = api.objects[key]["spec"]["template"]["spec"]["containers"][0]["image"]

    def set_status(o):
        o["status"] = {"replicas": 1, "readyReplicas": 1}

    api.edit(*key, set_status, manager="kube-controller-manager", subresource="status")
    api.calls.clear()
    run(api)
    assert [c for c in api.calls if c[0] == "apply"] == []

    def hand_edit(o):
        o["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"

    api.edit(*key, hand_edit, manager="kubectl-edit")
    api.calls.clear()
    run(api)
    assert [c for c in api.calls if c[0] == "apply"] == [("apply", "StatefulSet")]
    assert api.objects[key]["spec"]["template"]["spec"]["containers"][0]["image"] == rendered_image


def test_someone_elses_annotation_is_left_alone_and_costs_no_write():
    api = FakeApi()
    add_service(api)
    run(api)
    key = ("StatefulSet", NS, "svc-decode")

    def annotate(o):
        o["metadata"].setdefault("annotations", {})["team.example/owner"] = "alice"

    api.edit(*key, annotate, manager="kubectl-annotate")
    for _ in range(2):
        api.calls.clear()
        run(api)
        # a field the operator does not own: nothing to restore, so no write at every reconcile
        assert [c for c in api.calls if c[0] == "apply"] == []
    assert api.objects[key]["metadata"]["annotations"]["team.example/owner"] == "alice"

    def hand_edit(o):
        o["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 42

    api.edit(*key, hand_edit, manager="kubectl-patch")
    api.calls.clear()
    run(api)
    assert [c for c in api.calls if c[0] == "apply"] == [("apply", "StatefulSet")]
    assert api.objects[key]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 600


def test_a_child_deleted_by_hand_is_created_again():
    api = FakeApi()
    add_service(api)
    run(api)
    del api.objects[("NetworkPolicy", NS, "svc-router")]
    api.calls.clear()
    run(api)
    assert [c for c in api.calls if c[0] == "apply"] == [("apply", "NetworkPolicy")]


@pytest.mark.parametrize("autoscaled", [False, True])
def test_replicas_are_written_only_when_they_differ(autoscaled):
    api = FakeApi()
    pool = {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4}} if autoscaled else {"replicas": 2}
    add_service(api, decode=pool)
    run(api)
    api.calls.clear()
    run(api)
    # before: a pool with spec.replicas had its replicas applied at every reconcile
    assert [c for c in api.calls if c[0] == "apply_replicas"] == []


def test_the_autoscalers_part_of_status_does_not_make_the_reconciler_write_status_again():
    """Conditions and pool fields the autoscaler owns live beside the
    reconciler's (server-side apply): an idle reconcile of an autoscaled
    service must not see them as a change of its own status."""
    api = FakeApi()
    add_service(api, decode={"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4}})
    run(api)
    status = api.services[(NS, "svc")]["status"]
    status["conditions"].append({"type": "AutoscalingActive", "status": "True", "reason": "Deciding", "message": "m"})
    status["decode"]["autoscaler"] = {"recommendations": [[1.0, 1]], "changes": []}
    status["metrics"] = {"observedAt": "2026-01-01T00:00:00Z"}
    api.calls.clear()
    run(api)
    # before: every reconcile of an autoscaled service wrote status again
    assert [c for c in api.calls if c[0] == "patch_status"] == []


def test_a_verdict_carries_over_to_a_service_of_the_same_spec_in_the_namespace_only(monkeypatch):
    from pd_operator.controller.reconcile import ACCEPTED

    now = [1000.0]
    monkeypatch.setattr(ACCEPTED, "clock", lambda: now[0])
    api = FakeApi(refuse=toleration_exists_with_value)

    def dry_runs():
        return [c for c in api.calls if c[0] == "apply-dry-run"]

    add_service(api, "a")
    run(api, "a")
    first = len(dry_runs())
    assert first >= 10
    # the same spec under another name: every child is written, none sent to dry-run again
    api.calls.clear()
    add_service(api, "b")
    run(api, "b")
    assert dry_runs() == [] and len([c for c in api.calls if c[0] == "apply"]) >= 10
    assert ("Deployment", NS, "b-router") in api.objects
    # another spec (a bad toleration on decode): its decode StatefulSet is dry-run, and refused
    api.calls.clear()
    add_service(api, "c", decode=BAD_TOLERATION)
    run(api, "c")
    assert ("apply-dry-run", "StatefulSet") in dry_runs()
    assert not [k for k in api.objects if k[2].startswith("c-")]
    # the same spec in another namespace (its own admission, quotas, policies): dry-run
    api.calls.clear()
    other = minimal()
    other["metadata"] = {"namespace": "ns2", "name": "a", "uid": "uid-ns2-a", "generation": 1}
    api.services[("ns2", "a")] = other
    reconcile(api, api.get_service("ns2", "a"), lambda *a: None)
    assert len(dry_runs()) == first
    # after the TTL the verdicts are asked for again
    now[0] += ACCEPTED.TTL_SECONDS + 1
    api.calls.clear()
    add_service(api, "d")
    run(api, "d")
    assert len(dry_runs()) == first


def _typed_patch_refusal(obj: dict):
    """kube-apiserver 1.37's answer to a server-side apply whose body does not fit the kind's
    schema: structured-merge-diff's typed conversion fails (apimachinery v0.37.2
    pkg/util/managedfields/internal/structuredmerge.go:147, a plain error, so a 500 with reason
    Unknown: apiserver endpoints/handlers/responsewriters/status.go:60-80; the path and words from
    structured-merge-diff v6.4.2 typed/validate.go:99, helpers.go:36)."""
    import json

    from kubernetes.client.rest import ApiException

    sc = (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("securityContext") or {}
    if obj["kind"] == "StatefulSet" and isinstance(sc.get("runAsUser"), str):
        message = (f"failed to create typed patch object (apps/v1, Kind=StatefulSet; {obj['metadata']['namespace']}/"
                   f"{obj['metadata']['name']}): .spec.template.spec.securityContext.runAsUser: "
                   "expected numeric (int or float), got string")
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": 500}
        raise ApiException(status=500, reason="Internal Server Error", body=json.dumps(body))


class TypedFakeApi(FakeApi):
    def apply(self, obj, manager=FIELD_MANAGER, dry_run=False):
        _typed_patch_refusal(obj)
        return super().apply(obj, manager=manager, dry_run=dry_run)


def test_a_field_of_the_wrong_type_in_the_overlay_is_an_invalid_spec_not_an_apply_failure():
    """The CRD keeps podTemplate whole (preserve-unknown-fields), so a value of the wrong JSON
    type deep in it (runAsUser: "1000", quoted) reaches the API server, whose server-side apply
    cannot type it and answers 500 "failed to create typed patch object". The dry-run took any
    500 for the API server's trouble: the webhook admitted the spec and every reconcile failed
    as ApplyFailed, retried for ever. It is the spec's: refused with the child and the field."""
    from pd_operator.controller.reconcile import REFUSALS
    from pd_operator.controller.webhook import review

    overlay = {"podTemplate": {"spec": {"securityContext": {"runAsUser": "1000"}}}}
    api = TypedFakeApi()
    add_service(api, decode=overlay)
    status, _ = run(api)
    assert api.objects == {} and [c for c in api.calls if c[0] == "apply"] == []
    ready = api.services[(NS, "svc")]["status"]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec"), ready
    assert "StatefulSet/svc-decode spec.template.spec.securityContext.runAsUser" in ready["message"]
    assert "expected numeric (int or float), got string" in ready["message"]
    # and at admission
    REFUSALS.forget(NS, "new")
    bad = minimal(decode=overlay)
    bad["metadata"] = {"name": "new"}
    out = review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "u", "operation": "CREATE", "namespace": NS, "object": bad}}, api)["response"]
    assert out["allowed"] is False, out
    assert "StatefulSet/new-decode spec.template.spec.securityContext.runAsUser" in out["status"]["message"]


def _forbidden(message: str):
    import json

    from kubernetes.client.rest import ApiException

    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
            "message": message, "details": {"name": "svc-router", "group": "apps", "kind": "deployments"}}
    return ApiException(status=403, reason="Forbidden", body=json.dumps(body))


class PolicyFakeApi(FakeApi):
    """A cluster whose policy refuses the router's image: a controller-runtime webhook (OPA
    Gatekeeper) denies with 403 (controller-runtime v0.24.1 pkg/webhook/admission/response.go:63-76),
    which the API server words "admission webhook ... denied the request" (apiserver v0.37.2
    pkg/admission/plugin/webhook/errors/statuserror.go:29); a ValidatingAdmissionPolicy with
    reason Forbidden likewise (policy/validating/dispatcher.go:305-315)."""

    def __init__(self, message: str):
        super().__init__()
        self.message = message

    def apply(self, obj, manager=FIELD_MANAGER, dry_run=False):
        if obj["kind"] == "Deployment":
            self.calls.append(("apply-dry-run" if dry_run else "apply", obj["kind"]))
            raise _forbidden(self.message.format(name=obj["metadata"]["name"]))
        return super().apply(obj, manager=manager, dry_run=dry_run)


@pytest.mark.parametrize("message", [
    'admission webhook "validation.gatekeeper.sh" denied the request: [allowed-repos] container <router> has an '
    'invalid image repo <registry.example.com/pd/vllm-router:test>, allowed repos are ["ghcr.io/acme/"]',
    "deployments.apps \"{name}\" is forbidden: ValidatingAdmissionPolicy 'allowed-repos' with binding 'repos' "
    "denied request: image not allowed",
])
def test_a_child_a_policy_denies_is_refused_at_admission_and_nothing_written(message):
    from pd_operator.controller.reconcile import REFUSALS
    from pd_operator.controller.webhook import review

    api = PolicyFakeApi(message)
    REFUSALS.forget(NS, "svc")
    add_service(api)
    run(api)
    assert api.objects == {} and [c for c in api.calls if c[0] == "apply"] == []
    ready = api.services[(NS, "svc")]["status"]["conditions"][0]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec"), ready
    assert "Deployment/svc-router" in ready["message"] and "denied" in ready["message"]
    REFUSALS.forget(NS, "new")
    bad = minimal()
    bad["metadata"] = {"name": "new"}
    out = review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "u", "operation": "CREATE", "namespace": NS, "object": bad}}, api)["response"]
    assert out["allowed"] is False and "Deployment/new-router" in out["status"]["message"], out


def test_the_operators_own_rbac_refusal_stays_an_apply_failure():
    """A 403 from authorization is the install's (the operator lacks a verb), not the spec's."""
    from pd_operator.controller.reconcile import REFUSALS

    REFUSALS.forget(NS, "svc")  # the same spec as the test before, whose refusal is kept
    api = PolicyFakeApi('deployments.apps "{name}" is forbidden: User "system:serviceaccount:pd:pd-operator" cannot '
                        'patch resource "deployments" in API group "apps" in the namespace "ns"')
    add_service(api)
    run(api)
    ready = api.services[(NS, "svc")]["status"]["conditions"][0]
    assert ready["reason"] != "InvalidSpec" and api.objects == {}, ready


class QuotaApi(FakeApi):
    """A ResourceQuota on ``count/statefulsets.apps`` in the namespace: the API server's quota
    admission refuses a create past it, dry-run or not, with a 403 (apiserver
    plugin/pkg/admission/resourcequota: "exceeded quota")."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def apply(self, obj, manager=FIELD_MANAGER, dry_run=False):
        import json

        from kubernetes.client.rest import ApiException

        kind, ns, name = obj["kind"], obj["metadata"]["namespace"], obj["metadata"]["name"]
        used = sum(1 for k in self.objects if k[0] == "StatefulSet" and k[1] == ns)
        if kind == "StatefulSet" and (kind, ns, name) not in self.objects and used >= self.limit:
            self.calls.append(("apply-dry-run" if dry_run else "apply", kind))
            message = (f'statefulsets.apps "{name}" is forbidden: exceeded quota: sts, requested: '
                       f"count/statefulsets.apps=1, used: count/statefulsets.apps={used}, "
                       f"limited: count/statefulsets.apps={self.limit}")
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                    "reason": "Forbidden", "code": 403}
            raise ApiException(status=403, reason="Forbidden", body=json.dumps(body))
        return super().apply(obj, manager=manager, dry_run=dry_run)


def test_a_write_refused_after_kept_verdicts_leaves_nothing_of_a_new_service():
    """The dry-run verdicts of one service carry over to another of the same spec; a quota
    filled in between refuses the second's StatefulSet only at the real write. Before, the
    children written up to it stayed (half-created) and the next passes wrote them again from
    the kept verdicts; now they are deleted, the namespace's verdicts dropped, and the next
    pass is refused at the dry-run, writing nothing."""
    api = QuotaApi(limit=2)
    add_service(api, "a")
    run(api, "a")
    assert sum(1 for k in api.objects if k[0] == "StatefulSet") == 2
    add_service(api, "b")
    api.calls.clear()
    _, events = run(api, "b")
    assert not [k for k in api.objects if k[2].startswith("b-")], sorted(api.objects)
    failed = [m for t, r, m in events if r == "ApplyFailed"]
    assert failed and "exceeded quota" in failed[0] and "were deleted" in failed[0], events
    assert ("delete", "Service") in api.calls
    # the next pass asks the API server again and writes nothing
    api.calls.clear()
    run(api, "b")
    assert ("apply-dry-run", "StatefulSet") in api.calls
    assert [c for c in api.calls if c[0] in ("apply", "apply_replicas", "delete")] == []
    assert not [k for k in api.objects if k[2].startswith("b-")]
    # the running service is not touched
    assert sum(1 for k in api.objects if k[2].startswith("a-")) >= 10


def test_a_refused_write_undoes_only_children_the_pass_created():
    """A service whose pools are gone (deleted by hand) while its other children serve: when
    putting them back is refused half-way (the quota now holds one more StatefulSet), the pool
    this pass created is deleted and nothing that existed before the pass, edited in it or
    not, is touched (found by a review: the undo first took every child the pass wrote)."""
    api = QuotaApi(limit=2)
    add_service(api, "a")
    run(api, "a")
    for role in ("prefill", "decode"):
        api.objects.pop(("StatefulSet", NS, f"a-{role}"))
    api.limit = 1
    svc = api.services[(NS, "a")]
    svc["spec"]["router"]["replicas"] = 2  # the router Deployment is stale in the same pass
    svc["metadata"]["generation"] = 2
    before = {k for k in api.objects if k[2].startswith("a-")}
    api.calls.clear()
    _, events = run(api, "a")
    assert [c for c in api.calls if c[0] == "apply"] == [("apply", "StatefulSet"), ("apply", "StatefulSet")]
    assert [c for c in api.calls if c[0] == "delete"] == [("delete", "StatefulSet")]  # a-prefill, created now
    assert {k for k in api.objects if k[2].startswith("a-")} == before
    assert any(r == "ApplyFailed" and "exceeded quota" in m and "1 children" in m for _, r, m in events), events


class TimeoutApi(FakeApi):
    """One write times out: urllib3's read timeout (not an API error), or the API server's
    504 ("the server was unable to return a response in the time allotted, but may still be
    processing the request"); the write's fate unknown. ``landed``: the API server stored it
    before the answer was lost. ``first``: the pass's first write times out, else the decode
    StatefulSet's."""

    def __init__(self, landed: bool, first: bool, status: int | None = None):
        super().__init__()
        self.timeouts, self.landed, self.first, self.status = 1, landed, first, status

    def apply(self, obj, manager=FIELD_MANAGER, dry_run=False):
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import ReadTimeoutError

        if not dry_run and self.timeouts and (self.first or (obj["kind"] == "StatefulSet"
                                                             and obj["metadata"]["name"].endswith("-decode"))):
            self.timeouts -= 1
            if self.landed:
                super().apply(obj, manager=manager, dry_run=dry_run)
            if self.status:
                raise ApiException(status=self.status, reason="Timeout")
            raise ReadTimeoutError(None, "/apis", "Read timed out. (read timeout=60)")
        return super().apply(obj, manager=manager, dry_run=dry_run)


@pytest.mark.parametrize("landed", [False, True])
@pytest.mark.parametrize("first", [False, True])
def test_a_write_that_times_out_leaves_nothing_of_a_new_service_and_the_retry_creates_it(landed, first):
    """Before, only an API error undid a new service's children: a timeout left the Services
    and the prefill pool, and the retry, finding a pool, took the service as an existing one,
    so a refusal after that would have left it half-created (found by a review). The write
    that timed out is undone too (its answer may be lost after it landed: found by a second
    review), also when it is the pass's first."""
    from urllib3.exceptions import ReadTimeoutError

    api = TimeoutApi(landed, first)
    add_service(api)
    events: list = []
    with pytest.raises(ReadTimeoutError):  # raised again: kopf retries the handler
        reconcile(api, api.get_service(NS, "svc"), lambda b, t, r, m: events.append((t, r, m)))
    assert api.objects == {}, sorted(api.objects)
    failed = [m for t, r, m in events if r == "ApplyFailed"]
    if first and not landed:  # nothing was written: nothing to undo
        assert not failed and not [c for c in api.calls if c[0] == "delete"], events
    else:
        assert failed and "were deleted" in failed[0], events
        assert ("whose write landed" in failed[0]) == landed, failed[0]
    if not first:
        assert ("apply", "StatefulSet") in api.calls and "StatefulSet/svc-decode" in failed[0]
    run(api)
    assert {k[0] for k in api.objects} >= {"StatefulSet", "Service", "Deployment"}
    assert sum(1 for k in api.objects if k[0] == "StatefulSet") == 2


@pytest.mark.parametrize("first", [False, True])
def test_a_write_answered_504_after_it_landed_is_undone_with_the_others(first):
    """An API error of 5xx may follow a write that landed: the object, absent before the pass,
    is deleted with the children the pass created (found by a review)."""
    api = TimeoutApi(landed=True, first=first, status=504)
    add_service(api)
    _, events = run(api)
    assert api.objects == {}, sorted(api.objects)
    assert any(r == "ApplyFailed" and "504" in m and "were deleted" in m for _, r, m in events), events
    run(api)
    assert sum(1 for k in api.objects if k[0] == "StatefulSet") == 2


def test_a_write_of_unknown_fate_never_deletes_what_someone_else_had_there():
    """The cache holds only objects with the operator's labels, so an unlabelled Service of a
    child's name reads absent; an apply that lands on it and then times out must not delete
    it (found by a review): its other field manager shows it was there before."""
    api = TimeoutApi(landed=True, first=False)
    add_service(api)
    theirs = {"apiVersion": "v1", "kind": "Service", "metadata": {
        "namespace": NS, "name": "svc-decode", "labels": {},
        "annotations": {"team": "infra"},
        "managedFields": [{"manager": "kubectl-client-side-apply", "operation": "Update",
                           "fieldsV1": ["metadata.annotations.team"]}]}}
    api.objects[("Service", NS, "svc-decode")] = theirs  # what the cache does not see

    class Cached:  # the cache answers these kinds from what it saw: nothing of this name
        kube = api

        def __getattr__(self, name):
            return getattr(api, name)

        def get(self, kind, namespace, name):
            return None if kind == "Service" else api.get(kind, namespace, name)

    from urllib3.exceptions import ReadTimeoutError

    def apply(obj, manager=FIELD_MANAGER, dry_run=False):  # the Service's write lands, then times out
        if not dry_run and obj["kind"] == "Service" and obj["metadata"]["name"] == "svc-decode" and api.timeouts:
            api.timeouts -= 1
            FakeApi.apply(api, obj, manager=manager, dry_run=dry_run)
            raise ReadTimeoutError(None, "/api", "Read timed out.")
        return FakeApi.apply(api, obj, manager=manager, dry_run=dry_run)

    api.apply = apply
    with pytest.raises(ReadTimeoutError):
        reconcile(Cached(), api.get_service(NS, "svc"), lambda b, t, r, m: None)
    assert ("Service", NS, "svc-decode") in api.objects  # theirs, now with the operator's fields too
