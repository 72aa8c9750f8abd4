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


def _load_documents(path: str) -> list:
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    return [d for d in yaml.safe_load_all(text) if d is not None]


def cmd_render(args: argparse.Namespace) -> int:
    from .render import render

    try:
        docs = _load_documents(args.file)
    except (OSError, yaml.YAMLError) as err:
        print(f"pdctl: cannot read {args.file}: {err}", file=sys.stderr)
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


def cmd_crd(args: argparse.Namespace) -> int:
    from .api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def cmd_chart(args: argparse.Namespace) -> int:
    from pathlib import Path

    from . import chart

    where = Path(args.dir) if args.dir else chart.CHART_DIR
    if args.check:
        old = chart.stale(where)
        for rel in old:
            print(f"pdctl: {where / rel} is stale: run `pdctl chart`", file=sys.stderr)
        return 1 if old else 0
    for rel in chart.write(where):
        print(f"wrote {where / rel}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        docs = _load_documents(args.file)
    except (OSError, yaml.YAMLError) as err:
        print(f"pdctl: cannot read {args.file}: {err}", file=sys.stderr)
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

    p = sub.add_parser("crd", help="print the CustomResourceDefinition generated from the API models")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser("chart", help="write the Helm chart's generated files (values.yaml, values.schema.json, crds/)")
    p.add_argument("--check", action="store_true", help="only check: exit 1 when a generated file is stale")
    p.add_argument("--dir", help="chart directory (default: charts/pd-operator of this checkout)")
    p.set_defaults(func=cmd_chart)

    from .bench import add_parser as add_bench_parser

    add_bench_parser(sub)
    from .simulate.bench import add_parser as add_autoscale_bench_parser

    add_autoscale_bench_parser(sub)
    from .simulate.simulate import add_parser as add_simulate_parser

    add_simulate_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
