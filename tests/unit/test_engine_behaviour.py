"""Behaviour the renderer and the rules take from the pinned engines' source.

Each test names the fact it relies on; tests/contract/FACTS.md gives the
engine file. Expectations are written from the fact, never read back from the
code under test.
"""

from __future__ import annotations

import pytest

from pd_operator.api import SpecError, validate_service
from pd_operator.render import render
from tests.conftest import minimal


def problems(obj) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_service(obj)
    return dict(info.value.problems)


def objects(obj) -> list[dict]:
    return render(validate_service(obj))


def sts(obj, role: str) -> dict:
    return next(o for o in objects(obj) if o["kind"] == "StatefulSet" and o["metadata"]["name"].endswith(role))


def container(obj, role: str) -> dict:
    return sts(obj, role)["spec"]["template"]["spec"]["containers"][0]


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# ---------------------------------------------------------------- 1. SIGTERM

# vLLM 0.33.0 engine/arg_utils.py: --shutdown-timeout default 0; v1/engine/core.py
# _handle_shutdown: mode "abort" when 0, "drain" for up to N s otherwise.
TEARDOWN_S = 15  # v1/engine/utils.py ROCM_ENGINE_PROCESS_SHUTDOWN_TIMEOUT_S


@pytest.mark.parametrize("role,grace,drain", [("prefill", 120, 10), ("decode", 600, 10), ("decode", 90, 30)])
def test_vllm_drains_within_the_grace_period(role, grace, drain):
    obj = minimal(**{role: {"terminationGracePeriodSeconds": grace, "drainSeconds": drain}})
    c = container(obj, role)
    timeout = flag(c["command"], "--shutdown-timeout")
    assert timeout is not None, "without --shutdown-timeout vLLM aborts every in-flight request on SIGTERM"
    timeout = int(timeout)
    assert timeout > 0
    pod = sts(obj, role)["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= c["lifecycle"]["preStop"]["sleep"]["seconds"] + timeout + TEARDOWN_S


def test_grace_period_too_short_to_drain_is_refused():
    p = problems(minimal(decode={"terminationGracePeriodSeconds": 20, "drainSeconds": 10}))
    msg = p["spec.decode.terminationGracePeriodSeconds"]
    assert "drainSeconds + 16" in msg and "raise terminationGracePeriodSeconds" in msg


def test_shutdown_timeout_is_managed():
    with pytest.raises(SpecError) as info:
        objects(minimal(engine={"kind": "vllm", "extraArgs": ["--shutdown-timeout", "0"]}))
    assert "spec.engine.extraArgs[0]" in dict(info.value.problems)
