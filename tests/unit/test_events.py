"""Events from the operator's own threads (the autoscaler's loop): kopf.event needs
kopf's context (it raises LookupError elsewhere), so they are posted directly."""

from __future__ import annotations

import threading

from pd_operator.controller import handlers


def test_event_from_a_plain_thread_is_posted(monkeypatch):
    posted = []

    class Kube:
        def post_event(self, body, type_, reason, message):
            posted.append((body["metadata"]["name"], type_, reason, message))

    monkeypatch.setattr(handlers, "kube", lambda: Kube())
    body = {"apiVersion": "pdserving.io/v1alpha1", "kind": "PDInferenceService",
            "metadata": {"name": "chat", "namespace": "team-a", "uid": "u1"}}
    t = threading.Thread(target=handlers.post_event, args=(body, "Warning", "EngineAuthRejected", "the workers refused"))
    t.start()
    t.join()
    assert posted == [("chat", "Warning", "EngineAuthRejected", "the workers refused")]
