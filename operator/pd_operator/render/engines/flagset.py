"""Contract tier: check rendered command lines against real-parser snapshots.

The JSON files in ``flagsets/`` (``<component>-<version>.json``) were
extracted from the real argument parsers of the pinned engine and router
versions by ``tests/contract/extract_flagsets.py``.  This module rebuilds an
``argparse`` parser from a snapshot and parses a command line with it, so a
renderer test can prove that every flag it emits exists in that version,
that each flag gets the number of values it needs, and that values with a
fixed set of choices are among them -- without installing vLLM or SGLang.

It is pure stdlib and never imports an engine.

Emulated behaviour of the real parsers
--------------------------------------
* all option strings a parser registers, including hidden aliases
  (``--no-enable-prefix-caching``, ``--disable-log-requests``);
* argparse prefix abbreviations when the real parser allows them (all four
  do); ``check_argv`` refuses abbreviations unless ``allow_abbrev=None`` is
  passed, because the real behaviour is a trap (SGLang reads ``--prefill-only``
  as ``--prefill-only-disable-kv-cache``);
* ``nargs`` (``?``, ``*``, ``+``, N), ``append`` actions, required options;
* value conversion for ``int``, ``float``, JSON, each engine's human-readable
  ints (``32k``; SGLang's with its SI and IEC suffixes) and vLLM's JSON config dataclasses (unknown keys are refused when
  the dataclass forbids extras, ``Literal`` fields are checked, and
  ``kv_connector`` without ``kv_role`` is refused as vLLM does at parse time);
* ``choices`` after conversion;
* vLLM's ``FlexibleArgumentParser`` argv rewriting: ``--foo_bar`` ==
  ``--foo-bar`` (underscores become dashes in the flag name up to the first
  ``.``), ``--model X`` moved to the positional model for ``vllm serve``,
  ``--served-model-name`` without a positional model refused, dotted JSON keys
  (``--kv-transfer-config.kv_role kv_both``, ``--x.list+ a,b``), ``-O3`` ->
  ``--optimization-level 3``;
* ``sglang serve MODEL`` (positional model path, ``--model-type`` stripped)
  and ``smg launch`` / ``sglang-router launch`` sub-commands.

Not emulated: reading ``--config`` YAML files; checks that run after parsing
(``validate_parsed_serve_args``, ``ServerArgs.__post_init__``,
``RouterArgs._validate_router_args``).  ``check_argv`` adds one deliberate
post-parse check for vLLM: the ``kv_connector`` named in
``--kv-transfer-config`` must be registered in that version (vLLM itself only
fails on that when the engine starts).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any, Sequence

__all__ = [
    "FLAGSET_DIR",
    "FlagError",
    "SnapshotNotFound",
    "available_snapshots",
    "build_parser",
    "check_argv",
    "check_kv_transfer_config",
    "connector_extra_config_keys",
    "describe",
    "env_vars",
    "flag_choices",
    "flag_info",
    "has_flag",
    "known_connectors",
    "known_env",
    "kv_load_failure_policies",
    "kv_roles",
    "kv_transfer_fields",
    "load_snapshot",
    "split_command",
]

FLAGSET_DIR = Path(__file__).resolve().parent / "flagsets"

_ZERO_ARG_KINDS = frozenset(
    {"store_true", "store_false", "store_const", "append_const", "count", "help", "version", "boolean_optional"}
)


class FlagError(ValueError):
    """A command line that the pinned component's real parser would refuse."""

    def __init__(self, component: str, version: str, reason: str, flag: str | None = None):
        self.component = component
        self.version = version
        self.reason = reason
        self.flag = flag
        super().__init__(f"{component} {version}: {reason}" if not reason.startswith(f"{component} {version}") else reason)


class SnapshotNotFound(LookupError):
    """No committed flag-set snapshot for this component/version."""


# --------------------------------------------------------------------------
# Snapshot loading
# --------------------------------------------------------------------------


def available_snapshots() -> list[tuple[str, str]]:
    out = []
    for path in sorted(FLAGSET_DIR.glob("*.json")):
        data = _read(path)
        out.append((data["component"], data["version"]))
    return out


def _read(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as fh:
        return json.load(fh)


@functools.lru_cache(maxsize=None)
def load_snapshot(component: str, version: str) -> dict[str, Any]:
    path = FLAGSET_DIR / f"{component}-{version}.json"
    if not path.is_file():
        have = ", ".join(f"{c} {v}" for c, v in available_snapshots()) or "none"
        raise SnapshotNotFound(f"no flag-set snapshot for {component} {version} (have: {have})")
    data = _read(path)
    if data.get("component") != component or data.get("version") != version:
        raise SnapshotNotFound(f"{path.name} describes {data.get('component')} {data.get('version')}")
    return data


def _actions(component: str, version: str) -> list[dict[str, Any]]:
    return load_snapshot(component, version)["parser"]["actions"]


def _facts(component: str, version: str) -> dict[str, Any]:
    return load_snapshot(component, version).get("facts", {})


# --------------------------------------------------------------------------
# Value conversion (emulates the real ``type=`` callables)
# --------------------------------------------------------------------------

_JSON_BARE_HR = re.compile(r"\b\d+(?:\.\d+)?[kKmMgGtT]\b")
_JSON_STRING = re.compile(r'("(?:[^"\\]|\\.)*")')

# Each engine's ``human_readable_int``: (suffixes, decimal ones, binary ones, a decimal one's
# arithmetic, the refusal). vLLM (vllm/utils/argparse_utils.py): lower case decimal, capitals
# binary. SGLang (sglang/srt/utils/common.py): case-sensitive SI (k, M, G, T) and IEC (Ki, Mi,
# Gi, Ti) suffixes, so 1M is 10^6 there and 2^20 in vLLM.
_READABLE = {
    "vllm": (re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])"),
             {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}, {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40},
             lambda number, scale: int(float(number) * scale), "invalid human-readable int value: {!r}"),
    "sglang": (re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)"),
               {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}, {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40},
               lambda number, scale: int(Decimal(number) * scale),
               "invalid integer value: {!r} (a plain integer, SI suffixes 1k, 1M or IEC suffixes 1Ki, 1Mi; "
               "case-sensitive)"),
}


def _human_readable_int(text: str, engine: str = "vllm") -> int:
    pattern, decimal, binary, scaled, refusal = _READABLE[engine]
    text = text.strip()
    m = pattern.fullmatch(text)
    if m:
        number, suffix = m.groups()
        if suffix in decimal:
            return scaled(number, decimal[suffix])
        if "." in number:
            raise argparse.ArgumentTypeError(f"decimals are not allowed with binary suffix {suffix}")
        return int(number) * binary[suffix]
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(refusal.format(text)) from None


def _expand_json_numbers(text: str) -> str:
    parts = _JSON_STRING.split(text)
    for i in range(0, len(parts), 2):
        parts[i] = _JSON_BARE_HR.sub(lambda m: str(_human_readable_int(m.group())), parts[i])
    return "".join(parts)


class _Converter:
    """Callable used as ``type=`` in the rebuilt parser."""

    def __init__(self, component: str, version: str, entry: dict[str, Any]):
        self.component = component
        self.version = version
        self.entry = entry
        self.type = entry.get("type") or {"kind": "none"}
        self.choices = entry.get("choices")
        # argparse reports "invalid <__name__> value" on ValueError/TypeError
        self.__name__ = self.type.get("kind", "str")

    def __call__(self, text: str) -> Any:
        value = self._convert(self.type, text)
        if self.choices is not None and str(value) not in self.choices:
            raise argparse.ArgumentTypeError(
                f"invalid choice: {text!r} (choose from {', '.join(self.choices)})"
            )
        return value

    def _convert(self, t: dict[str, Any], text: str) -> Any:
        kind = t.get("kind", "none")
        if kind == "optional":
            if text in ("", "None"):
                return None
            return self._convert(t.get("inner") or {"kind": "none"}, text)
        if kind == "int":
            try:
                return int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if kind == "float":
            try:
                return float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
        engine = "sglang" if self.component == "sglang" else "vllm"
        if kind == "human_readable_int":
            return _human_readable_int(text, engine)
        if kind == "human_readable_int_or_auto":
            if text.strip() == "-1" or text.strip().lower() == "auto":
                return -1
            return _human_readable_int(text, engine)
        if kind == "json":
            try:
                return json.loads(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(f"invalid JSON value {text!r}: {exc}") from None
        if kind == "json_or_str":
            if not re.match(r"(?s)^\s*{.*}\s*$", text):
                return text
            if text in ("", "None"):
                return None
            try:
                return json.loads(text)
            except ValueError as exc:
                raise argparse.ArgumentTypeError(f"invalid JSON value {text!r}: {exc}") from None
        if kind == "json_dataclass":
            return self._dataclass(t.get("class"), text)
        if kind == "callable" and t.get("normalise") == "lower_dash_to_underscore":
            return text.lower().replace("-", "_")
        # str, none, class, callable: accepted as given
        return text

    def _dataclass(self, cls_name: str | None, text: str) -> Any:
        try:
            value = json.loads(_expand_json_numbers(text))
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise argparse.ArgumentTypeError(f"invalid JSON value {text!r}: {exc}") from None
        schema = _facts(self.component, self.version).get("config_dataclasses", {}).get(cls_name or "")
        short = (cls_name or "config").rsplit(".", 1)[-1]
        if schema is None:
            return value
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{short} must be a JSON object, got {text!r}")
        fields = schema.get("fields", {})
        if schema.get("extra") == "forbid":
            unknown = sorted(set(value) - set(fields))
            if unknown:
                raise argparse.ArgumentTypeError(
                    f"{short} has no field(s) {', '.join(unknown)} (fields: {', '.join(fields)})"
                )
        for name, val in value.items():
            info = fields.get(name) or {}
            problem = _annotation_problem(info.get("annotation", ""), val)
            if problem and info.get("literal") is None:
                raise argparse.ArgumentTypeError(f"{short}.{name}={val!r}: {problem}")
            lits = info.get("literal")
            if lits is not None and val is not None and str(val) not in lits:
                raise argparse.ArgumentTypeError(
                    f"{short}.{name}={val!r} is not one of {', '.join(lits)}"
                )
            if lits is not None and val is None and not re.search(r"None|Optional", info.get("annotation", "")):
                raise argparse.ArgumentTypeError(f"{short}.{name} may not be null")
        if short == "KVTransferConfig":
            probes = _facts(self.component, self.version).get("kv_transfer_config", {}).get("parse_time_probes", {})
            if str(probes.get("connector_without_role", "")).startswith("rejected"):
                if value.get("kv_connector") is not None and value.get("kv_role") is None:
                    raise argparse.ArgumentTypeError(
                        "KVTransferConfig: kv_role is required when kv_connector is set "
                        f"(one of {', '.join(kv_roles(self.version))})"
                    )
        return value


_CLASS_RE = re.compile(r"^<class '([\w.]+)'>$")
_LAX_BOOL = {"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"}


def _split_union(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[("
        depth -= ch in "])"
        if ch == "|" and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return [p for p in parts if p]


def _annotation_problem(annotation: str, value: Any) -> str | None:
    """Rough pydantic (lax, JSON input) check of one dataclass field value.

    Handles int/float/bool/str/dict/list and their unions with None; any
    other annotation is accepted without a check.
    """
    if not annotation:
        return None
    text = annotation.strip()
    m = re.fullmatch(r"typing\.Optional\[(.*)\]", text)
    parts = (_split_union(m.group(1)) + ["None"]) if m else _split_union(text)
    kinds = []
    for part in parts:
        cm = _CLASS_RE.match(part)
        name = cm.group(1) if cm else part
        name = name.split("[", 1)[0].replace("typing.", "").lower()
        if name in ("none", "nonetype"):
            kinds.append("none")
        elif name in ("int", "float", "bool", "str", "dict", "list"):
            kinds.append(name)
        else:
            return None  # unknown member: do not guess
    ok = {
        "none": lambda v: v is None,
        "int": lambda v: (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
        or (isinstance(v, str) and re.fullmatch(r"\s*[+-]?\d+\s*", v) is not None),
        "float": lambda v: (isinstance(v, (int, float)) and not isinstance(v, bool))
        or (isinstance(v, str) and re.fullmatch(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*", v) is not None),
        "bool": lambda v: isinstance(v, bool) or v in (0, 1) or (isinstance(v, str) and v.lower() in _LAX_BOOL),
        "str": lambda v: isinstance(v, str),
        "dict": lambda v: isinstance(v, dict),
        "list": lambda v: isinstance(v, list),
    }
    if any(ok[k](value) for k in kinds):
        return None
    return f"expected {' or '.join(kinds)}"


# --------------------------------------------------------------------------
# Parser rebuild
# --------------------------------------------------------------------------


class _SnapshotParser(argparse.ArgumentParser):
    def __init__(self, component: str, version: str, **kwargs: Any):
        self._component = component
        self._version = version
        super().__init__(add_help=False, exit_on_error=False, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        raise _to_flag_error(self._component, self._version, message)

    def exit(self, status: int = 0, message: str | None = None):  # type: ignore[override]
        raise FlagError(self._component, self._version, message or f"parser exited with status {status}")


_ARG_RE = re.compile(r"^argument (?P<flag>[^:]+): (?P<msg>.*)$", re.S)


def _to_flag_error(component: str, version: str, message: str) -> FlagError:
    if message.startswith("unrecognized arguments: "):
        raw = message[len("unrecognized arguments: "):]
        rest = raw.split()
        flags = [a for a in rest if a.startswith("-") and not _looks_negative_number(a)]
        if flags:
            flag = flags[0].split("=", 1)[0]
            return FlagError(component, version, f"{component} {version} has no flag {flag}", flag=flag)
        if not rest:  # an empty or blank argument: argparse joins it into nothing
            return FlagError(component, version, f"{component} {version}: unexpected empty argument {raw!r}: "
                             "remove it", flag=None)
        return FlagError(
            component, version, f"{component} {version}: unexpected positional argument {rest[0]!r}", flag=None
        )
    m = _ARG_RE.match(message)
    if m:
        flag = m.group("flag")  # "--a/--b" for aliases; check_argv picks the one used
        msg = m.group("msg")
        if msg.startswith("expected"):
            return FlagError(component, version, f"flag {flag} {msg.replace('expected', 'needs')}", flag=flag)
        if msg.startswith("ambiguous option"):
            return FlagError(component, version, f"{msg}", flag=flag)
        return FlagError(component, version, f"bad value for {flag}: {msg}", flag=flag)
    if message.startswith("ambiguous option: "):
        flag = message[len("ambiguous option: "):].split()[0].split("=", 1)[0]
        return FlagError(component, version, message, flag=flag)
    return FlagError(component, version, message)


def _name_used_alias(err: FlagError, args: Sequence[str]) -> FlagError:
    """Report the spelling the command line used (argparse names the first alias)."""
    if not err.flag or "/" not in err.flag:
        return err
    names = err.flag.split("/")
    used = next((n for n in names for a in args if a == n or a.startswith(n + "=")), names[0])
    reason = err.reason.replace(err.flag, used)
    return FlagError(err.component, err.version, reason, flag=used)


def _looks_negative_number(text: str) -> bool:
    return bool(re.fullmatch(r"-\d+$|-\d*\.\d+$", text))


def build_parser(component: str, version: str, *, allow_abbrev: bool | None = None) -> argparse.ArgumentParser:
    """An argparse parser equivalent (for checking) to the real one."""
    snap = load_snapshot(component, version)
    meta = snap["parser"]
    if allow_abbrev is None:
        allow_abbrev = bool(meta.get("allow_abbrev", True))
    parser = _SnapshotParser(
        component,
        version,
        prog=f"{component} {version}",
        allow_abbrev=allow_abbrev,
        prefix_chars=meta.get("prefix_chars", "-"),
    )
    by_dest_group: dict[str, Any] = {}
    groups = []
    for g in meta.get("mutually_exclusive_groups", []):
        grp = parser.add_mutually_exclusive_group(required=g.get("required", False))
        groups.append(grp)
        for d in g["dests"]:
            by_dest_group[d] = grp
    for entry in meta["actions"]:
        target = by_dest_group.get(entry["dest"], parser)
        _add_action(target, component, version, entry)
    return parser


def _add_action(target: Any, component: str, version: str, entry: dict[str, Any]) -> None:
    kind = entry["kind"]
    names = list(entry.get("aliases") or entry["option_strings"])
    if entry.get("positional"):
        kwargs: dict[str, Any] = {"type": _Converter(component, version, entry), "default": None}
        if entry.get("nargs") is not None:
            kwargs["nargs"] = entry["nargs"]
        target.add_argument(entry["dest"], **kwargs)
        return
    if kind == "boolean_optional":
        # argparse.BooleanOptionalAction: --no-X stores False; vLLM's EnableDisableAction
        # (vllm/utils/argparse_utils.py) also --disable-X for --enable-X and the reverse
        first = entry["option_strings"][0]
        negative = {"--no-" + first[2:]}
        if entry.get("action_class", "").endswith("EnableDisableAction"):
            negative |= {to + first[len(fr):] for fr, to in (("--enable-", "--disable-"), ("--disable-", "--enable-"))
                         if first.startswith(fr)}
        neg = [n for n in names if n in negative or n.startswith("--no-")]
        pos = [n for n in names if n not in neg]
        target.add_argument(*pos, dest=entry["dest"], action="store_const", const=True, default=None)
        if neg:
            target.add_argument(*neg, dest=entry["dest"], action="store_const", const=False, default=None)
        return
    if kind in _ZERO_ARG_KINDS or not entry.get("takes_value", True):
        target.add_argument(*names, dest=entry["dest"], action="store_const", const=True, default=None,
                            required=entry.get("required", False))
        return
    kwargs = {
        "dest": entry["dest"],
        "action": "append" if kind in ("append", "extend") else "store",
        "type": _Converter(component, version, entry),
        "default": None,
        "required": entry.get("required", False),
    }
    nargs = entry.get("nargs")
    if nargs is not None:
        kwargs["nargs"] = nargs
        if nargs == "?":
            kwargs["const"] = entry.get("const")
    target.add_argument(*names, **kwargs)


@functools.lru_cache(maxsize=None)
def _cached_parser(component: str, version: str, allow_abbrev: bool | None) -> argparse.ArgumentParser:
    return build_parser(component, version, allow_abbrev=allow_abbrev)


# --------------------------------------------------------------------------
# Command prefixes and argv preprocessing
# --------------------------------------------------------------------------


def _commands(component: str, version: str) -> list[list[str]]:
    ep = load_snapshot(component, version).get("entry_point", {})
    cmds = list(ep.get("commands", [])) + list(ep.get("deprecated_commands", []))
    return sorted(cmds, key=len, reverse=True)


def split_command(component: str, version: str, argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``argv`` into (entry-point command, arguments).

    The command is one of the snapshot's known commands (e.g. ``vllm serve``,
    ``python -m sglang.launch_server``, ``vllm-router``); the executable may be
    given as a path (``/usr/bin/python3``).  If ``argv`` does not start with a
    known command the whole list is taken as arguments.
    """
    from ..launch import logical_argv

    argv = logical_argv(list(argv))
    for cmd in _commands(component, version):
        if len(argv) >= len(cmd):
            head = argv[: len(cmd)]
            if Path(head[0]).name == cmd[0] and head[1:] == cmd[1:]:
                return [*head], argv[len(cmd):]
    return [], argv


def _vllm_flexible(component: str, version: str, args: list[str], is_serve: bool) -> list[str]:
    """Rewrite argv the way vLLM's FlexibleArgumentParser.parse_args does."""
    args = list(args)
    if is_serve:
        model_idx = next((i for i, a in enumerate(args) if re.match(r"^--model(=.+|$)", a)), None)
        if model_idx is not None:
            if args[model_idx] == "--model":
                if model_idx + 1 >= len(args):
                    raise FlagError(component, version, "flag --model needs one argument", flag="--model")
                tag, rest = args[model_idx + 1], model_idx + 2
            else:
                tag, rest = args[model_idx][len("--model="):], model_idx + 1
            args = [tag, *args[:model_idx], *args[rest:]]
        if (
            args
            and args[0].startswith("-")
            and not any(re.match(r"^--config(=.+|$)", a) for a in args)
            and any(re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for a in args)
        ):
            raise FlagError(
                component, version,
                "`vllm serve` needs the model as the first positional argument when "
                "--served-model-name is given (vllm serve <model> --served-model-name ...)",
                flag="--served-model-name",
            )

    def dashes(key: str) -> str:
        # underscores -> dashes between the leading "--" and the first "."
        head, dot, tail = key[2:].partition(".")
        return "--" + head.replace("_", "-") + dot + tail

    processed: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            processed.append("--help")
        elif arg.startswith("--"):
            if "=" in arg:
                key, value = arg.split("=", 1)
                processed.append(f"{dashes(key)}={value}")
            else:
                processed.append(dashes(arg))
        elif arg.startswith("-O") and arg != "-O":
            processed += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            processed.append("--optimization-level")
        else:
            processed.append(arg)

    def merge(into: dict[str, Any], update: dict[str, Any]) -> None:
        for k, v in update.items():
            if isinstance(v, dict) and isinstance(into.get(k), dict):
                merge(into[k], v)
            elif isinstance(v, list) and isinstance(into.get(k), list):
                into[k] += v
            else:
                into[k] = v

    delete: set[int] = set()
    dict_args: dict[str, dict[str, Any]] = {}
    for i, parg in enumerate(processed):
        if i in delete:
            continue
        if parg.startswith("--") and "." not in parg:
            continue
        if parg.startswith("-") and "." in parg:
            if "=" in parg:
                parg, value_str = parg.split("=", 1)
                if "." not in parg:
                    continue
            else:
                if _looks_negative_number(parg):
                    raise FlagError(
                        component, version,
                        f"vLLM's FlexibleArgumentParser reads the negative decimal {parg!r} as a "
                        f"dotted JSON key and fails; write it as --flag={parg}", flag=parg)
                if i + 1 >= len(processed):
                    raise FlagError(component, version, f"flag {parg} needs a value", flag=parg)
                value_str = processed[i + 1]
                delete.add(i + 1)
            if parg.endswith("+"):
                parg = parg[:-1]
                value_str = json.dumps(value_str.split(","))
            key, *keys = parg.split(".")
            try:
                value: Any = json.loads(value_str)
            except ValueError:
                try:
                    value = _human_readable_int(value_str)
                except (ValueError, argparse.ArgumentTypeError):
                    value = value_str
            nested: Any = value
            for k in reversed(keys):
                nested = {k: nested}
            merge(dict_args.setdefault(key, {}), nested)
            delete.add(i)
    processed = [a for i, a in enumerate(processed) if i not in delete]
    for key, val in dict_args.items():
        processed += [key, json.dumps(val)]
    return processed


def _sglang_serve(args: list[str]) -> list[str]:
    """`sglang serve`: strip --model-type, positional model -> --model-path."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--model-type":
            i += 2
            continue
        if a.startswith("--model-type="):
            i += 1
            continue
        out.append(a)
        i += 1
    if out and not out[0].startswith("-"):
        out = ["--model-path", out[0], *out[1:]]
    return out


def _preprocess(component: str, version: str, command: list[str], args: list[str]) -> list[str]:
    pre = load_snapshot(component, version)["parser"].get("argv_preprocessor", "none")
    if pre == "vllm-flexible":
        # arguments-only argv is taken as `vllm serve` arguments
        is_serve = (not command) or command[-1] == "serve"
        return _vllm_flexible(component, version, args, is_serve)
    if pre == "sglang" and command[-1:] == ["serve"]:
        return _sglang_serve(args)
    return args


# --------------------------------------------------------------------------
# Public checks
# --------------------------------------------------------------------------


def check_argv(
    component: str,
    version: str,
    argv: Sequence[str],
    *,
    allow_abbrev: bool | None = False,
    check_connectors: bool = True,
) -> argparse.Namespace:
    """Parse ``argv`` as the pinned component would; raise FlagError if refused.

    ``argv`` may include the entry-point command (``["vllm", "serve", ...]``,
    ``["python3", "-m", "sglang.launch_server", ...]``) or be the arguments
    only; for vLLM, arguments-only is treated as ``vllm serve`` arguments.
    Returns the parsed namespace (values converted; unspecified options None).

    ``allow_abbrev`` defaults to False: a rendered command line must spell
    every flag in full.  The real parsers all accept unambiguous prefixes, and
    that is dangerous -- SGLang 0.5.23 silently reads the blog-post flag
    ``--prefill-only`` as ``--prefill-only-disable-kv-cache``.  Pass
    ``allow_abbrev=None`` to get exactly the real parser's behaviour.
    """
    if isinstance(argv, str):
        raise TypeError("argv must be a list of strings, not one string")
    command, args = split_command(component, version, argv)
    args = _preprocess(component, version, command, [str(a) for a in args])
    parser = _cached_parser(component, version, allow_abbrev)
    try:
        try:
            ns = parser.parse_args(args)
        except argparse.ArgumentError as exc:
            raise _to_flag_error(component, version, str(exc)) from None
    except FlagError as err:
        raise _name_used_alias(err, args) from None
    if component == "vllm" and check_connectors:
        kvt = getattr(ns, "kv_transfer_config", None)
        if isinstance(kvt, dict):
            check_kv_transfer_config(version, kvt)
    return ns


def flag_info(component: str, version: str, flag: str) -> dict[str, Any] | None:
    """The snapshot entry for an exact option string (or positional dest)."""
    for entry in _actions(component, version):
        if flag in entry.get("aliases", ()) or flag in entry["option_strings"]:
            return entry
        if entry.get("positional") and entry["dest"] == flag:
            return entry
    return None


def has_flag(component: str, version: str, flag: str) -> bool:
    """Whether the exact option string exists (no abbreviation, no normalisation)."""
    return flag_info(component, version, flag) is not None


def flag_choices(component: str, version: str, flag: str) -> list[str] | None:
    entry = flag_info(component, version, flag)
    if entry is None:
        raise FlagError(component, version, f"{component} {version} has no flag {flag}", flag=flag)
    return entry.get("choices")


def _vllm_facts(vllm_version: str) -> dict[str, Any]:
    return _facts("vllm", vllm_version)


def known_connectors(vllm_version: str) -> frozenset[str]:
    """Names registered in vLLM's KVConnectorFactory at that version."""
    return frozenset(_vllm_facts(vllm_version).get("kv_connectors", {}))


def kv_transfer_fields(vllm_version: str) -> frozenset[str]:
    """Field names of vLLM's KVTransferConfig (JSON keys of --kv-transfer-config)."""
    return frozenset(_vllm_facts(vllm_version)["kv_transfer_config"]["fields"])


def kv_roles(vllm_version: str) -> tuple[str, ...]:
    return tuple(_vllm_facts(vllm_version)["kv_transfer_config"]["kv_role_choices"])


def kv_load_failure_policies(vllm_version: str) -> tuple[str, ...]:
    return tuple(_vllm_facts(vllm_version)["kv_transfer_config"].get("kv_load_failure_policy_choices") or ())


def connector_extra_config_keys(vllm_version: str, connector: str) -> frozenset[str]:
    """kv_connector_extra_config keys the connector's source reads (found by a source scan)."""
    info = _vllm_facts(vllm_version).get("kv_connectors", {}).get(connector)
    if info is None:
        raise FlagError("vllm", vllm_version, _unknown_connector_msg(vllm_version, connector), flag=connector)
    return frozenset(info.get("extra_config_keys_in_source", ()))


def _unknown_connector_msg(vllm_version: str, name: str) -> str:
    known = sorted(known_connectors(vllm_version))
    same = [k for k in known if k.lower() == str(name).lower()]
    hint = f" (did you mean {same[0]}? names are case-sensitive)" if same else ""
    return f"vllm {vllm_version} has no KV connector {name!r}{hint}; registered: {', '.join(known)}"


def check_kv_transfer_config(
    vllm_version: str, config: dict[str, Any] | str, *, require_known_connector: bool = True
) -> dict[str, Any]:
    """Validate a --kv-transfer-config value (dict or JSON text); return it as a dict.

    Applies the parse-time rules (field names, kv_role and
    kv_load_failure_policy literals, kv_role required with a connector) and,
    unless ``require_known_connector`` is False or ``kv_connector_module_path``
    names an external module, that ``kv_connector`` (and every connector
    inside a ``MultiConnector``) is registered at this version.
    """
    text = config if isinstance(config, str) else json.dumps(config)
    entry = flag_info("vllm", vllm_version, "--kv-transfer-config")
    if entry is None:
        raise FlagError("vllm", vllm_version, f"vllm {vllm_version} has no flag --kv-transfer-config")
    try:
        value = _Converter("vllm", vllm_version, {**entry, "choices": None})(text)
    except argparse.ArgumentTypeError as exc:
        raise FlagError("vllm", vllm_version, f"bad value for --kv-transfer-config: {exc}",
                        flag="--kv-transfer-config") from None
    if not isinstance(value, dict):
        return value
    if require_known_connector and not value.get("kv_connector_module_path"):
        names = []
        if value.get("kv_connector") is not None:
            names.append(value["kv_connector"])
        if value.get("kv_connector") == "MultiConnector":
            for child in (value.get("kv_connector_extra_config") or {}).get("connectors", []) or []:
                if isinstance(child, dict) and child.get("kv_connector") is not None:
                    names.append(child["kv_connector"])
        known = known_connectors(vllm_version)
        for name in names:
            if name not in known:
                raise FlagError("vllm", vllm_version, _unknown_connector_msg(vllm_version, name),
                                flag="--kv-transfer-config")
    return value


def env_vars(component: str, version: str, *, declared_only: bool = False) -> frozenset[str]:
    """Environment variable names the component knows.

    ``declared``: the component's own registry (vLLM ``vllm.envs.environment_variables``,
    SGLang ``sglang.srt.environ.Envs``).  Otherwise also names read anywhere
    in its source (``os.getenv("X")``, ``os.environ["X"]``, ``envs.X``...).
    """
    facts = _facts(component, version)
    declared = facts.get("env_vars", ())
    names = set(declared)
    if not declared_only:
        names |= set(facts.get("env_vars_in_source", ()))
    return frozenset(names)


def known_env(component: str, version: str, name: str, *, declared_only: bool = False) -> bool:
    return name in env_vars(component, version, declared_only=declared_only)


def describe(component: str, version: str) -> str:
    """One-line summary, for error messages and debugging."""
    snap = load_snapshot(component, version)
    return (f"{component} {version}: {len(snap['parser']['actions'])} actions, "
            f"extracted {snap.get('extracted_at')} from {snap.get('entry_point', {}).get('parser')}")

