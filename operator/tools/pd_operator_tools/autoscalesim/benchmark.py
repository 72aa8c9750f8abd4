"""``pdctl autoscale-bench``: autoscaling quality on a reference trace, against baselines.

Deterministic and accelerated (virtual time).  Every policy runs on the same
trace (same arrivals, same lengths), the same simulated PD fleet
(:mod:`.fleet`: H200 cost model, TP 1, RDMA 50 GB/s + 1 ms), the same pod
start delay (120 s), the same control interval (30 s) and sees the fleet as
Prometheus would (15-s scrapes, quantiles of a 1-minute rate window).
pd-operator's policy is the operator's own code path: a PDInferenceService
and :func:`~pd_operator.autoscale.plan.plan_service`.
Method, definitions and results: tests/benchmarks/README.md."""

from __future__ import annotations

import json
import os
import time

from pd_operator.autoscale.capacity import decode_mean_context, decode_streams, decode_tokens_per_s, prefill_tokens_per_s
from pd_operator.perfmodel.costmodel import CostModel

from .fleet import ITL_SLO, TTFT_SLO
from .oracle import find_oracle, oracle_need
from .policies import Scheduled, dynamo_profile, make_policy
from .reference import BUDGET, INTERVAL, MAX_PER_POOL, SCRAPE, START_DELAY, reference_manifest
from .report import table_md, write_png
from .runner import Result, run_policy
from .trace import Trace


def _run_named(spec) -> Result:
    trace, name, *rest = spec
    if name == "oracle":
        return run_policy(trace, Scheduled(rest[0]))
    return run_policy(trace, make_policy(name, *rest))


def run_all(trace: Trace, out: str | None = None, policies: list[str] | None = None, goal: float = 0.99,
            log=print, jobs: int = 1, oracle_json: str | None = None, tag: str = "autoscale-bench",
            oracle_u: tuple[float, float] | None = None) -> list[Result]:
    cost = CostModel()
    t0 = time.time()
    log(f"trace: {trace.hours:g} h from {trace.start_h:g}:00, speed {trace.speed:g}, rate x{trace.rate_scale:g}, "
        f"seed {trace.seed}")
    if oracle_json:
        with open(oracle_json) as fh:
            prev = json.load(fh)
        need, tried = prev["oracle"]["need"], prev["oracle"]["search"]
        row = next(x for x in prev["results"] if x["name"] == "oracle")
        oracle = Result("oracle", row["goodput"], row["ttft_p99"], row["itl_p99"], row["itl_req_p99"], row["gpu_hours"],
                        row["goodput_per_gpu_hour"], row["actions"], row["requests"],
                        dict(prev["timeline"]["oracle"]),
                        {int(m): tuple(v) for m, v in prev["slo_per_minute"]["oracle"].items()}, row["wall_s"])
        log(f"  oracle from {oracle_json}: {oracle.gpu_hours:.1f} GPU-h")
    elif oracle_u:
        # the oracle's utilizations given (e.g. from an earlier search): its run is one more job below
        need, tried, oracle = oracle_need(trace, cost, *oracle_u), [{"u_prefill": oracle_u[0], "u_decode": oracle_u[1],
                                                                     "given": True}], None
    else:
        oracle, need, tried = find_oracle(trace, cost, goal, log)
    peak = {r: max(need[r]) for r in need}
    mean = {r: max(1, round(sum(need[r]) / len(need[r]))) for r in need}
    init = {r: need[r][0] for r in need}
    isl, osl = trace.isl.mean, trace.osl.mean
    cap_p = prefill_tokens_per_s(cost, isl)
    cap_d = decode_streams(cost, decode_mean_context(isl, osl, trace.osl.spread))
    prof = dynamo_profile(cost)
    names = policies or ["pd-operator", "static-peak", "static-mean", "hpa", "dynamo"]
    cap_d_tok = decode_tokens_per_s(cost, decode_mean_context(isl, osl, trace.osl.spread))
    specs = [(trace, n, init, peak, mean, cap_p, cap_d, prof, cap_d_tok) for n in names]
    if oracle is None:
        specs.insert(0, (trace, "oracle", need))
    if jobs > 1 and len(specs) > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(min(jobs, len(specs))) as pool:
            rs = pool.map(_run_named, specs)
    else:
        rs = [_run_named(x) for x in specs]
    if oracle is None:
        oracle, rs = rs[0], rs[1:]
    oracle.name = "oracle"
    results = [oracle]
    for r in rs:
        log(f"  {r.name}: goodput {r.goodput:.4f}, {r.gpu_hours:.1f} GPU-h ({r.wall_s:.0f}s)")
        results.append(r)
    for r in results:
        r.ratio = r.gpu_hours / oracle.gpu_hours if oracle.gpu_hours else float("nan")
    md = table_md(results)
    log(md)
    log(f"total {time.time() - t0:.0f}s")
    if out:
        os.makedirs(out, exist_ok=True)
        meta = {
            "trace": {"knots": trace.knots, "surges": [s.__dict__ for s in trace.surges], "isl": trace.isl.__dict__,
                      "osl": trace.osl.__dict__, "seed": trace.seed, "start_h": trace.start_h, "hours": trace.hours,
                      "speed": trace.speed, "rate_scale": trace.rate_scale},
            "service": {"model": "Qwen3-8B shape, fused efficiency", "tp": 1, "link": "rdma 50 GB/s + 1 ms",
                        "start_delay_s": START_DELAY, "interval_s": INTERVAL, "scrape_s": SCRAPE, "window_s": 60,
                        "slo": {"ttft_s": TTFT_SLO, "mean_itl_s": ITL_SLO}, "max_per_pool": MAX_PER_POOL,
                        "gpu_budget": BUDGET},
            "pd_operator_capacity": {"prefill_tokens_per_s": cap_p, "decode_streams": cap_d,
                                     "decode_tokens_per_s": cap_d_tok},
            # pd-operator's rows: plan_service() on this PDInferenceService (defaults filled in by validation)
            "pd_operator_spec": reference_manifest()["spec"],
            "oracle": {"goal": goal, "search": tried, "peak": peak, "mean": mean, "need": need},
            "dynamo_profile": {"prefill_tokens_per_s_per_gpu": prof[0], "decode_tokens_per_s_per_gpu": prof[1]},
            "results": [{k: getattr(r, k) for k in ("name", "goodput", "ttft_p99", "itl_p99", "itl_req_p99", "gpu_hours",
                                                     "goodput_per_gpu_hour", "actions", "requests", "ratio", "wall_s")}
                        for r in results],
            # every 4th scrape (1 min); an oracle loaded from --oracle-json is already so
            "timeline": {r.name: (r.timeline if oracle_json and r.name == "oracle" else
                                  {k: r.timeline[k][::4] for k in ("t", "prefill", "decode")}) for r in results},
            "slo_per_minute": {r.name: {str(m): [n, g] for m, (n, g) in r.per_min.items()} for r in results},
        }
        with open(os.path.join(out, tag + ".json"), "w") as fh:
            json.dump(meta, fh, indent=1, default=float)
        with open(os.path.join(out, tag + ".md"), "w") as fh:
            fh.write(f"# Autoscaling benchmark ({trace.hours:g} h from {trace.start_h:g}:00, speed {trace.speed:g}, "
                     f"rates x{trace.rate_scale:g}, seed {trace.seed})\n\n{md}\n")
        write_png(os.path.join(out, tag + ".png"), trace, results)
    return results
