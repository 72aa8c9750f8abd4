"""The operator's histogram_quantile against real Prometheus' on random histograms.

The operator computes quantiles of histograms it read from Prometheus
(rule 2c: the TTFT quantile of the prompts that can make it), and the
autoscaling simulator, which has no Prometheus, reads its latency signals with
the same function; it must answer what Prometheus answers on the same buckets. One exporter serves a few hundred seeded random
classic histograms (label ``h``) as static cumulative bucket counts; real
Prometheus scrapes them once and evaluates ``histogram_quantile(q, ...)`` on
them, for a set of quantiles. Counts are integers, so both sides compute the
same ranks exactly and a tie on a bucket boundary (empty buckets around it)
is decided by the rule, not by rounding.
"""

from __future__ import annotations

import itertools
import math
import random

import pytest

from pd_operator.autoscale.promql import histogram_quantile
from pd_operator_tools.autoscalesim.fleet import histogram_quantile as fleet_quantile
from tests.conftest import prometheus_binary
from tests.sim.conftest import query, start_prometheus

pytestmark = pytest.mark.skipif(prometheus_binary() is None, reason="needs prometheus (tests/run.sh builds it)")

SEED = 20260611
QUANTILES = [0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0]


def random_histograms(rng: random.Random, n: int) -> list[tuple[list[float], list[int]]]:
    """(finite upper bounds, per-bucket counts with +Inf last): a mix of shapes,
    empty buckets, small totals (ties on boundaries), mass in +Inf, all empty."""
    out = []
    for i in range(n):
        k = rng.randint(1, 12)
        bounds = sorted({round(rng.lognormvariate(-2, 2), 6) for _ in range(k)} - {0.0}) or [1.0]
        shape = i % 5
        if shape == 0:    # small counts: many ties of rank and cumulative count
            counts = [rng.choice([0, 0, 1, 2]) for _ in range(len(bounds) + 1)]
        elif shape == 1:  # sparse, large
            counts = [rng.choice([0, 0, 0, rng.randint(1, 10**6)]) for _ in range(len(bounds) + 1)]
        elif shape == 2:  # everything above the last bound
            counts = [0] * len(bounds) + [rng.randint(1, 50)]
        elif shape == 3:  # everything in one bucket
            counts = [0] * (len(bounds) + 1)
            counts[rng.randrange(len(bounds) + 1)] = rng.randint(1, 50)
        else:             # dense
            counts = [rng.randint(0, 1000) for _ in range(len(bounds) + 1)]
        if i % 37 == 0:   # no observations at all
            counts = [0] * (len(bounds) + 1)
        out.append((bounds, counts))
    return out


def exposition(hists) -> dict[str, float]:
    """Cumulative classic-histogram buckets, one series set per histogram."""
    page = {}
    for h, (bounds, counts) in enumerate(hists):
        cum = 0
        for le, c in zip([*bounds, math.inf], counts):
            cum += c
            page[f'hq_bucket{{h="{h}",le="{"+Inf" if le == math.inf else repr(le)}"}}'] = float(cum)
    return page


def same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def test_histogram_quantile_matches_prometheus(procs, tmp_path, exporters):
    rng = random.Random(SEED)
    hists = random_histograms(rng, 300)
    page = exposition(hists)
    exporter = exporters(lambda _scrape, _elapsed: page)
    url = start_prometheus(procs, tmp_path, {"hist": [(exporter.host, exporter.port, {})]})
    wrong = []
    for q in QUANTILES + [round(rng.random(), 4) for _ in range(4)]:
        result = {int(s["metric"]["h"]): float(s["value"][1]) for s in query(url, f"histogram_quantile({q!r}, hq_bucket)")}
        assert len(result) == len(hists), q
        for h, (bounds, counts) in enumerate(hists):
            cumulative = list(zip([*bounds, math.inf], itertools.accumulate(counts)))
            ours = histogram_quantile(q, cumulative)
            ours = math.nan if ours is None else ours
            if not same(ours, result[h]) or not same(fleet_quantile(q, bounds, counts), result[h]):
                wrong.append((q, bounds, counts, ours, result[h]))
    assert not wrong, f"{len(wrong)} disagreements at q={sorted({w[0] for w in wrong})} (q, bounds, counts, ours, Prometheus), first: {wrong[:5]}"
