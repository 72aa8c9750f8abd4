"""Discrete-event continuous-batching scheduler of one simulated engine instance.

Driven by an injectable clock (:mod:`.clock`): ``AsyncioClock`` behind the
HTTP server, ``VirtualClock`` in benchmarks and tests.  The engine never
reads the wall clock and never sleeps; it schedules "step done" callbacks.

Roles (what a real engine instance does in each):

* ``unified``  (aggregated, no PD): a request is prefilled (in chunks) and
  decoded on this engine.  A step can mix decodes and prefill chunks and
  every running decode waits for the whole step (prefills interrupt decodes).
Roles only name the instance (metrics labels); what happens to a request is
decided per request, as in the real engines (a vLLM ``kv_consumer`` computes
a prompt itself when the request carries no ``kv_transfer_params``):
``SimRequest.kv_transfer`` (pull the KV, then decode) and
``SimRequest.prefill_only`` (finish after the first token).

* ``prefill``  (vLLM ``kv_producer`` / SGLang ``--disaggregation-mode
  prefill``): prefill only; the step that completes the prompt yields the
  first token and the request ends (the router's ``max_tokens: 1`` request).
* ``decode``   (vLLM ``kv_consumer`` / SGLang ``decode``): the prompt's KV is
  pulled from the prefill instance (transfer time from a :class:`Link`), then
  the request decodes.  Its first token comes from the first decode step after
  the KV arrived.

Scheduler (one step at a time, as vLLM v1 / SGLang):

1. admit waiting requests FIFO while ``running < max_num_seqs`` and the KV
   cache has room for ``prompt + max_tokens`` tokens (reserved up front: no
   preemption is modelled; a request that cannot fit waits);
2. the step takes one token for each running decode, then prefill chunks of
   the running prompts (oldest first) up to ``max_num_batched_tokens``;
3. its duration is :meth:`CostModel.step_ms` of that batch.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

from pd_operator.perfmodel.costmodel import LINKS, CostModel, Link

ROLES = ("unified", "prefill", "decode")


class Clock(Protocol):
    def now(self) -> float: ...
    def call_at(self, t: float, fn: Callable, *args: Any) -> None: ...
    def call_later(self, dt: float, fn: Callable, *args: Any) -> None: ...


class Sink:
    """Receives observations (seconds / counts).  The default keeps nothing."""

    def ttft(self, v: float) -> None: ...
    def ttft_batched(self, v: float) -> None:  # a request not streamed (SGLang labels it apart)
        self.ttft(v)
    def itl(self, v: float) -> None: ...
    def e2e(self, v: float) -> None: ...
    def queue(self, v: float, rank: int = 0) -> None: ...  # by the request's DP rank
    def prefill_time(self, v: float, rank: int = 0) -> None: ...
    def decode_time(self, v: float) -> None: ...
    def transfer(self, v: float) -> None: ...
    def finished(self, req: "SimRequest") -> None: ...
    def prompt_tokens(self, n: int) -> None: ...
    def prompt_external(self, n: int) -> None: ...  # prompt tokens whose KV came from a prefill pod
    def generation_tokens(self, n: int, rank: int = 0) -> None: ...  # by the request's DP rank


@dataclass(eq=False)
class SimRequest:
    prompt_tokens: int
    max_tokens: int
    id: str = ""
    # the prompt's KV is pulled from a prefill instance (False: computed here)
    kv_transfer: bool = False
    # finish after the first token (PD prefill instance)
    prefill_only: bool = False
    on_token: Optional[Callable[["SimRequest", float], None]] = None
    on_finish: Optional[Callable[["SimRequest", float], None]] = None
    tag: Any = None
    # when the server took the request, if before the engine did (SGLang measures TTFT and e2e from
    # its tokenizer's receipt: a PD decode pod's include the wait for the prefill); None: ``arrival``
    received: Optional[float] = None
    # the client streams; the token whose time the TTFT observes (SGLang's decode worker, for a
    # request not streamed: its first batched output)
    stream: bool = True
    ttft_token: int = 1
    # the last batched output (time, tokens so far), where outputs are batched (ttft_token > 1)
    chunk_at: Optional[float] = None
    chunk_tokens: int = 0
    # state
    arrival: float = 0.0
    admitted: Optional[float] = None
    kv_ready: Optional[float] = None
    computed: int = 0
    generated: int = 0
    first_token: Optional[float] = None
    last_token: Optional[float] = None
    finished: Optional[float] = None
    itls: list = field(default_factory=list)
    dp_rank: int = 0  # the attention-DP group that serves it (Engine.add)

    @property
    def reserve(self) -> int:
        return self.prompt_tokens + self.max_tokens

    @property
    def ttft(self) -> Optional[float]:
        return None if self.first_token is None else self.first_token - self.arrival


_ids = itertools.count()


class Engine:
    def __init__(
        self,
        clock: Clock,
        cost: CostModel | None = None,
        role: str = "unified",
        *,
        max_num_seqs: int = 256,
        max_batched_tokens: int = 8192,
        kv_capacity_tokens: int | None = None,
        link: Link = LINKS["rdma"],
        sink: Sink | None = None,
        name: str = "",
        dp_ranks: int = 1,
    ):
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self.clock = clock
        self.cost = cost or CostModel()
        self.role = role
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.kv_capacity = kv_capacity_tokens if kv_capacity_tokens is not None else self.cost.kv_capacity_tokens()
        self.link = link
        self.sink = sink or Sink()
        self.name = name or f"{role}-{next(_ids)}"
        # SGLang's attention-DP groups: its DP controller hands each request to one, in turn
        # (--load-balance-method auto: round_robin, arg_groups/serving_hook.py; a PD prefill
        # server's follow_bootstrap_room spreads them alike). The sim schedules the replica as
        # one (the cost model spreads the batch over the groups) and keeps each request's group
        # for the per-group series its schedulers export.
        self.dp_ranks = max(1, dp_ranks)
        self._next_rank = itertools.cycle(range(self.dp_ranks))
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.transferring: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.kv_used = 0
        self.busy = False
        self._kick_pending = False
        self.steps = 0
        self.busy_time = 0.0
        self.completed = 0

    # ---- observable state ---------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running) + len(self.transferring)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.kv_used / self.kv_capacity if self.kv_capacity else 0.0

    # ---- input ------------------------------------------------------------------
    def add(self, req: SimRequest) -> SimRequest:
        if req.prefill_only:
            req.max_tokens = 1  # the prefill instance yields the first token only
        if req.reserve > self.kv_capacity:
            raise ValueError(f"request needs {req.reserve} KV tokens, engine has {self.kv_capacity}")
        req.arrival = self.clock.now()
        req.dp_rank = next(self._next_rank)
        if not req.id:
            req.id = f"req-{next(_ids)}"
        self.waiting.append(req)
        self._kick_soon()
        return req

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client went away); frees its KV."""
        if req.finished is not None:
            return
        if req in self.waiting:
            self.waiting.remove(req)
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.transferring:
            self.transferring.remove(req)
            req.finished = -1.0  # _kv_arrived will ignore it
            self.kv_used -= req.reserve
            return
        else:
            return
        req.finished = -1.0
        self.kv_used -= req.reserve

    # ---- scheduler ------------------------------------------------------------
    def _admit(self, now: float) -> None:
        while self.waiting and self.num_running < self.max_num_seqs:
            req = self.waiting[0]
            if self.kv_used + req.reserve > self.kv_capacity:
                break
            self.waiting.popleft()
            self.kv_used += req.reserve
            req.admitted = now
            self.sink.queue(now - req.arrival, req.dp_rank)
            if req.kv_transfer:
                self.transferring.append(req)
                dt = self.cost.transfer_ms(req.prompt_tokens, self.link) / 1e3
                self.clock.call_later(dt, self._kv_arrived, req)
            else:
                self.running.append(req)

    def _kv_arrived(self, req: SimRequest) -> None:
        if req.finished is not None:  # aborted while transferring
            return
        now = self.clock.now()
        self.transferring.remove(req)
        req.kv_ready = now
        req.computed = req.prompt_tokens
        self.sink.prompt_external(req.prompt_tokens)
        self.sink.transfer(now - req.admitted)
        self.running.append(req)
        self._kick_soon()

    def _kick_soon(self) -> None:
        # batch everything that happens at the same instant into the next step
        if not self._kick_pending and not self.busy:
            self._kick_pending = True
            self.clock.call_later(0.0, self._kick)

    def _kick(self) -> None:
        self._kick_pending = False
        if self.busy:
            return
        now = self.clock.now()
        self._admit(now)
        decodes = [r for r in self.running if r.computed >= r.prompt_tokens]
        budget = self.max_batched_tokens - len(decodes)
        chunks: list[tuple[SimRequest, int]] = []
        for r in self.running:
            if budget <= 0:
                break
            left = r.prompt_tokens - r.computed
            if left > 0:
                n = min(left, budget)
                chunks.append((r, n))
                budget -= n
        if not decodes and not chunks:
            return
        ctx = sum(r.prompt_tokens + r.generated + 1 for r in decodes)
        ms = self.cost.step_ms(len(decodes), ctx, [(r.computed, n) for r, n in chunks])
        self.busy = True
        self.clock.call_later(ms / 1e3, self._step_done, decodes, chunks, now)

    def _step_done(self, decodes: list[SimRequest], chunks: list[tuple[SimRequest, int]], started: float) -> None:
        now = self.clock.now()
        self.busy = False
        self.steps += 1
        self.busy_time += now - started
        for r in decodes:
            if r.finished is None:
                self._token(r, now)
        for r, n in chunks:
            if r.finished is not None:
                continue
            r.computed += n
            if r.computed >= r.prompt_tokens:
                self.sink.prefill_time(now - (r.admitted if r.admitted is not None else r.arrival), r.dp_rank)
                self.sink.prompt_tokens(r.prompt_tokens)
                self._token(r, now)
        self._kick()

    def _token(self, r: SimRequest, now: float) -> None:
        r.generated += 1
        self.sink.generation_tokens(1, r.dp_rank)
        last = r.generated >= r.max_tokens or r.prefill_only
        if r.first_token is None:
            r.first_token = now
        else:
            itl = now - r.last_token
            r.itls.append(itl)
            if r.ttft_token <= 1:
                self.sink.itl(itl)
            elif r.chunk_at is not None and (r.generated % r.ttft_token == 0 or last):
                # outputs batched every ttft_token tokens (SGLang, a request not streamed): each
                # output after the first observes its interval over its tokens, that many times
                # (managers/tokenizer_manager.py collect_metrics, observe_inter_token_latency)
                n = r.generated - r.chunk_tokens
                for _ in range(n):
                    self.sink.itl((now - r.chunk_at) / n)
                r.chunk_at, r.chunk_tokens = now, r.generated
        if r.generated == min(r.ttft_token, r.max_tokens):
            ttft = now - (r.received if r.received is not None else r.arrival)
            if r.stream:
                self.sink.ttft(ttft)
            else:
                self.sink.ttft_batched(ttft)
            r.chunk_at, r.chunk_tokens = now, r.generated
        r.last_token = now
        if r.on_token:
            r.on_token(r, now)
        if last:
            self._finish(r, now)

    def _finish(self, r: SimRequest, now: float) -> None:
        r.finished = now
        self.running.remove(r)
        self.kv_used -= r.reserve
        self.completed += 1
        self.sink.e2e(now - (r.received if r.received is not None else r.arrival))
        if r.first_token is not None:
            self.sink.decode_time(now - r.first_token)
        self.sink.finished(r)
        if r.on_finish:
            r.on_finish(r, now)
