#!/usr/bin/env python3
"""Extract flag-set snapshots from the REAL engine and router argument parsers.

This script imports each component's own argument parser at its pinned
version, walks every argparse action, and writes one JSON snapshot per
component into ``operator/pd_operator/render/engines/flagsets/``.  The
snapshots are committed; ``operator/pd_operator/render/engines/flagset.py``
(stdlib only) loads them to check rendered command lines without vLLM or
SGLang installed.

Each component needs its own virtualenv OUTSIDE the repo (their torch pins
conflict).  Re-create them with::

    B=/root/.cache/pd-operator/venvs
    python3 -m venv $B/engines-vllm   && $B/engines-vllm/bin/pip install vllm==0.33.0
    python3 -m venv $B/engines-sglang && $B/engines-sglang/bin/pip install sglang==0.5.23
    python3 -m venv $B/routers        && $B/routers/bin/pip install vllm-router==0.1.17 sglang-router==0.3.2

(about 13 min / 9.4 GB for vLLM, 13 min / 11 GB for SGLang, 20 s / 220 MB for
both routers on the 2-core dev machine).  Then, from the repo root::

    VLLM_TARGET_DEVICE=cpu $B/engines-vllm/bin/python tests/contract/extract_flagsets.py vllm
    $B/engines-sglang/bin/python tests/contract/extract_flagsets.py sglang
    $B/routers/bin/python tests/contract/extract_flagsets.py vllm-router sglang-router

Each run asserts that the installed version equals the pin below; bump the
pin here (and in ``flagset.py``'s callers) to move to a new version, re-run,
and review the JSON diff.  ``--out DIR`` writes elsewhere (used by the
``realparser`` tests to compare a fresh extraction with the committed one).

This file only imports the engines inside the per-component functions, so the
pure helpers (``describe_parser`` etc.) can be imported anywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import hashlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import platform
import re
import sys
import typing
from pathlib import Path
from typing import Any, Callable

SCHEMA_VERSION = 1

PINS: dict[str, str] = {
    "vllm": "0.33.0",
    "sglang": "0.5.23",
    "vllm-router": "0.1.17",
    "sglang-router": "0.3.2",
}

# distribution name on PyPI for each component
DISTRIBUTIONS = {
    "vllm": "vllm",
    "sglang": "sglang",
    "vllm-router": "vllm-router",
    "sglang-router": "sglang-router",
}

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "operator" / "pd_operator" / "render" / "engines" / "flagsets"

# The engine and router modules the extractors below import by name to build
# each parser and read its facts, relative to site-packages. Every extraction
# records their sha256, with the sha256 of the snapshot it wrote, in
# SOURCES_MANIFEST; tests/contract/test_flagset_sources.py recomputes them from
# the pinned wheels (no engine install), so a snapshot that was not extracted
# from the pinned release, or was edited afterwards, fails CI. A test keeps this
# list equal to the imports of this file.
PARSER_SOURCES: dict[str, tuple[str, ...]] = {
    "vllm": (
        "vllm/__init__.py",
        "vllm/entrypoints/common/cli_args.py",      # make_arg_parser, FrontendArgs
        "vllm/engine/arg_utils.py",                 # EngineArgs.add_cli_args
        "vllm/utils/argparse_utils.py",             # FlexibleArgumentParser (argv rewriting)
        "vllm/config/kv_transfer.py",               # KVTransferConfig
        "vllm/distributed/kv_transfer/kv_connector/factory.py",  # the connector registry
        "vllm/envs.py",                             # declared environment variables
    ),
    "sglang": (
        "sglang/__init__.py",
        "sglang/srt/server_args.py",                # prepare_server_args, ServerArgs.add_cli_args
        "sglang/srt/environ.py",                    # Envs
        "sglang/srt/arg_groups/choices.py",         # DISAGG_TRANSFER_BACKEND_CHOICES
    ),
    "vllm-router": ("vllm_router/launch_router.py", "vllm_router/router_args.py"),
    "sglang-router": ("sglang_router/launch_router.py", "sglang_router/router_args.py"),
}
SOURCES_MANIFEST = REPO_ROOT / "tests" / "contract" / "flagset_sources.json"

# Environment-variable names read in source, e.g. os.getenv("FOO"),
# os.environ["FOO"], os.environ.get("FOO"), get_bool_env_var("FOO").
_ENV_READ_RE = re.compile(
    r"""(?:os\.environ\.get|os\.environ\.setdefault|os\.getenv|os\.environ|environ\.get|getenv"""
    r"""|get_bool_env_var|get_int_env_var|get_float_env_var|get_str_env_var|_get_env)"""
    r"""\s*[\[(]\s*["']([A-Z][A-Z0-9_]{2,})["']"""
)
# kv_connector_extra_config keys read in a connector's source.
_C = r"""(?:\s*#[^\n]*)?\s*"""  # optional trailing comment after "(" (e.g. "# type: ignore")
_EXTRA_KEY_RES = (
    re.compile(r"""get_from_extra_config\(""" + _C + r"""["']([A-Za-z0-9_]+)["']"""),
    re.compile(r"""extra_config\s*(?:\.get\(|\[)""" + _C + r"""["']([A-Za-z0-9_]+)["']"""),
)


# --------------------------------------------------------------------------
# Generic argparse description (pure stdlib, importable without engines)
# --------------------------------------------------------------------------

_ADDR_RE = re.compile(r" at 0x[0-9a-fA-F]+")
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _jsonable(value: Any) -> tuple[bool, Any]:
    """Return (True, value) if value round-trips through JSON unchanged."""
    try:
        text = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return False, None
    try:
        return json.loads(text) == value, value
    except ValueError:  # pragma: no cover - defensive
        return False, None


def _stable_repr(value: Any) -> str:
    text = repr(value)
    text = _ADDR_RE.sub("", text)
    return _UUID_RE.sub("<uuid>", text)


def _qualname(obj: Any) -> str:
    mod = getattr(obj, "__module__", None) or ""
    qn = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    return f"{mod}.{qn}" if mod else qn


def action_kind(action: argparse.Action) -> str:
    """Map an argparse action to a small vocabulary the loader understands."""
    checks: list[tuple[type, str]] = [
        (argparse._HelpAction, "help"),
        (argparse._VersionAction, "version"),
        (argparse._SubParsersAction, "subparsers"),
        (argparse.BooleanOptionalAction, "boolean_optional"),
        (argparse._StoreTrueAction, "store_true"),
        (argparse._StoreFalseAction, "store_false"),
        (argparse._StoreConstAction, "store_const"),
        (argparse._AppendConstAction, "append_const"),
        (argparse._CountAction, "count"),
        (argparse._ExtendAction, "extend"),
        (argparse._AppendAction, "append"),
        (argparse._StoreAction, "store"),
    ]
    for cls, name in checks:
        if isinstance(action, cls):
            return name
    return "custom"


def describe_type(t: Any) -> dict[str, Any]:
    """Describe an argparse ``type=`` callable so the loader can emulate it.

    Kinds the loader validates: str, int, float, json, json_dataclass,
    json_or_str, human_readable_int, human_readable_int_or_auto, optional
    (wrapping another kind).  Anything else is recorded as ``callable`` and
    accepted as a plain string by the loader.
    """
    if t is None:
        return {"kind": "none"}
    if t is str:
        return {"kind": "str"}
    if t is int:
        return {"kind": "int"}
    if t is float:
        return {"kind": "float"}
    if t is json.loads:
        return {"kind": "json"}
    qual = getattr(t, "__qualname__", "") or ""
    name = getattr(t, "__name__", "") or ""
    if isinstance(t, type):
        return {"kind": "class", "name": _qualname(t)}
    try:
        nonlocals = inspect.getclosurevars(t).nonlocals
    except (TypeError, ValueError):
        nonlocals = {}
    if qual.endswith("optional_type.<locals>._optional_type"):
        return {"kind": "optional", "inner": describe_type(nonlocals.get("return_type"))}
    if qual.endswith("parse_type.<locals>._parse_type"):
        inner = describe_type(nonlocals.get("return_type"))
        return inner
    if name == "parse_dataclass":
        defaults = getattr(t, "__defaults__", None) or ()
        cls = defaults[0] if defaults else None
        return {"kind": "json_dataclass", "class": _qualname(cls) if cls else None}
    if name in ("human_readable_int", "human_readable_int_or_auto"):
        return {"kind": name}
    if name == "union_dict_and_str":
        return {"kind": "json_or_str"}
    out: dict[str, Any] = {"kind": "callable", "name": _qualname(t)}
    # Record a normalising callable (vLLM lower-cases backend names and maps
    # "-" to "_" before checking choices) so the loader can do the same.
    try:
        if t("Ab-Cd") == "ab_cd":
            out["normalise"] = "lower_dash_to_underscore"
    except Exception:
        pass
    return out


def describe_action(action: argparse.Action, aliases: list[str]) -> dict[str, Any]:
    kind = action_kind(action)
    nargs = action.nargs
    if kind in ("store_true", "store_false", "store_const", "append_const", "count", "help", "version", "boolean_optional"):
        takes_value = False
    else:
        takes_value = nargs != 0
    ok, default = _jsonable(action.default)
    entry: dict[str, Any] = {
        "option_strings": list(action.option_strings),
        "aliases": aliases,
        "dest": action.dest,
        "kind": kind,
        "action_class": _qualname(type(action)),
        "nargs": nargs,
        "takes_value": takes_value,
        "required": bool(action.required),
        "type": describe_type(action.type),
        "choices": None if action.choices is None else sorted({str(c) for c in action.choices}),
        "positional": not action.option_strings,
        "suppressed_help": action.help == argparse.SUPPRESS,
    }
    if ok:
        entry["default"] = default
    else:
        entry["default_repr"] = _stable_repr(action.default)
    if action.const is not None:
        okc, const = _jsonable(action.const)
        entry["const"] = const if okc else None
        if not okc:
            entry["const_repr"] = _stable_repr(action.const)
    if action.metavar is not None:
        entry["metavar"] = list(action.metavar) if isinstance(action.metavar, tuple) else action.metavar
    if getattr(action, "deprecated", False):
        entry["deprecated"] = True
    return entry


def describe_parser(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Return a JSON-able description of every action of ``parser``."""
    by_action: dict[int, list[str]] = {}
    for opt, act in parser._option_string_actions.items():
        by_action.setdefault(id(act), []).append(opt)
    actions = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        aliases = sorted(set(by_action.get(id(action), [])) | set(action.option_strings))
        actions.append(describe_action(action, aliases))
    groups = []
    for group in parser._mutually_exclusive_groups:
        groups.append(
            {
                "required": bool(group.required),
                "dests": [a.dest for a in group._group_actions],
            }
        )
    return {
        "class": _qualname(type(parser)),
        "allow_abbrev": bool(parser.allow_abbrev),
        "prefix_chars": parser.prefix_chars,
        "fromfile_prefix_chars": parser.fromfile_prefix_chars,
        "add_help": bool(parser.add_help),
        "actions": actions,
        "mutually_exclusive_groups": groups,
    }


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser, args: Any):
        super().__init__("parser captured")
        self.parser = parser
        self.args = args


@contextlib.contextmanager
def _capture_parse_args():
    """Make ArgumentParser.parse_args/parse_known_args raise _Captured(self)."""
    orig_pa = argparse.ArgumentParser.parse_args
    orig_pka = argparse.ArgumentParser.parse_known_args

    def pa(self, args=None, namespace=None):
        raise _Captured(self, args)

    def pka(self, args=None, namespace=None):
        raise _Captured(self, args)

    argparse.ArgumentParser.parse_args = pa  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = pka  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = orig_pa  # type: ignore[method-assign]
        argparse.ArgumentParser.parse_known_args = orig_pka  # type: ignore[method-assign]


def capture_parser(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[argparse.ArgumentParser, Any]:
    """Call a real entry point and return the parser it was about to parse with."""
    with _capture_parse_args():
        try:
            fn(*args, **kwargs)
        except _Captured as cap:
            return cap.parser, cap.args
    raise RuntimeError(f"{fn!r} returned without parsing arguments")


def scan_env_reads(package_dir: Path, prefixes: tuple[str, ...] | None = None) -> list[str]:
    names: set[str] = set()
    for path in package_dir.rglob("*.py"):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for m in _ENV_READ_RE.finditer(text):
            name = m.group(1)
            if prefixes is None or name.startswith(prefixes):
                names.add(name)
    return sorted(names)


def scan_extra_config_keys(paths: list[Path]) -> list[str]:
    keys: set[str] = set()
    for base in paths:
        files = [base] if base.is_file() else list(base.rglob("*.py"))
        for path in files:
            text = path.read_text(encoding="utf-8", errors="replace")
            for rx in _EXTRA_KEY_RES:
                keys.update(rx.findall(text))
    return sorted(keys)


def _literal_choices(annotation: Any) -> list[str] | None:
    """Flatten (Optional/Union/Annotated of) Literal[...] into its values."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        out: list[str] = []
        for a in args:
            sub = _literal_choices(a)
            out.extend(sub if sub is not None else [a])
        return [str(x) for x in out]
    if origin is typing.Annotated:
        return _literal_choices(args[0])
    if args and origin is not None and (origin is typing.Union or str(origin) == "<class 'types.UnionType'>"):
        collected: list[str] = []
        found = False
        for a in args:
            if a is type(None):
                continue
            sub = _literal_choices(a)
            if sub is None:
                return None
            found = True
            collected.extend(sub)
        return collected if found else None
    return None


def describe_config_dataclass(cls: Any) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # pragma: no cover - depends on engine internals
        hints = {}
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        ann = hints.get(f.name, f.type)
        info: dict[str, Any] = {"annotation": _stable_repr(ann) if not isinstance(ann, str) else ann}
        lits = _literal_choices(ann)
        if lits is not None:
            info["literal"] = lits
        if f.default is not dataclasses.MISSING:
            ok, d = _jsonable(f.default)
            if ok:
                info["default"] = d
            else:
                info["default_repr"] = _stable_repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            info["default_factory"] = _stable_repr(_qualname(f.default_factory))
        else:
            info["required"] = True
        fields[f.name] = info
    pyd = getattr(cls, "__pydantic_config__", None) or {}
    return {
        "class": _qualname(cls),
        "extra": pyd.get("extra") if isinstance(pyd, dict) else None,
        "fields": fields,
    }


def _header(component: str, entry_point: dict[str, Any]) -> dict[str, Any]:
    dist = DISTRIBUTIONS[component]
    installed = importlib.metadata.version(dist)
    pin = PINS[component]
    if installed != pin:
        raise SystemExit(f"{component}: installed {dist}=={installed} but the pin is {pin}; "
                         f"install the pinned version into this venv first")
    return {
        "schema_version": SCHEMA_VERSION,
        "component": component,
        "version": installed,
        "distribution": dist,
        "extracted_at": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "python_version": platform.python_version(),
        "entry_point": entry_point,
    }


def _console_scripts(dist: str) -> dict[str, str]:
    eps = importlib.metadata.distribution(dist).entry_points
    return {ep.name: ep.value for ep in eps if ep.group == "console_scripts"}


# --------------------------------------------------------------------------
# vLLM
# --------------------------------------------------------------------------


def extract_vllm() -> dict[str, Any]:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    import vllm  # noqa: F401
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # Build the parser the way `vllm serve` does: a FlexibleArgumentParser
    # top-level parser whose "serve" sub-parser is filled by make_arg_parser.
    top = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = top.add_subparsers(required=False, dest="subparser")
    serve = subparsers.add_parser("serve", usage="vllm serve [model_tag] [options]")
    serve = make_arg_parser(serve)
    desc = describe_parser(serve)
    desc["argv_preprocessor"] = "vllm-flexible"

    header = _header(
        "vllm",
        {
            "parser": "vllm.entrypoints.common.cli_args.make_arg_parser",
            "parser_class": "vllm.utils.argparse_utils.FlexibleArgumentParser",
            "console_scripts": _console_scripts("vllm"),
            "commands": [["vllm", "serve"]],
            "deprecated_commands": [["python", "-m", "vllm.entrypoints.openai.api_server"]],
            "note": "The serve sub-parser of the `vllm` CLI; `python -m "
            "vllm.entrypoints.openai.api_server` builds the same parser "
            "(make_arg_parser) on a top-level FlexibleArgumentParser but warns it is deprecated.",
        },
    )

    # ---- KVTransferConfig
    from vllm.config import kv_transfer as kvt
    from vllm.engine.arg_utils import _compute_kwargs  # type: ignore[attr-defined]

    kv_desc = describe_config_dataclass(kvt.KVTransferConfig)
    kv_role_choices = [str(x) for x in _literal_choices(kvt.KVRole) or []]
    kv_role_choices = sorted(set(kv_role_choices), key=kv_role_choices.index)
    failure_policy = kv_desc["fields"].get("kv_load_failure_policy", {}).get("literal")

    # Probe the real --kv-transfer-config type function for parse-time rules.
    kv_action = next(a for a in serve._actions if a.dest == "kv_transfer_config")
    probes = {
        "connector_without_role": '{"kv_connector":"NixlConnector"}',
        "unknown_key": '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_rank":0}',
        "bad_role": '{"kv_connector":"NixlConnector","kv_role":"both"}',
        "bad_failure_policy": '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_load_failure_policy":"retry"}',
        "unknown_connector_name": '{"kv_connector":"NoSuchConnector","kv_role":"kv_both"}',
        "ok_nixl_both": '{"kv_connector":"NixlConnector","kv_role":"kv_both"}',
        "ok_human_readable": '{"kv_connector":"OffloadingConnector","kv_role":"kv_both",'
        '"kv_connector_extra_config":{"cpu_bytes_to_use":80m}}',
    }
    probe_results: dict[str, str] = {}
    for name, text in probes.items():
        try:
            kv_action.type(text)
            probe_results[name] = "accepted"
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            probe_results[name] = f"rejected: {type(exc).__name__}"

    # ---- every JSON-dataclass flag's schema (field names, literals, extra policy)
    dataclass_schemas: dict[str, Any] = {}
    for action in serve._actions:
        t = describe_type(action.type)
        inner = t.get("inner", t)
        if inner.get("kind") == "json_dataclass" and action.type is not None:
            fn = action.type
            try:
                fn = inspect.getclosurevars(fn).nonlocals.get("return_type", fn)
            except (TypeError, ValueError):
                pass
            cls = (getattr(fn, "__defaults__", None) or (None,))[0]
            if cls is not None and dataclasses.is_dataclass(cls):
                dataclass_schemas[_qualname(cls)] = describe_config_dataclass(cls)
    del _compute_kwargs

    # ---- KV connector registry
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    site = Path(vllm.__file__).resolve().parent.parent
    connectors: dict[str, Any] = {}
    for name, loader in sorted(KVConnectorFactory._registry.items()):
        try:
            nl = inspect.getclosurevars(loader).nonlocals
        except (TypeError, ValueError):
            nl = {}
        module_path = nl.get("module_path")
        entry: dict[str, Any] = {"module": module_path, "class": nl.get("class_name")}
        if module_path:
            files = _connector_source_files(module_path)
            if files:
                entry["source"] = sorted(str(f.relative_to(site)) for f in files)
                entry["extra_config_keys_in_source"] = scan_extra_config_keys(files)
                env_used: set[str] = set()
                for f in files:
                    text = f.read_text(encoding="utf-8", errors="replace")
                    env_used |= set(_ENV_READ_RE.findall(text))
                    env_used |= set(re.findall(r"envs\.(VLLM_[A-Z0-9_]+)", text))
                entry["env_vars_in_source"] = sorted(env_used)
        connectors[name] = entry

    # ---- env vars
    import vllm.envs as venvs

    declared = sorted(venvs.environment_variables.keys())
    in_source = scan_env_reads(Path(vllm.__file__).resolve().parent)

    flexible_probe = _probe_vllm_flexible(FlexibleArgumentParser, make_arg_parser)

    return {
        **header,
        "parser": desc,
        "facts": {
            "kv_transfer_config": {
                **kv_desc,
                "kv_role_choices": kv_role_choices,
                "kv_load_failure_policy_choices": failure_policy,
                "parse_time_probes": probe_results,
            },
            "config_dataclasses": dataclass_schemas,
            "kv_connectors": connectors,
            "env_vars": declared,
            "env_vars_in_source": in_source,
            "flexible_parser_probes": flexible_probe,
        },
    }



def _connector_source_files(module_path: str) -> list[Path]:
    """Source files that make up one KV connector (heuristic).

    A package (``.../v1/nixl``) is scanned recursively; a module inside a
    per-connector directory (``.../v1/moriio/moriio_connector.py``) brings the
    sibling files of that directory; a lone module directly in ``v1/`` is
    scanned alone.
    """
    spec = importlib.util.find_spec(module_path)
    if spec is None or not spec.origin:
        return []
    origin = Path(spec.origin)
    if origin.name == "__init__.py":
        return sorted(origin.parent.rglob("*.py"))
    if origin.parent.name == "v1":
        return [origin]
    return sorted(origin.parent.glob("*.py"))


def _probe_vllm_flexible(FlexibleArgumentParser: Any, make_arg_parser: Any) -> dict[str, str]:
    """Run a few argv through the real `vllm serve` parser and record outcomes."""

    def build():
        top = FlexibleArgumentParser(description="vLLM CLI")
        sp = top.add_subparsers(required=False, dest="subparser")
        make_arg_parser(sp.add_parser("serve"))
        return top

    cases = VLLM_PROBE_CASES
    out: dict[str, str] = {}
    for name, argv in cases.items():
        parser = build()
        try:
            with contextlib.redirect_stderr(open(os.devnull, "w")):
                ns = parser.parse_args(list(argv))
            out[name] = "accepted" + (f" model_tag={ns.model_tag!r} model={ns.model!r}" if hasattr(ns, "model") else "")
        except SystemExit:
            out[name] = "rejected"
        except Exception as exc:  # ValueError raised by FlexibleArgumentParser itself
            out[name] = f"rejected: {type(exc).__name__}"
    return out


VLLM_PROBE_CASES: dict[str, list[str]] = {
    "positional_model": ["serve", "Qwen/Qwen3-32B", "--port", "8000"],
    "model_flag": ["serve", "--model", "Qwen/Qwen3-32B", "--port", "8000"],
    "model_flag_eq": ["serve", "--port", "8000", "--model=Qwen/Qwen3-32B"],
    "underscore_flag": ["serve", "m", "--tensor_parallel_size", "2", "--max_model_len=4096"],
    "served_name_without_model": ["serve", "--port", "8000", "--served-model-name", "x"],
    "dotted_kv_transfer": ["serve", "m", "--kv-transfer-config.kv_connector", "NixlConnector",
                           "--kv-transfer-config.kv_role", "kv_both"],
    "json_kv_transfer": ["serve", "m", "--kv-transfer-config",
                         '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'],
    "json_kv_transfer_unknown_key": ["serve", "m", "--kv-transfer-config",
                                     '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_ip":"1.2.3.4"}'],
    "json_kv_transfer_no_role": ["serve", "m", "--kv-transfer-config", '{"kv_connector":"NixlConnector"}'],
    "abbreviation": ["serve", "m", "--gpu-memory-util", "0.9"],
    "optimization_level_short": ["serve", "m", "-O3"],
    "short_tp": ["serve", "m", "-tp", "4"],
    "watermark": ["serve", "m", "--watermark", "0.01"],
    "scheduler_reserve_full_isl": ["serve", "m", "--scheduler-reserve-full-isl"],
    "disable_log_requests": ["serve", "m", "--disable-log-requests"],
    "no_enable_prefix_caching": ["serve", "m", "--no-enable-prefix-caching"],
    "api_key_two_values": ["serve", "m", "--api-key", "a", "b"],
    "bad_choice": ["serve", "m", "--dtype", "float64x"],
    "unknown_flag": ["serve", "m", "--no-such-flag"],
    "max_model_len_human": ["serve", "m", "--max-model-len", "32k"],
    "max_model_len_auto": ["serve", "m", "--max-model-len", "auto"],
    "port_not_int": ["serve", "m", "--port", "eighty"],
}


# --------------------------------------------------------------------------
# SGLang
# --------------------------------------------------------------------------


def extract_sglang() -> dict[str, Any]:
    import sglang
    from sglang.srt import server_args as sa

    parser, _ = capture_parser(sa.prepare_server_args, ["--model-path", "dummy"])
    desc = describe_parser(parser)
    desc["argv_preprocessor"] = "sglang"

    header = _header(
        "sglang",
        {
            "parser": "sglang.srt.server_args.prepare_server_args -> "
            "ServerArgs.add_cli_args(argparse.ArgumentParser(prog='sglang serve'))",
            "parser_class": "argparse.ArgumentParser",
            "console_scripts": _console_scripts("sglang"),
            "commands": [
                ["python", "-m", "sglang.launch_server"],
                ["python3", "-m", "sglang.launch_server"],
                ["sglang", "serve"],
            ],
            "note": "`sglang serve` additionally accepts the model path as the first "
            "positional argument (rewritten to --model-path) and strips --model-type "
            "(sglang/cli/serve.py); `python -m sglang.launch_server` passes argv "
            "straight to prepare_server_args.",
        },
    )

    by_dest = {a["dest"]: a for a in desc["actions"]}
    pkg = Path(sglang.__file__).resolve().parent
    from sglang.srt import environ

    envs_declared: dict[str, Any] = {}
    for klass in type.mro(environ.Envs):
        for key, val in vars(klass).items():
            if isinstance(val, environ.EnvField) and key not in envs_declared:
                ok, d = _jsonable(getattr(val, "default", None))
                envs_declared[key] = {
                    "type": type(val).__name__,
                    **({"default": d} if ok else {"default_repr": _stable_repr(getattr(val, "default", None))}),
                }
    in_source = scan_env_reads(pkg)
    # also names used through the Envs registry, e.g. envs.SGLANG_FOO.get()
    for path in pkg.rglob("*.py"):
        in_source = sorted(set(in_source) | set(re.findall(r"envs\.(SGLANG_[A-Z0-9_]+)", path.read_text(errors="replace"))))

    from sglang.srt.arg_groups import choices as ch

    return {
        **header,
        "parser": desc,
        "facts": {
            "disaggregation_mode_choices": by_dest["disaggregation_mode"]["choices"],
            "disaggregation_transfer_backend_choices": by_dest["disaggregation_transfer_backend"]["choices"],
            "disaggregation_transfer_backend_choices_module": list(ch.DISAGG_TRANSFER_BACKEND_CHOICES),
            "disaggregation_flags": sorted(
                o for a in desc["actions"] for o in a["option_strings"] if "disagg" in o
            ),
            "env_vars": envs_declared,
            "env_vars_in_source": in_source,
        },
    }


# --------------------------------------------------------------------------
# Routers
# --------------------------------------------------------------------------


def _extract_router(component: str, module: str) -> dict[str, Any]:
    mod = importlib.import_module(module)
    parser, _ = capture_parser(mod.parse_router_args, [])
    desc = describe_parser(parser)
    desc["argv_preprocessor"] = "none"
    dist = DISTRIBUTIONS[component]
    scripts = _console_scripts(dist)
    pkg = module.split(".")[0]
    if component == "vllm-router":
        commands = [["vllm-router"], ["python", "-m", f"{pkg}.launch_router"], ["python3", "-m", f"{pkg}.launch_router"]]
    else:
        commands = [
            ["python", "-m", f"{pkg}.launch_router"],
            ["python3", "-m", f"{pkg}.launch_router"],
            ["smg", "launch"],
            ["sglang-router", "launch"],
            ["amg", "launch"],
            ["python", "-m", pkg, "launch"],
            ["python3", "-m", pkg, "launch"],
        ]
    header = _header(
        component,
        {
            "parser": f"{module}.parse_router_args",
            "parser_class": "argparse.ArgumentParser",
            "console_scripts": scripts,
            "commands": commands,
        },
    )
    by_dest = {a["dest"]: a for a in desc["actions"]}
    facts: dict[str, Any] = {
        "policy_choices": by_dest["policy"]["choices"],
        "prefill_policy_choices": by_dest["prefill_policy"]["choices"],
        "decode_policy_choices": by_dest["decode_policy"]["choices"],
    }
    if "kv_connector" in by_dest:
        facts["kv_connector_choices"] = by_dest["kv_connector"]["choices"]
    # from_cli_args hard-codes the bootstrap-port annotation (no CLI flag)
    ra = importlib.import_module(f"{pkg}.router_args")
    src = inspect.getsource(ra.RouterArgs.from_cli_args)
    m = re.search(r'args_dict\["bootstrap_port_annotation"\]\s*=\s*"([^"]+)"', src)
    facts["bootstrap_port_annotation_hardcoded"] = m.group(1) if m else None
    facts["has_bootstrap_port_annotation_flag"] = any(
        "--bootstrap-port-annotation" in a["aliases"] for a in desc["actions"]
    )
    return {**header, "parser": desc, "facts": facts}


def extract_vllm_router() -> dict[str, Any]:
    return _extract_router("vllm-router", "vllm_router.launch_router")


def extract_sglang_router() -> dict[str, Any]:
    return _extract_router("sglang-router", "sglang_router.launch_router")


EXTRACTORS: dict[str, Callable[[], dict[str, Any]]] = {
    "vllm": extract_vllm,
    "sglang": extract_sglang,
    "vllm-router": extract_vllm_router,
    "sglang-router": extract_sglang_router,
}


def snapshot_filename(component: str, version: str) -> str:
    return f"{component}-{version}.json"


def _dump(obj: Any, indent: int = 0, one_line: bool = False) -> str:
    """JSON with one argparse action per line and short containers inlined,
    so that re-extraction diffs stay readable."""
    compact = json.dumps(obj, ensure_ascii=False)
    if one_line or not isinstance(obj, (dict, list)) or len(compact) <= 100:
        return compact
    pad = " " * (indent + 1)
    if isinstance(obj, list):
        items = [_dump(v, indent + 1) for v in obj]
        return "[\n" + ",\n".join(pad + i for i in items) + "\n" + " " * indent + "]"
    items = []
    for k, v in obj.items():
        if k == "actions" and isinstance(v, list):
            inner = ",\n".join(pad + " " + _dump(a, one_line=True) for a in v)
            items.append(f"{pad}{json.dumps(k)}: [\n{inner}\n{pad}]")
        else:
            items.append(f"{pad}{json.dumps(k)}: {_dump(v, indent + 1)}")
    return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"


def write_snapshot(data: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / snapshot_filename(data["component"], data["version"])
    path.write_text(_dump(data) + "\n", encoding="utf-8")
    return path


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def source_entry(component: str, version: str, site: Path, snapshot: Path) -> dict[str, Any]:
    """What SOURCES_MANIFEST says of one extraction: the version, the snapshot
    written and its sha256, and the sha256 of each of PARSER_SOURCES under
    ``site`` (the site-packages the extraction imported from)."""
    return {
        "version": version,
        "snapshot": snapshot.name,
        "snapshot_sha256": sha256_file(snapshot),
        "sources": {rel: sha256_file(site / rel) for rel in PARSER_SOURCES[component]},
    }


def write_source_entry(component: str, entry: dict[str, Any], manifest: Path) -> None:
    data = json.loads(manifest.read_text()) if manifest.exists() else {}
    data[component] = entry
    manifest.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def installed_site(component: str) -> Path:
    """The site-packages directory the component is imported from."""
    top = PARSER_SOURCES[component][0].split("/")[0]
    spec = importlib.util.find_spec(top)
    assert spec is not None and spec.origin, top
    return Path(spec.origin).resolve().parent.parent


# --------------------------------------------------------------------------
# Probe mode: ask the live parser whether it accepts argument lists
# --------------------------------------------------------------------------


def live_parser(component: str) -> tuple[Callable[[list[str]], Any], str]:
    """Return (parse(args) -> namespace, version) using the real parser.

    Only the argparse step is run (plus vLLM's FlexibleArgumentParser argv
    rewriting); post-parse validation such as ServerArgs.__post_init__ is not.
    """
    version = importlib.metadata.version(DISTRIBUTIONS[component])
    if component == "vllm":
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        from vllm.entrypoints.common.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        def parse(args: list[str]) -> Any:
            top = FlexibleArgumentParser(description="vLLM CLI")
            sp = top.add_subparsers(required=False, dest="subparser")
            make_arg_parser(sp.add_parser("serve"))
            return top.parse_args(["serve", *args])

        return parse, version
    if component == "sglang":
        from sglang.srt import server_args as sa

        parser, _ = capture_parser(sa.prepare_server_args, ["--model-path", "dummy"])
    else:
        mod = importlib.import_module(
            "vllm_router.launch_router" if component == "vllm-router" else "sglang_router.launch_router"
        )
        parser, _ = capture_parser(mod.parse_router_args, [])

    def parse_plain(args: list[str]) -> Any:
        return argparse.ArgumentParser.parse_args(parser, args)

    return parse_plain, version


def probe(component: str, cases: list[list[str]]) -> list[str]:
    parse, _ = live_parser(component)
    out = []
    for args in cases:
        try:
            with contextlib.redirect_stderr(open(os.devnull, "w")), contextlib.redirect_stdout(open(os.devnull, "w")):
                parse(list(args))
            out.append("accepted")
        except SystemExit as exc:
            out.append("accepted" if exc.code == 0 else "rejected")
        except Exception as exc:  # e.g. ValueError from FlexibleArgumentParser
            out.append(f"rejected: {type(exc).__name__}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("components", nargs="+", choices=sorted(EXTRACTORS))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--probe", type=Path, default=None,
                    help="JSON file with a list of argument lists; print the live parser's "
                    "verdict for each as a JSON list instead of extracting")
    ns = ap.parse_args(argv)
    if ns.probe is not None:
        cases = json.loads(ns.probe.read_text())
        results = {comp: probe(comp, cases[comp] if isinstance(cases, dict) else cases) for comp in ns.components}
        print(json.dumps(results))
        return 0
    manifest = SOURCES_MANIFEST if ns.out == DEFAULT_OUT else ns.out / SOURCES_MANIFEST.name
    for comp in ns.components:
        data = EXTRACTORS[comp]()
        path = write_snapshot(data, ns.out)
        write_source_entry(comp, source_entry(comp, data["version"], installed_site(comp), path), manifest)
        print(f"{comp} {data['version']}: {len(data['parser']['actions'])} actions -> {path} (sources: {manifest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
