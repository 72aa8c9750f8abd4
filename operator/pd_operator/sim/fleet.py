"""A fleet of simulated engines in virtual time: PD (prefill pool -> KV
transfer -> decode pool) or aggregated (unified engines), fed by a seeded
workload.  Pure of I/O; deterministic for a seed.  The autoscaling benchmark
reuses it (pools can be resized between ``run`` calls: ``add_engine``).

Routing is least-loaded (fewest running + waiting) per pool, ties by index;
PD requests go prefill first, and when the prefill instance has produced the
first token the request is handed to a decode instance, which pulls the KV
(transfer time) before decoding, as vLLM NIXL and SGLang PD do.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Optional

from .clock import VirtualClock
from .costmodel import CostModel, LINKS, Link
from .engine import Engine, SimRequest


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


@dataclass
class ClientRecord:
    """What a client behind the router sees."""

    arrival: float
    prompt_tokens: int
    max_tokens: int
    token_times: list = field(default_factory=list)
    done: Optional[float] = None

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def itls(self) -> list:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


def _least_loaded(engines: list[Engine]) -> Engine:
    return min(engines, key=lambda e: (e.num_running + e.num_waiting, engines.index(e)))


class Fleet:
    def __init__(self, mode: str, *, prefill: int = 1, decode: int = 1, unified: int = 2,
                 cost: CostModel | None = None, link: Link = LINKS["rdma"],
                 engine_kwargs: dict | None = None, clock: VirtualClock | None = None,
                 sink_factory: Optional[Callable[[str], object]] = None):
        if mode not in ("pd", "aggregated"):
            raise ValueError("mode is pd or aggregated")
        self.mode = mode
        self.clock = clock or VirtualClock()
        self.cost = cost or CostModel()
        self.link = link
        self.engine_kwargs = engine_kwargs or {}
        # e.g. lambda role: PromSink("vllm", "m", role): per-engine metrics in virtual time
        self.sink_factory = sink_factory
        self.pools: dict[str, list[Engine]] = {"prefill": [], "decode": [], "unified": []}
        if mode == "pd":
            for _ in range(prefill):
                self.add_engine("prefill")
            for _ in range(decode):
                self.add_engine("decode")
        else:
            for _ in range(unified):
                self.add_engine("unified")
        self.records: list[ClientRecord] = []

    def add_engine(self, role: str) -> Engine:
        sink = self.sink_factory(role) if self.sink_factory else None
        e = Engine(self.clock, self.cost, role, link=self.link, sink=sink, **self.engine_kwargs)
        if hasattr(sink, "bind"):
            sink.bind(e)  # gauges (running, waiting, KV usage) read this engine
        self.pools[role].append(e)
        return e

    def remove_engine(self, role: str) -> Engine:
        """Scale a pool down by one (the newest engine): it gets no new requests and
        drains what it holds (a preStop drain)."""
        if not self.pools[role]:
            raise ValueError(f"no {role} engine to remove")
        return self.pools[role].pop()

    # ---- request flow ----------------------------------------------------------
    def submit(self, prompt_tokens: int, max_tokens: int) -> ClientRecord:
        rec = ClientRecord(self.clock.now(), prompt_tokens, max_tokens)
        self.records.append(rec)

        def client_token(_r: SimRequest, t: float) -> None:
            rec.token_times.append(t)

        def client_done(_r: SimRequest, t: float) -> None:
            rec.done = t

        if self.mode == "aggregated":
            _least_loaded(self.pools["unified"]).add(
                SimRequest(prompt_tokens, max_tokens, on_token=client_token, on_finish=client_done))
            return rec

        def prefill_done(_r: SimRequest, t: float) -> None:
            # the router forwards to decode when the prefill response is complete
            _least_loaded(self.pools["decode"]).add(
                SimRequest(prompt_tokens, max_tokens, kv_transfer=True, on_token=client_token, on_finish=client_done))

        _least_loaded(self.pools["prefill"]).add(
            SimRequest(prompt_tokens, 1, prefill_only=True, on_finish=prefill_done))
        return rec

    def run_workload(self, wl: Workload, until: float | None = None) -> list[ClientRecord]:
        for t, isl, osl in wl.arrivals():
            self.clock.call_at(t, self.submit, isl, osl)
        self.clock.run(until=until)
        return self.records


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        return float("nan")
    v = sorted(values)
    k = (len(v) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarize(records: list[ClientRecord], ttft_slo: float = 1.0, itl_slo: float = 0.05) -> dict:
    done = [r for r in records if r.done is not None and r.token_times]
    ttfts = [r.ttft for r in done]
    itls = [x for r in done for x in r.itls]
    good = [r for r in done if r.ttft < ttft_slo and (not r.itls or sum(r.itls) / len(r.itls) < itl_slo)]
    return {
        "completed": len(done),
        "ttft_p50": percentile(ttfts, 50), "ttft_p99": percentile(ttfts, 99),
        "itl_p50": percentile(itls, 50), "itl_p99": percentile(itls, 99),
        "goodput_frac": len(good) / len(records) if records else float("nan"),
    }
