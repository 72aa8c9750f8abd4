"""The autoscaling simulator's commands: ``pdctl autoscale-bench`` (policies vs
baselines on a trace) and ``pdctl simulate`` (a policy edit before applying it,
:mod:`.whatif`)."""

from __future__ import annotations

from dataclasses import replace

from .benchmark import run_all
from .trace import TRACES
from .whatif import add_parser as add_whatif_parser


def add_parsers(sub) -> None:
    add_bench_parser(sub)
    add_whatif_parser(sub)


def add_bench_parser(sub) -> None:
    p = sub.add_parser("autoscale-bench", help="autoscaling quality on a reference trace vs baselines (simulated, virtual time)")
    p.add_argument("--trace", default="reference", choices=sorted(TRACES))
    p.add_argument("--out", help="write autoscale-bench.json/.md/.png here (e.g. tests/benchmarks/results/)")
    p.add_argument("--hours", type=float, help="simulate this many hours of the day (default: 24)")
    p.add_argument("--start-hour", type=float, help="hour of day the run starts at (default 0)")
    p.add_argument("--speed", type=float, default=1.0, help="compress the day's shape by this factor (delays unchanged)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply every rate (a quick smoke run)")
    p.add_argument("--seed", type=int)
    p.add_argument("--policies", help="comma-separated subset of pd-operator,static-peak,static-mean,hpa,dynamo "
                   "(default: all five); also pd-operator-estimated (capacity left to plan_service's own estimate), "
                   "pd-operator-streams, pd-operator-waiting, pd-operator-tokens (earlier variants)")
    p.add_argument("--goal", type=float, default=0.99, help="oracle goodput goal (default 0.99)")
    p.add_argument("--jobs", type=int, default=2, help="policies simulated in parallel (processes; default 2)")
    p.add_argument("--oracle-json", help="reuse the oracle (schedule and row) of an earlier run's JSON")
    p.add_argument("--tag", default="autoscale-bench", help="output file name stem")
    p.add_argument("--oracle-u", help="U_PREFILL,U_DECODE: skip the oracle's search, use these utilizations")
    p.add_argument("--suite", action="store_true",
                   help="run the benchmark suite (every trace of autoscalesim/suite.py, judged against issue 14's "
                        "targets); writes one table and plot per trace and summary.md to --out "
                        "(default tests/benchmarks/results/suite)")
    p.add_argument("--suite-traces", help="with --suite: comma-separated subset of the suite's traces")
    p.add_argument("--suite-hours-scale", type=float, default=1.0,
                   help="with --suite: simulate this share of each trace's window (a quick check)")
    p.set_defaults(func=main_bench)


def main_bench(args) -> int:
    if args.suite:
        from .suite import run_suite
        run_suite(args.out or "tests/benchmarks/results/suite",
                  args.suite_traces.split(",") if args.suite_traces else None, jobs=args.jobs,
                  hours_scale=args.suite_hours_scale, log=lambda s: print(s, flush=True))
        return 0
    tr = TRACES[args.trace]
    kw = {"speed": args.speed, "rate_scale": args.rate_scale}
    if args.hours is not None:
        kw["hours"] = args.hours
    if args.start_hour is not None:
        kw["start_h"] = args.start_hour
    if args.seed is not None:
        kw["seed"] = args.seed
    tr = replace(tr, **kw)
    run_all(tr, args.out, args.policies.split(",") if args.policies else None, args.goal,
            log=lambda s: print(s, flush=True), jobs=args.jobs, oracle_json=args.oracle_json, tag=args.tag,
            oracle_u=tuple(float(x) for x in args.oracle_u.split(",")) if args.oracle_u else None)
    return 0
