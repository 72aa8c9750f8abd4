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
