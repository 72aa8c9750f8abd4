"""Checks of user-supplied flags (extraArgs) before anything is rendered."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

from ..api.errors import SpecError


def _dests(component: str, version: str, flags) -> set[str]:
    """The parser destinations of option strings: every alias of a flag (and its
    --no-/--disable- twin) shares one, in the pinned flag-set snapshot."""
    from .engines.flagset import SnapshotNotFound, flag_info

    out = set()
    for flag in flags:
        try:
            entry = flag_info(component, version, flag)
        except SnapshotNotFound:
            return out
        if entry is not None and not entry.get("positional"):
            out.add(entry["dest"])
    return out


def check_user_args(
    component: str,
    version: str,
    managed: frozenset[str],
    sources: list[tuple[str, list[str]]],
    base_argv: list[str],
    service_name: str | None,
    refused: Mapping[str, str] | None = None,
) -> None:
    """Refuse flags the operator sets itself, flags it cannot work with (``refused``: flag ->
    why), and flags the pinned version lacks.

    ``sources``: (field path, args) pairs; ``base_argv``: the smallest valid
    command the args are appended to for the flag-set check.
    """
    refused = refused or {}
    problems: list[tuple[str, str]] = []
    managed_dests = _dests(component, version, managed)
    for path, args in sources:
        owned = []
        for i, arg in enumerate(args):
            if "$(" in arg:
                # the kubelet expands $(VAR) in args from the container's env: a
                # Secret-backed variable would land in the process list
                owned.append((f"{path}[{i}]", "$( is refused: the kubelet replaces $(VAR) with the variable's value "
                              "in the command line, where every process on the node can read it (Secrets included); "
                              "write the value itself, or set it through an environment variable the program reads"))
                continue
            flag = arg.split("=", 1)[0]
            if not flag.startswith("-"):
                continue
            # vLLM: --json-flag.key is a key of --json-flag; --foo_bar is --foo-bar
            name = flag.split(".", 1)[0].replace("_", "-")
            dest = _dests(component, version, (name,))
            if name in refused:
                owned.append((f"{path}[{i}]", f"{flag} is refused: {refused[name]}"))
            elif name in managed or dest & managed_dests:
                owned.append((f"{path}[{i}]", f"{flag} is set by the operator from the spec; use the matching field instead"))
        problems += owned
        if args and not owned:
            from .engines.flagset import FlagError, check_argv

            try:
                check_argv(component, version, base_argv + list(args))
            except FlagError as err:
                problems.append((path, str(err)))
    if problems:
        raise SpecError(problems, service_name)


@lru_cache(maxsize=256)
def _parsed_value(component: str, version: str, argv: tuple[str, ...], dest: str):
    from .engines.flagset import FlagError, SnapshotNotFound, check_argv

    try:
        return getattr(check_argv(component, version, list(argv)), dest, None)
    except (FlagError, SnapshotNotFound):
        return None


def user_flag_value(component: str, version: str, base_argv: list[str], args: list[str], dest: str):
    """What the pinned parser reads into ``dest`` from user flags (``args``, appended to
    ``base_argv`` as :func:`check_user_args` does; the last of repeated flags wins);
    None when unset or when the flags are refused (reported by :func:`check_user_args`)."""
    return _parsed_value(component, version, tuple(base_argv) + tuple(args), dest)


def user_engine_flag(spec, role: str, flag: str):
    """A flag of the pool's engine as its parser reads it from ``spec.engine.extraArgs`` then
    the pool's (rendered in that order: the last wins); None when unset."""
    return _read_flag(spec, list(spec.engine.extra_args) + list(spec.pool(role).extra_args), flag)


def _read_flag(spec, args: list[str], flag: str, default: bool = False):
    """``flag`` as the engine's parser reads it from ``args`` (None without args, unless
    ``default``: then the parser's default)."""
    if not args and not default:
        return None
    base = (["vllm", "serve", "model"] if spec.engine.kind == "vllm"
            else ["python3", "-m", "sglang.launch_server", "--model-path", "model"])
    return user_flag_value(spec.engine.kind, spec.engine.effective_version(), base, args,
                           flag.lstrip("-").replace("-", "_"))


def pool_sets(spec, role: str, flag: str) -> bool:
    """Whether the pool's own extraArgs set ``flag``, under any of its names (as the engine's
    parser reads them: ``-pcp`` is ``--prefill-context-parallel-size``)."""
    args = list(spec.pool(role).extra_args)
    return bool(args) and _read_flag(spec, args, flag) != _read_flag(spec, [], flag, default=True)


def flag_field(spec, role: str, flag: str) -> str:
    """The field that sets ``flag`` for the pool, for an error to name: the pool's extraArgs
    when they set it (they come last and win), else the engine's."""
    return f"spec.{role}.extraArgs" if pool_sets(spec, role, flag) else "spec.engine.extraArgs"


def pair_field(spec, *flags: str) -> str:
    """The field to name for a setting prefill and decode must agree on: the pool extraArgs that
    set the first of ``flags`` either pool sets (decode's first), else spec.engine.extraArgs."""
    for flag in flags:
        for role in ("decode", "prefill"):
            if pool_sets(spec, role, flag):
                return f"spec.{role}.extraArgs"
    return "spec.engine.extraArgs"
