"""Issue 19: what a tenant's spec can make the operator render.

- $( in extraArgs is refused (the kubelet would expand it from the env, Secrets
  included, into the process list); the engine and router keys never travel
  in argv: the launcher appends them inside the process, proven by running it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pd_operator.api import SpecError, validate_service
from pd_operator.render import render
from pd_operator.render.launch import LAUNCHER
from tests.conftest import minimal

KEY = {"apiKeySecretRef": {"name": "engine-key", "key": "api-key"}}


def containers(objs):
    for obj in objs:
        if obj["kind"] in ("StatefulSet", "Deployment"):
            for c in obj["spec"]["template"]["spec"]["containers"]:
                yield obj, c


@pytest.mark.parametrize("where, spec, field", [
    ("engine", {"engine": {"kind": "vllm", "extraArgs": ["--root-path=$(HF_TOKEN)"]}}, "spec.engine.extraArgs[0]"),
    ("pool", {"decode": {"extraArgs": ["--enforce-eager", "--root-path", "$(HF_TOKEN)"]}}, "spec.decode.extraArgs[2]"),
    ("router", {"router": {"extraArgs": ["--log-level", "$(ROUTER_WORKER_API_KEY)"]}}, "spec.router.extraArgs[1]"),
])
def test_dollar_paren_in_extra_args_is_refused_naming_the_field(where, spec, field):
    obj = minimal()
    for k, v in spec.items():
        obj["spec"][k] = {**obj["spec"].get(k, {}), **v}
    with pytest.raises(SpecError) as err:
        render(validate_service(obj))
    fields = dict(err.value.problems)
    assert field in fields and "$(" in fields[field] and "environment variable" in fields[field]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_no_secret_is_expanded_into_any_command_line(kind):
    objs = render(validate_service(minimal(kind, engine={"kind": kind, **KEY})))
    secret_vars = set()
    for _, c in containers(objs):
        secret_vars |= {e["name"] for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
        assert not any("$(" in a for a in [*c.get("command", []), *c.get("args", [])]), c["command"]
    assert secret_vars  # the keys are there, through the environment only


def test_the_launcher_passes_the_key_to_the_program_but_not_to_the_command_line(tmp_path):
    """Run the rendered router launcher for real, on a stand-in module that
    reports what the program parses (sys.argv) and what `ps` shows (/proc)."""
    objs = render(validate_service(minimal("sglang", engine={"kind": "sglang", **KEY})))
    (router,) = [c for o, c in containers(objs) if o["kind"] == "Deployment"]
    argv = router["command"]
    assert argv[1:3] == ["-c", LAUNCHER]
    module = argv[3]
    pkg = tmp_path / module.split(".")[0]
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / (module.split(".")[1] + ".py")).write_text(
        "import sys\n"
        "if __name__ == '__main__':\n"
        "    print(repr(sys.argv[1:]))\n"
        "    print(open('/proc/self/cmdline', 'rb').read().replace(b'\\0', b' ').decode())\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path), "ROUTER_WORKER_API_KEY": "s3cret-key"}
    out = subprocess.run([sys.executable, *argv[1:]], env=env, capture_output=True, text=True, timeout=30, check=True)
    parsed, cmdline = out.stdout.splitlines()[:2]
    parsed = eval(parsed)  # noqa: S307 - our own repr
    assert parsed[-2:] == ["--api-key", "s3cret-key"] and parsed[:2] == ["--host", "0.0.0.0"]
    assert "s3cret-key" not in cmdline and "ROUTER_WORKER_API_KEY" in cmdline
