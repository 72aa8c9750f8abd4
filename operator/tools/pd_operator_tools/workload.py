"""Workloads and their figures, shared by the engine simulator, the autoscaling
simulator and the load generator: token-length distributions, seeded Poisson
arrivals, percentiles and the goodput summary of finished requests."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Iterable, Optional, Protocol


@dataclass(frozen=True)
class LengthDist:
    """Token-length distribution: ``fixed``, ``uniform`` (mean +- spread*mean) or
    ``lognormal`` (mean, sigma of the underlying normal)."""

    kind: str = "fixed"
    mean: float = 1000
    spread: float = 0.5  # uniform: half-width as a fraction of mean; lognormal: sigma
    lo: int = 1
    hi: int = 1_000_000

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            v = self.mean
        elif self.kind == "uniform":
            v = rng.uniform(self.mean * (1 - self.spread), self.mean * (1 + self.spread))
        elif self.kind == "lognormal":
            mu = math.log(self.mean) - self.spread ** 2 / 2  # so that E[v] = mean
            v = rng.lognormvariate(mu, self.spread)
        else:
            raise ValueError(f"unknown distribution {self.kind!r}")
        return int(min(self.hi, max(self.lo, round(v))))

    @classmethod
    def parse(cls, text: str) -> "LengthDist":
        """``1000``, ``fixed:1000``, ``uniform:1000[:0.5]``, ``lognormal:1000[:0.6]``."""
        parts = text.split(":")
        if len(parts) == 1:
            return cls("fixed", float(parts[0]))
        kind, mean, *rest = parts
        if kind not in ("fixed", "uniform", "lognormal"):
            raise ValueError(f"unknown distribution {kind!r} (fixed|uniform|lognormal)")
        spread = float(rest[0]) if rest else (0.5 if kind == "uniform" else 0.6)
        return cls(kind, float(mean), spread)


@dataclass
class Workload:
    rate: float  # requests per second (Poisson)
    isl: LengthDist
    osl: LengthDist
    num_requests: int
    seed: int = 0

    def arrivals(self) -> list[tuple[float, int, int]]:
        rng = random.Random(self.seed)
        t, out = 0.0, []
        for _ in range(self.num_requests):
            t += rng.expovariate(self.rate)
            out.append((t, self.isl.sample(rng), self.osl.sample(rng)))
        return out


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]; NaN for no values."""
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


class Finished(Protocol):
    """What a client saw of one request (simulated or over HTTP)."""

    ok: bool
    ttft: Optional[float]
    itls: list
    mean_itl: Optional[float]


def quantiles(values: list[float]) -> dict:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}
    return {"mean": sum(values) / len(values), **{f"p{q}": percentile(values, q) for q in (50, 90, 95, 99)}}


def summarize(requests: Iterable[Finished], ttft_slo: float = 1.0, itl_slo: float = 0.05) -> dict:
    """Latency quantiles and goodput of ``requests``.

    A request is good when it completed with TTFT below ``ttft_slo`` and a mean
    inter-token gap (per request) below ``itl_slo``; ``itl_s`` is over every
    gap of every request, ``mean_itl_per_request_s`` over the per-request means.
    """
    requests = list(requests)
    ok = [r for r in requests if r.ok]
    mean_itls = [r.mean_itl for r in ok if r.mean_itl is not None]
    good = [r for r in ok if r.ttft < ttft_slo and (r.mean_itl is None or r.mean_itl < itl_slo)]
    return {
        "sent": len(requests), "completed": len(ok), "failed": len(requests) - len(ok), "good": len(good),
        "ttft_s": quantiles([r.ttft for r in ok]),
        "itl_s": quantiles([x for r in ok for x in r.itls]),
        "mean_itl_per_request_s": quantiles(mean_itls),
        "slo": {"ttft_s": ttft_slo, "mean_itl_s": itl_slo},
        "goodput_fraction": len(good) / len(requests) if requests else float("nan"),
    }
