"""``pdctl autoscale-bench --suite``: every policy on a list of traces, judged against the
targets of issue 14 (tests/benchmarks/README.md, "The suite").

Each entry is a trace (the reference day, the shipped variants of :data:`.trace.TRACES`,
and stress variants defined here), the window of it that is simulated (the part with the
event the trace is about, to keep a run short), and the speed of the simulated engines
relative to the cost model (``slowdown``: 1.2 = every step 20 % slower than the model;
the fleet gets it, the policies do not: pd-operator keeps estimating with the cost model,
so the suite shows what model error costs).

Judged per trace, on the requests that could meet the SLO on an idle fleet (*feasible*:
per request, prefill alone of its prompt in chunks of ``max_batched_tokens`` + the KV
transfer + one decode step, with the fleet's true engine speed, under the TTFT target,
and one decode step at batch 1 under the ITL target):

* goodput / feasible >= 0.97 (0.95 on the traces where the engines are off the model);
* GPU-hours <= 1.3 x the oracle's;
* more good requests per GPU-hour than every baseline that meets the goodput target.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, replace

from pd_operator.perfmodel.costmodel import LINKS, CostModel

from ..workload import LengthDist
from .fleet import ITL_SLO, TTFT_SLO, slowed
from .oracle import oracle_need
from .policies import Scheduled, dynamo_profile, make_policy
from .report import table_md, write_png
from .runner import Result, run_policy
from .trace import REFERENCE, TRACES, Surge, Trace

# The oracle's utilizations: the first version's full-day search result (tests/benchmarks/results/oracle-search.log at commit a8a59ca,
# the full-day point that passed); not searched again per trace (a search is ~10 runs per trace).
ORACLE_U = (0.8, 0.8)
BASELINES = ("static-peak", "static-mean", "hpa", "dynamo", "dynamo-batch")
POLICIES = ("pd-operator",) + BASELINES
GOAL, GOAL_MODEL_OFF, RATIO_MAX = 0.97, 0.95, 1.3


@dataclass(frozen=True)
class Entry:
    name: str
    trace: Trace
    start_h: float
    hours: float
    slowdown: float = 1.0
    about: str = ""

    def window(self, hours_scale: float = 1.0) -> Trace:
        return replace(self.trace, start_h=self.start_h, hours=self.hours * hours_scale)


_EVENING = 19.85
SUITE: tuple[Entry, ...] = (
    Entry("reference", REFERENCE, _EVENING, 2.0, about="the reference day's evening surge (3x, 15-min ramp)"),
    Entry("second-surge", TRACES["second-surge"], 12.75, 2.0, about="the shipped second surge (2x at 13:00)"),
    Entry("slow-ramp", TRACES["slow-ramp"], 9.0, 2.0, about="the shipped slow ramp (5 -> 20 req/s over 12 h), steepest part"),
    Entry("flash-crowd", TRACES["flash-crowd"], 10.75, 1.25, about="the shipped flash crowd (4x in 1 min at 11:00)"),
    Entry("steep-ramp", replace(REFERENCE, surges=(Surge(20.0, 7.5, 22.0, 30, 3.0),)), _EVENING, 2.0,
          about="the evening surge ramping 2x steeper (7.5 min)"),
    Entry("wide-osl", replace(REFERENCE, osl=LengthDist("lognormal", 1000, 1.0, 1, 8192)), _EVENING, 2.0,
          about="output lengths lognormal sigma 1.0 (reference 0.6), cap 8192"),
    Entry("long-prompts", replace(REFERENCE, isl=LengthDist("lognormal", 4000, 1.0, 1, 32768)), _EVENING, 2.0,
          about="prompts lognormal mean 4000 sigma 1.0, cap 32768: ~1.5 % cannot finish prefill within 1 s"),
    Entry("mix-shift", replace(REFERENCE, mix=((12.0, LengthDist("lognormal", 500, 0.6, 1, 8192),
                                                 LengthDist("lognormal", 2500, 0.8, 1, 8192)),)), 11.5, 2.0,
          about="at 12:00 the mix turns from chat (ISL 2000 / OSL 1000) to short prompts, long answers (500 / 2500)"),
    Entry("engines-slower", REFERENCE, _EVENING, 2.0, slowdown=1.2, about="the reference evening, engines 20 % slower than the cost model"),
    Entry("engines-faster", REFERENCE, _EVENING, 2.0, slowdown=0.8, about="the reference evening, engines 20 % faster than the cost model"),
)


def idle_latency(cost: CostModel, isl: int, osl: int, max_batched_tokens: int = 8192) -> tuple[float, float]:
    """(TTFT, ITL) of one request alone on the fleet: chunked prefill (one step per chunk of
    ``max_batched_tokens``, each with the step's fixed cost), the KV transfer over RDMA and
    the first decode step; ITL: one decode step at batch 1 at the request's mean context."""
    done, ms = 0, 0.0
    while done < isl:
        n = min(max_batched_tokens, isl - done)
        ms += cost.prefill_fixed_ms() + cost.prefill_chunk_ms(done, n)
        done += n
    ms += cost.transfer_ms(isl, LINKS["rdma"]) + cost.decode_uniform_ms(1, isl)
    return ms / 1e3, cost.decode_uniform_ms(1, int(isl + osl / 2)) / 1e3


def feasible(trace: Trace, cost: CostModel) -> tuple[int, int]:
    """(requests, requests that could meet the SLO on an idle fleet)."""
    n = ok = 0
    for _, isl, osl in trace.arrivals():
        n += 1
        ttft, itl = idle_latency(cost, isl, osl)
        ok += ttft < TTFT_SLO and itl < ITL_SLO
    return n, ok


def _run(spec) -> Result:
    trace, cost, name, args = spec
    if name == "oracle":
        return run_policy(trace, Scheduled(args), cost)
    if name == "oracle-now":
        # the oracle's sizes for the minute at hand, ordered when it comes: knows the present,
        # not the future (pods still take START_DELAY): what no forecast is left to win
        pol = Scheduled(args, lead=0.0)
        pol.name = name
        return run_policy(trace, pol, cost)
    return run_policy(trace, make_policy(name, *args), cost)


def judge(entry: Entry, results: list[Result], n_feasible: int) -> dict:
    by = {r.name: r for r in results}
    goal = GOAL_MODEL_OFF if entry.slowdown != 1.0 else GOAL
    frac = {r.name: (r.goodput * r.requests / n_feasible if n_feasible else float("nan")) for r in results}
    ours = by["pd-operator"]
    rivals = [b for b in BASELINES if b in by and frac[b] >= goal]
    checks = {
        "goodput": frac["pd-operator"] >= goal,
        "gpu_hours": ours.ratio <= RATIO_MAX,
        "efficiency": all(ours.goodput_per_gpu_hour > by[b].goodput_per_gpu_hour for b in rivals),
    }
    return {"goal": goal, "feasible_share": frac, "rivals_meeting_slo": rivals, "checks": checks,
            "pass": all(checks.values())}


def run_entry(entry: Entry, out: str | None, jobs: int = 1, hours_scale: float = 1.0, log=print,
              policies=POLICIES) -> tuple[list[Result], dict, dict]:
    t0 = time.time()
    trace = entry.window(hours_scale)
    true_cost = slowed(CostModel(), entry.slowdown)
    n, n_ok = feasible(trace, true_cost)
    need = oracle_need(trace, true_cost, *ORACLE_U)
    peak = {r: max(need[r]) for r in need}
    mean = {r: max(1, round(sum(need[r]) / len(need[r]))) for r in need}
    init = {r: need[r][0] for r in need}
    prof = dynamo_profile(true_cost)
    args = (init, peak, mean, None, None, prof, None, dynamo_profile(true_cost, decode_headroom_on="batch"))
    specs = ([(trace, true_cost, "oracle", need), (trace, true_cost, "oracle-now", need)]
             + [(trace, true_cost, p, args) for p in policies])
    if jobs > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(min(jobs, len(specs))) as pool:
            results = pool.map(_run, specs)
    else:
        results = [_run(s) for s in specs]
    oracle = results[0]
    for r in results:
        r.ratio = r.gpu_hours / oracle.gpu_hours if oracle.gpu_hours else float("nan")
    verdict = judge(entry, results, n_ok)
    meta = {"entry": entry.name, "about": entry.about, "window": [trace.start_h, trace.hours],
            "slowdown": entry.slowdown, "requests": n, "feasible": n_ok, "oracle_u": ORACLE_U,
            "wall_s": round(time.time() - t0, 1)}
    log(f"{entry.name}: {n} requests, {n_ok} feasible; pass={verdict['pass']} {verdict['checks']} "
        f"({meta['wall_s']:.0f}s)")
    if out:
        os.makedirs(out, exist_ok=True)
        md = table_md(results, feasible=n_ok)
        with open(os.path.join(out, f"{entry.name}.md"), "w") as fh:
            fh.write(f"# {entry.name}: {entry.about}\n\n{trace.hours:g} h from {trace.start_h:g}:00, "
                     f"engines x{entry.slowdown:g} the cost model's step time, {n} requests, {n_ok} feasible "
                     f"({n_ok / n:.4f}).\n\n{md}\n\nVerdict: {'PASS' if verdict['pass'] else 'FAIL'} "
                     f"{verdict['checks']} (goal {verdict['goal']}, baselines meeting it: "
                     f"{', '.join(verdict['rivals_meeting_slo']) or 'none'}).\n")
        write_png(os.path.join(out, f"{entry.name}.png"), trace, results, title=entry.name)
    return results, verdict, meta


def summary_md(rows: list[tuple[Entry, list[Result], dict, dict]]) -> str:
    lines = ["| trace | feasible | pd-operator goodput / feasible | oracle-now goodput / feasible | GPU-h / oracle | good req per GPU-h | best baseline meeting the goal (good req per GPU-h) | verdict |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for entry, results, verdict, meta in rows:
        by = {r.name: r for r in results}
        ours = by["pd-operator"]
        rivals = verdict["rivals_meeting_slo"]
        best = max(rivals, key=lambda b: by[b].goodput_per_gpu_hour) if rivals else None
        fails = [k for k, ok in verdict["checks"].items() if not ok]
        lines.append(
            f"| {entry.name} | {meta['feasible'] / meta['requests']:.4f} | "
            f"{verdict['feasible_share']['pd-operator']:.4f} | "
            f"{verdict['feasible_share'].get('oracle-now', float('nan')):.4f} | {ours.ratio:.2f} | {ours.goodput_per_gpu_hour:.0f} | "
            f"{f'{best} ({by[best].goodput_per_gpu_hour:.0f})' if best else 'none'} | "
            f"{'pass' if verdict['pass'] else 'FAIL: ' + ', '.join(fails)} |")
    return "\n".join(lines)


def run_suite(out: str | None, names: list[str] | None = None, jobs: int = 1, hours_scale: float = 1.0,
              log=print) -> list:
    rows = []
    for entry in SUITE:
        if names and entry.name not in names:
            continue
        results, verdict, meta = run_entry(entry, out, jobs, hours_scale, log)
        rows.append((entry, results, verdict, meta))
    md = summary_md(rows)
    log(md)
    if out:
        with open(os.path.join(out, "summary.md"), "w") as fh:
            fh.write("# Autoscaling benchmark suite\n\n" + md + "\n")
        with open(os.path.join(out, "summary.json"), "w") as fh:
            json.dump([{**meta, "verdict": verdict,
                        "results": [{k: getattr(r, k) for k in ("name", "goodput", "ttft_p99", "itl_p99", "gpu_hours",
                                                                 "goodput_per_gpu_hour", "actions", "requests", "ratio",
                                                                 "wall_s")} for r in results]}
                       for _, results, verdict, meta in rows], fh, indent=1, default=float)
    return rows
