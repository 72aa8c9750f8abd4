"""Unit tests share the operator's module-level state: what one test's fake API
server accepted or refused must not carry over to another's."""

from __future__ import annotations

import pytest

from pd_operator.controller.reconcile import ACCEPTED, REFUSALS


@pytest.fixture(autouse=True)
def fresh_dry_run_verdicts():
    ACCEPTED.clear()
    REFUSALS.clear()
    yield
    ACCEPTED.clear()
    REFUSALS.clear()
