"""A secret flag value passed without the command line.

The kubelet expands ``$(VAR)`` in a container's command from its environment,
so ``--api-key $(KEY)`` puts a Secret into the process's argv, which every
user on the node reads (``ps``, ``/proc/<pid>/cmdline``). SGLang 0.5.23's
``--api-key`` (sglang/srt/arg_groups/fields/serving.py) and the routers'
``--api-key`` (vllm_router/router_args.py, sglang_router/router_args.py) read
no environment variable, so the command is a short Python launcher that
appends ``FLAG value-of-$ENV`` to ``sys.argv`` inside the process and runs the
program's module as ``python3 -m MODULE`` would (runpy; the three programs
run their ``main()`` under ``if __name__ == "__main__"``). Python's
``sys.argv`` is a copy: the process's command line keeps only the flag and
the variable's name.
"""

from __future__ import annotations

import re
from pathlib import Path

LAUNCHER = (
    "import os, runpy, sys; "
    "module, flag, env = sys.argv[1:4]; del sys.argv[1:4]; "
    "sys.argv += [flag, os.environ[env]]; "
    "runpy.run_module(module, run_name='__main__', alter_sys=True)"
)


def with_secret_flag(module: str, args: list[str], flag: str, env: str) -> list[str]:
    """``python3 -m module *args flag <value of env>``, the value kept out of argv."""
    return ["python3", "-c", LAUNCHER, module, flag, env, *args]


def logical_argv(argv: list[str]) -> list[str]:
    """The command line the program parses, with ``$(ENV)`` standing for the
    secret value (what the flag-set checks and the simulator read)."""
    argv = list(argv)
    if len(argv) >= 6 and Path(argv[0]).name.startswith("python") and argv[1] == "-c" and argv[2] == LAUNCHER:
        module, flag, env = argv[3:6]
        return [argv[0], "-m", module, *argv[6:], flag, f"$({env})"]
    return argv


# --------------------------------------------------------------------------
# Pods of a replica that spans nodes (LeaderWorkerSet)
# --------------------------------------------------------------------------
#
# Each pod of an LWS group learns its place only at start: the LWS pod webhook
# writes LWS_LEADER_ADDRESS (the leader's DNS name), LWS_WORKER_INDEX (0 for
# the leader, 1..size-1 for the workers) and LWS_GROUP_SIZE into every
# container's environment (sigs.k8s.io/lws@v0.9.0 pkg/utils/pod/pod_utils.go
# AddLWSVariables; names in api/leaderworkerset/v1/leaderworkerset_types.go).
# Some flags need a value computed from them (vLLM's --data-parallel-start-rank
# is LWS_WORKER_INDEX x the pod's local DP ranks), which the kubelet's $(VAR)
# expansion cannot do, so a group pod's command is this launcher: it appends
# the pairs ``FLAG TEMPLATE`` to sys.argv, each ``{VAR}`` in TEMPLATE replaced
# by the variable's value and ``{VAR*K}`` by its integer value times K, then
# runs the module as ``python3 -m MODULE`` would. The secret API key of
# SGLang rides along as one more pair (``--api-key {PD_ENGINE_API_KEY}``).

GROUP_LAUNCHER = (
    "import os, re, runpy, sys; "
    "module, n = sys.argv[1], int(sys.argv[2]); pairs = sys.argv[3:3 + 2 * n]; del sys.argv[1:3 + 2 * n]; "
    "sub = lambda t: re.sub(r'[{](\\w+)(?:[*](\\d+))?[}]', "
    "lambda m: str(int(os.environ[m[1]]) * int(m[2])) if m[2] else os.environ[m[1]], t); "
    "sys.argv += [sub(x) for x in pairs]; "
    "runpy.run_module(module, run_name='__main__', alter_sys=True)"
)
# Modules whose console script is what the flag-set checks know (`vllm serve ...`).
CONSOLE_SCRIPTS = {"vllm.entrypoints.cli.main": "vllm"}
_TEMPLATE = re.compile(r"[{](\w+)(?:[*](\d+))?[}]")


def with_group_flags(module: str, args: list[str], pairs: list[tuple[str, str]]) -> list[str]:
    """``python3 -m module *args`` plus ``FLAG value`` for each (FLAG, TEMPLATE), the
    values filled in from the pod's environment when the process starts."""
    flat = [x for pair in pairs for x in pair]
    return ["python3", "-c", GROUP_LAUNCHER, module, str(len(pairs)), *flat, *args]


def resolve_argv(argv: list[str], env: dict[str, str]) -> list[str]:
    """The command line the program itself sees in a pod with environment ``env``:
    what the launchers hand to the module (``python3 -m module ...``). A plain
    command is returned as it is."""
    argv = list(argv)
    if len(argv) >= 5 and Path(argv[0]).name.startswith("python") and argv[1] == "-c" and argv[2] == GROUP_LAUNCHER:
        module, n = argv[3], int(argv[4])
        pairs, rest = argv[5:5 + 2 * n], argv[5 + 2 * n:]

        def sub(t: str) -> str:
            return _TEMPLATE.sub(lambda m: str(int(env[m[1]]) * int(m[2])) if m[2] else env[m[1]], t)

        resolved = [*rest, *(sub(x) for x in pairs)]
        if module in CONSOLE_SCRIPTS:
            return [CONSOLE_SCRIPTS[module], *resolved]
        return [argv[0], "-m", module, *resolved]
    if len(argv) >= 6 and Path(argv[0]).name.startswith("python") and argv[1] == "-c" and argv[2] == LAUNCHER:
        module, flag, var = argv[3:6]
        return [argv[0], "-m", module, *argv[6:], flag, env[var]]
    return argv
