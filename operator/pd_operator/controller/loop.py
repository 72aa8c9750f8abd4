"""The operator's periodic loops (the resync, the autoscaler's rounds): one
function run over the namespaces in scope every period, until stopped; a
failure is logged and retried at the next period, never fatal."""

from __future__ import annotations

import logging
import threading
from typing import Callable

from .health import Health

log = logging.getLogger(__name__)


def every(period: float, stop: threading.Event, namespaces: list[str], per_namespace: Callable[[str | None], None],
          what: str, health: Health | None = None, max_age: float = 0.0) -> None:
    """Call ``per_namespace(ns)`` for each namespace in scope (``None``: all) every ``period`` seconds.

    With ``health``, the loop beats as ``what`` before its first round and after
    each round: a round stuck for longer than ``max_age`` turns /healthz to 503."""
    if health:
        health.beat(what, max_age)
    while not stop.wait(period):
        for namespace in namespaces or [None]:
            try:
                per_namespace(namespace)
            except Exception:
                log.exception("%s of %s failed; retrying in %gs", what, namespace or "(all namespaces)", period)
        if health:
            health.beat(what, max_age)
    if health:
        health.forget(what)
