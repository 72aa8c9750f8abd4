"""The ``pdctl`` commands the tools add (entry point group ``pd_operator.pdctl``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_crd(args: argparse.Namespace) -> int:
    from pd_operator.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def cmd_chart(args: argparse.Namespace) -> int:
    from .generate import chart

    try:
        where = Path(args.dir) if args.dir else chart.find_chart_dir()
    except FileNotFoundError as err:
        print(f"pdctl chart: {err}", file=sys.stderr)
        return 2
    if args.check:
        old = chart.stale(where)
        for rel in old:
            print(f"pdctl: {where / rel} is stale: run `pdctl chart`", file=sys.stderr)
        return 1 if old else 0
    for rel in chart.write(where):
        print(f"wrote {where / rel}")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("crd", help="print the CustomResourceDefinition generated from the API models")
    p.set_defaults(func=cmd_crd)

    p = sub.add_parser("chart", help="write the Helm chart's generated files (values.yaml, values.schema.json, crds/)")
    p.add_argument("--check", action="store_true", help="only check: exit 1 when a generated file is stale")
    p.add_argument("--dir", help="chart directory (default: charts/pd-operator of the checkout around the working directory)")
    p.set_defaults(func=cmd_chart)

    from .autoscalesim.cli import add_parsers as add_autoscalesim
    from .loadgen import add_parser as add_loadgen

    add_loadgen(sub)
    add_autoscalesim(sub)
