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

from dataclasses import dataclass, field
from typing import Callable, Optional

from ..workload import Workload
from .clock import VirtualClock
from pd_operator.perfmodel.costmodel import CostModel, LINKS, Link
from .engine import Engine, SimRequest


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

    @property
    def ok(self) -> bool:
        return self.done is not None and bool(self.token_times)

    @property
    def mean_itl(self) -> Optional[float]:
        gaps = self.itls
        return sum(gaps) / len(gaps) if gaps else None


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
