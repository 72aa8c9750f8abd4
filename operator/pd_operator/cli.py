"""``pdctl``: the pd-operator command line."""

from __future__ import annotations

import argparse
import sys

import yaml

from . import __version__
from .api import SpecError, validate_service


class _Dumper(yaml.SafeDumper):
    """Plain YAML: no anchors or aliases, even for repeated sub-objects."""

    def ignore_aliases(self, data):
        return True


def to_yaml(objs: list[dict]) -> str:
    return yaml.dump_all(objs, Dumper=_Dumper, sort_keys=False, width=1000)


def _load_documents(path: str) -> list | None:
    """The YAML documents of ``path`` (``-``: stdin), the items of a list (``kubectl get -o
    yaml`` of several objects is one ``List``) in its place; None, said on stderr, when
    unreadable."""
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except (OSError, yaml.YAMLError) as err:
        print(f"pdctl: cannot read {path}: {err}", file=sys.stderr)
        return None
    return [item for d in docs
            for item in (d.get("items") or [] if isinstance(d, dict) and str(d.get("kind", "")).endswith("List") else [d])]


def cmd_render(args: argparse.Namespace) -> int:
    from .render import render

    docs = _load_documents(args.file)
    if docs is None:
        return 2
    if not docs:
        print(f"pdctl: {args.file} holds no PDInferenceService", file=sys.stderr)
        return 2
    out: list[dict] = []
    failed = False
    for doc in docs:
        try:
            svc = validate_service(doc)
            if args.namespace and not svc.metadata.namespace:
                svc.metadata.namespace = args.namespace
            out += render(svc)
        except SpecError as err:
            print(f"pdctl: {err}", file=sys.stderr)
            failed = True
    if failed:
        return 1
    sys.stdout.write(to_yaml(out))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    docs = _load_documents(args.file)
    if docs is None:
        return 2
    status = 0
    for doc in docs:
        try:
            svc = validate_service(doc)
            from .render import render

            render(svc)
            print(f"{svc.metadata.name}: valid")
        except SpecError as err:
            print(f"pdctl: {err}", file=sys.stderr)
            status = 1
    return status


def cmd_doctor(args: argparse.Namespace) -> int:
    import os

    from .doctor import run

    return run(args.name, args.namespace, args.prometheus, os.environ.get("PDCTL_PROMETHEUS_TOKEN") or None)


# Commands that come with the tools distribution (``pip install 'pd-operator[tools]'``):
# each entry point of this group is a function ``add_parsers(subparsers)``.
TOOLS_GROUP = "pd_operator.pdctl"
TOOL_COMMANDS = {
    "crd": "print the CustomResourceDefinition generated from the API models",
    "chart": "write the Helm chart's generated files",
    "bench": "goodput benchmark against an OpenAI-compatible endpoint",
    "autoscale-bench": "autoscaling policies vs baselines on reference traces (simulated)",
    "simulate": "predicted goodput and GPU-hours of an autoscaling policy edit",
}


def _needs_tools(args: argparse.Namespace) -> int:
    print(f"pdctl {args.command}: this command is part of the pd-operator tools; "
          "install them with: pip install 'pd-operator[tools]'", file=sys.stderr)
    return 2


def add_tool_commands(sub) -> None:
    """The tools' commands when they are installed, else stubs that say how to get them."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=TOOLS_GROUP):
        ep.load()(sub)
    for name, help_ in TOOL_COMMANDS.items():
        if name not in sub.choices:
            p = sub.add_parser(name, help=f"{help_} (needs pd-operator[tools])", add_help=False)
            p.set_defaults(func=_needs_tools)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdctl", description="pd-operator command line")
    parser.add_argument("--version", action="version", version=f"pdctl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("render", help="print the manifests of a PDInferenceService as YAML, offline (like helm template)")
    p.add_argument("-f", "--file", required=True, help="PDInferenceService YAML file, or - for stdin")
    p.add_argument("-n", "--namespace", help="namespace for objects whose metadata has none")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("validate", help="check a PDInferenceService as the API server and the operator would")
    p.add_argument("-f", "--file", required=True, help="PDInferenceService YAML file, or - for stdin")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("doctor", help="a service's conditions, pods, the last hour of its failure signals "
                       "(Prometheus) and what to do")
    p.add_argument("name", help="PDInferenceService name")
    p.add_argument("-n", "--namespace", default="default", help="its namespace (default: default)")
    p.add_argument("--prometheus", help="Prometheus URL to read instead of spec.autoscaling.prometheus.url "
                   "(e.g. http://127.0.0.1:9090 through kubectl port-forward); bearer token from $PDCTL_PROMETHEUS_TOKEN")
    p.set_defaults(func=cmd_doctor)

    add_tool_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.func is _needs_tools:  # whatever its flags: the command is not installed
        return _needs_tools(args)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
