"""The clairvoyant reference: replicas per minute from the future load, its two
utilizations found by search with the simulator. A reference to compare
with, not a proven lower bound (tests/benchmarks/README.md)."""

from __future__ import annotations

import math
from dataclasses import replace

from pd_operator.autoscale.capacity import decode_streams, prefill_tokens_per_s
from pd_operator.perfmodel.costmodel import CostModel

from .policies import Scheduled
from .runner import Result, run_policy
from .trace import Trace


def future_load(trace: Trace, itl_est: float = 0.035) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per minute, known in advance: prompt tokens/s arriving, the peak decode streams, the
    minute's mean ISL and the mean context of its running decodes (ISL + E[OSL^2]/(2 E[OSL]))."""
    mins = int(math.ceil(trace.duration / 60)) + 1
    tok = [0.0] * mins
    n = [0] * mins
    osl1 = [0.0] * mins
    osl2 = [0.0] * mins
    secs = int(trace.duration) + 4200
    diff = [0] * (secs + 1)
    for t, isl, osl in trace.arrivals():
        m = int(t // 60)
        tok[m] += isl / 60
        n[m] += 1
        osl1[m] += osl
        osl2[m] += osl * osl
        s, e = int(t), int(t + osl * itl_est) + 1
        diff[s] += 1
        diff[min(e, secs)] -= 1
    streams = [0.0] * mins
    cur = 0
    for s in range(secs):
        cur += diff[s]
        m = s // 60
        if m < mins and cur > streams[m]:
            streams[m] = cur
    isl_mean = [tok[m] * 60 / n[m] if n[m] else 0.0 for m in range(mins)]
    ctx = [isl_mean[m] + osl2[m] / (2 * osl1[m]) if osl1[m] else 0.0 for m in range(mins)]
    return tok, streams, isl_mean, ctx


def oracle_need(trace: Trace, cost: CostModel, u_p: float, u_d: float, load=None) -> dict:
    """Replicas per minute: the minute's load over one replica's capacity at the minute's own
    lengths (workload-aware: a mix shift changes the capacity), at utilizations ``u_p``/``u_d``."""
    tok, streams, isl_mean, ctx = load or future_load(trace)
    fallback_isl = next((x for x in isl_mean if x), 2000.0)
    fallback_ctx = next((x for x in ctx if x), 2500.0)
    cp_cache: dict = {}
    cd_cache: dict = {}

    def cp(isl):
        k = int(round((isl or fallback_isl) / 50)) * 50 or 50
        if k not in cp_cache:
            cp_cache[k] = prefill_tokens_per_s(cost, k, utilization=u_p)
        return cp_cache[k]

    def cd(c):
        k = int(round((c or fallback_ctx) / 100)) * 100 or 100
        if k not in cd_cache:
            seqs = max(1, min(256, int(cost.kv_capacity_tokens() // k)))
            cd_cache[k] = decode_streams(cost, k, max_num_seqs=seqs, utilization=u_d)
        return cd_cache[k]

    p = [max(1, math.ceil(x / cp(i))) for x, i in zip(tok, isl_mean)]
    d = [max(1, math.ceil(x / cd(c))) for x, c in zip(streams, ctx)]
    # a minute's size must also cover the next minute's first seconds
    p = [max(p[i], p[i + 1] if i + 1 < len(p) else 0) for i in range(len(p))]
    d = [max(d[i], d[i + 1] if i + 1 < len(d) else 0) for i in range(len(d))]
    return {"prefill": p, "decode": d}


def search_window(trace: Trace, hours: float = 3.5) -> Trace:
    """The busiest ``hours`` of the trace (from 1 h before its peak), where the search is done."""
    if trace.hours <= hours:
        return trace
    step = 60.0
    n = int(trace.duration / step)
    t_peak = max(range(n), key=lambda i: (trace.rate(i * step), -i)) * step
    t0 = max(0.0, min(t_peak - 3600 / trace.speed, trace.duration - hours * 3600 / trace.speed))
    return replace(trace, start_h=trace.hour_at(t0), hours=hours)


U_DECODE = (1.4, 1.3, 1.2, 1.1, 1.0, 0.9, 0.8, 0.7)
U_PREFILL = (1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6)


def find_oracle(trace: Trace, cost: CostModel, goal: float = 0.99, log=print) -> tuple[Result, dict, list]:
    """Clairvoyant schedule, found by search with the simulator (tests/benchmarks/README.md).

    The oracle knows every future arrival: per minute, the prompt tokens/s and the
    peak number of concurrent decode streams.  Its replicas for a minute are
    ``ceil(load / (u x per-replica capacity))`` (max with the next minute), pods
    ordered ``START_DELAY + INTERVAL`` ahead so they are Ready in time (and paid
    for from the order).  The two utilizations ``(u_prefill, u_decode)`` are
    searched by bisection on the busiest 3.5 h of the trace -- the highest
    (cheapest) that keeps goodput >= ``goal`` overall and >= goal - 0.05 in
    every minute with 20+ requests -- decode first (prefill generous), then
    prefill; then the schedule is run on the whole trace (stepping both
    down if it fails there)."""
    tried = []

    def attempt(tr, up, ud):
        need = oracle_need(tr, cost, up, ud)
        r = run_policy(tr, Scheduled(need), cost)
        tried.append({"window": [tr.start_h, tr.hours], "u_prefill": up, "u_decode": ud, "goodput": r.goodput,
                      "gpu_hours": r.gpu_hours, "ok": ok(r)})
        log(f"  oracle search {tr.start_h:.2f}h+{tr.hours:g}h u_p={up:.2f} u_d={ud:.2f}: goodput {r.goodput:.4f}, "
            f"{r.gpu_hours:.1f} GPU-h, {'ok' if ok(r) else 'fails'} ({r.wall_s:.0f}s)")
        return r, need

    def ok(r):
        worst = min((g / n for n, g in r.per_min.values() if n >= 20), default=1.0)
        return r.goodput >= goal and worst >= goal - 0.05

    def bisect(grid, run):
        """Index of the first grid value (highest u) that passes; grid sorted high -> low."""
        lo, hi = 0, len(grid) - 1   # answer in [lo, hi]; hi assumed to pass
        while lo < hi:
            mid = (lo + hi) // 2
            if run(grid[mid]):
                hi = mid
            else:
                lo = mid + 1
        return grid[lo]

    win = search_window(trace)
    ud = bisect(U_DECODE, lambda u: ok(attempt(win, U_PREFILL[-1], u)[0]))
    up = bisect(U_PREFILL, lambda u: ok(attempt(win, u, ud)[0]))
    for k in range(4):
        r, need = attempt(trace, up, ud)
        if r.goodput >= goal or win is trace:  # the whole trace: overall goal (the per-minute one was the window's)
            break
        up, ud = max(0.5, up - 0.05), max(0.5, ud - 0.1)
    return r, need, tried
