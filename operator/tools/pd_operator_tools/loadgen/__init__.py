"""``pdctl bench``: a goodput benchmark for any OpenAI-compatible endpoint.

Load: one of
  ``--rate R``           open loop at R req/s: Poisson arrivals (the default,
                         ``--arrivals poisson``) or ``--arrivals constant``
                         (request i sent at (i + 1) / R s, exactly 1/R apart);
  ``--concurrency C``    C clients in a closed loop;
  ``--trace-file FILE``  replay recorded arrivals: each request sent at its ``t``
                         with its ``isl`` / ``osl`` (``--isl``/``--osl`` unused),
                         the format the autoscaling simulator reads (CSV with a
                         ``t,isl,osl`` header or JSON Lines ``{"t", "isl", "osl"}``,
                         see ``autoscalesim.trace.load_trace``); a bad line is
                         refused naming the file and line; ``-n`` caps the
                         requests replayed (default: all of them);
  ``--sweep R1,R2,...``  one stage per rate, in order, each ``--duration`` long
                         (``--arrivals`` applies; the warm-up only before the
                         first stage): one summary line per stage, then a table
                         (rate, achieved req/s, TTFT and TPOT p50/p99, goodput);
                         ``--json`` holds every stage (``stages``: rate, summary,
                         requests), ``--csv`` every request with its stage's rate.
Every stage is bounded by ``--num-requests`` and ``--duration`` (no request is
started after the duration; in-flight ones get ``--drain-timeout``). When the
duration stops the run before ``-n`` requests were sent, the summary says so
("stopped at the 60 s duration: 143 of 150 sent"). ``--warmup N`` sends N
requests one after the other first, not counted.
Lengths: ``--isl`` / ``--osl`` as ``N``, ``fixed:N``, ``uniform:MEAN[:HALFWIDTH_FRAC]``
or ``lognormal:MEAN[:SIGMA]``, seeded.

Requests are streamed (SSE) with ``max_tokens = OSL`` and ``ignore_eos`` (vLLM
and SGLang honour it, so the output length is the one asked for).  Prompts are
synthetic words sized by the simulator's tokenisation rule (4 characters per
token; chat adds 4 tokens per message and 3 for the generation prompt), so
against a simulated engine the prompt has exactly ISL tokens; against a real
tokenizer it is approximately ISL.

Measured per request: TTFT = first content chunk - send; ITL = gaps between
content chunks after the first (one chunk per token on vLLM/SGLang defaults),
reported over every gap ("ITL per gap"); TPOT = the request's mean ITL,
(last chunk - first chunk) / (output tokens - 1), what the goodput SLO uses and
what other tools call ITL or TPOT; E2E latency = last byte - send. Output
tokens from ``usage`` when the server sends it (``include_usage``), else the
chunk count; input tokens from ``usage`` too, else the planned ISL.
Goodput: requests that completed with TTFT < the TTFT SLO and TPOT < the ITL
SLO (defaults 1 s and 50 ms), per second and as a share of all requests sent.
Mean concurrency: the sum of the requests' latencies over the wall time.

Did the client keep up? With ``--rate``, ``--sweep`` or ``--trace-file`` each request has a scheduled send time;
its lag is the actual send time minus that. A client that falls behind (a busy
machine, too high a rate for one event loop) sends fewer requests per second
than asked and measures a lighter load: the summary reports the lag (p99, max)
and warns when p99 exceeds 50 ms.
"""

from __future__ import annotations

import asyncio
import csv
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional
from urllib.parse import urlparse

from ..workload import LengthDist
from ..workload import summarize as summarize_requests

WORDS = ("alpha", "bravo", "delta", "kilo", "lima", "papa", "romeo", "tango")


def make_text(tokens: int, rng: random.Random) -> str:
    """Text of exactly ``tokens`` tokens under the 4-characters-per-token rule."""
    chars = max(1, tokens) * 4
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(WORDS) + " "
        out.append(w)
        n += len(w)
    return "".join(out)[:chars]


@dataclass
class Result:
    index: int
    start: float  # seconds since the benchmark started
    isl: int
    osl: int
    ok: bool = False
    error: str = ""
    ttft: Optional[float] = None
    chunk_times: list = field(default_factory=list)  # since start of the request
    output_tokens: int = 0
    prompt_tokens: Optional[int] = None
    latency: Optional[float] = None
    scheduled: Optional[float] = None  # planned send time (``--rate``, ``--trace-file``), seconds since the start

    @property
    def lag(self) -> Optional[float]:
        """Actual minus scheduled send time: how far the client fell behind."""
        return None if self.scheduled is None else self.start - self.scheduled

    @property
    def input_tokens(self) -> int:
        return self.prompt_tokens if self.prompt_tokens is not None else self.isl

    @property
    def itls(self) -> list:
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def mean_itl(self) -> Optional[float]:
        if len(self.chunk_times) < 2:
            return None
        return (self.chunk_times[-1] - self.chunk_times[0]) / max(1, self.output_tokens - 1)


@dataclass
class BenchConfig:
    url: str
    model: Optional[str] = None
    api_key: Optional[str] = None
    rate: Optional[float] = None
    concurrency: Optional[int] = None
    num_requests: Optional[int] = 100  # None: all of the trace file (only with trace_file)
    duration: float = 60.0
    isl: str = "512"
    osl: str = "128"
    chat: bool = True
    seed: int = 0
    ttft_slo: float = 1.0
    itl_slo: float = 0.05
    timeout: float = 300.0
    drain_timeout: float = 120.0
    warmup: int = 0
    arrivals: str = "poisson"            # or "constant": exactly 1/rate apart (with rate or sweep)
    trace_file: Optional[str] = None     # replay (t, isl, osl) from this file instead of rate/concurrency
    sweep: Optional[list] = None         # rates, one stage each (run_sweep)

ARRIVALS = ("poisson", "constant")

# p99 schedule lag above which the summary says the client did not keep up
LAG_WARN_S = 0.05


def check_url(url: str) -> str:
    p = urlparse(url)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise ValueError(f"--url must be an explicit http(s)://host:port URL, got {url!r}")
    host = p.hostname
    if not (host == "localhost" or host.startswith("127.") or host == "::1"):
        print(f"pdctl bench: sending load to {host} (not loopback)", file=sys.stderr)
    base = url.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return base


def summarize(results: list[Result], wall: float, cfg: BenchConfig, planned: Optional[int] = None,
              stopped_by_duration: bool = False) -> dict:
    """:func:`~pd_operator_tools.workload.summarize` plus wall-clock rates,
    end-to-end latency, input tokens, concurrency and schedule lag."""
    from ..workload import quantiles

    s = summarize_requests(results, cfg.ttft_slo, cfg.itl_slo)
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.input_tokens for r in ok)
    per_s = (lambda n: n / wall) if wall > 0 else (lambda n: 0.0)
    lags = [r.lag for r in results if r.lag is not None]
    lag_q = quantiles(lags) | {"max": max(lags) if lags else None}
    return s | {
        "planned": cfg.num_requests if planned is None else planned,
        "stopped_by_duration": stopped_by_duration,
        "duration_limit_s": cfg.duration,
        "warmup": cfg.warmup,
        "duration_s": wall,
        "latency_s": quantiles([r.latency for r in ok if r.latency is not None]),
        "request_throughput": per_s(s["completed"]),
        "output_token_throughput": per_s(out_tokens),
        "input_token_throughput": per_s(in_tokens),
        "output_tokens": out_tokens,
        "input_tokens": in_tokens,
        "mean_concurrency": per_s(sum(r.latency for r in results if r.latency is not None)),
        "goodput_rps": per_s(s["good"]),
        "schedule_lag_s": lag_q,
        "client_kept_up": None if not lags else lag_q["p99"] <= LAG_WARN_S,
        "errors": sorted({r.error for r in results if r.error})[:10],
    }


class _Progress:
    """A bar redrawn with ``\\r`` on a terminal; elsewhere (a log, a pipe) a plain
    line every ``every`` seconds and at the end, so logs hold no ``\\r`` runs."""

    def __init__(self, total: int, stream=sys.stderr, every: float = 5.0):
        self.total, self.done, self.failed, self.stream = total, 0, 0, stream
        self.t0 = time.monotonic()
        self.enabled = True
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.every, self._last_line = every, self.t0

    def tick(self, ok: bool) -> None:
        self.done += 1
        self.failed += 0 if ok else 1
        if not self.enabled:
            return
        el = time.monotonic() - self.t0
        if self.tty:
            width = 30
            frac = min(1.0, self.done / self.total) if self.total else 1.0
            bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
            self.stream.write(f"\r[{bar}] {self.done}/{self.total} done, {self.failed} failed, {el:5.1f}s")
        elif self.done == self.total or time.monotonic() - self._last_line >= self.every:
            self._last_line = time.monotonic()
            self.stream.write(f"bench: {self.done}/{self.total} done, {self.failed} failed, {el:.1f}s\n")
        else:
            return
        self.stream.flush()

    def close(self, sent: int | None = None) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\n")
        elif self.done != self.total or sent is not None and sent != self.total:
            el = time.monotonic() - self.t0
            self.stream.write(f"bench: {self.done}/{self.total if sent is None else sent} done, "
                              f"{self.failed} failed, {el:.1f}s\n")
        self.stream.flush()


async def _one(session, base: str, cfg: BenchConfig, res: Result, rng: random.Random, t_bench0: float) -> None:
    import aiohttp

    headers = {"Content-Type": "application/json"}
    if cfg.api_key:
        headers["Authorization"] = f"Bearer {cfg.api_key}"
    body: dict = {"max_tokens": res.osl, "stream": True, "ignore_eos": True,
                  "stream_options": {"include_usage": True}, "temperature": 0.0}
    if cfg.model:
        body["model"] = cfg.model
    if cfg.chat:
        body["messages"] = [{"role": "user", "content": make_text(max(1, res.isl - 7), rng)}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = make_text(res.isl, rng)
        path = "/v1/completions"
    t0 = time.monotonic()
    res.start = t0 - t_bench0
    chunks = 0
    try:
        async with session.post(base + path, json=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=cfg.timeout)) as resp:
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return
            buf = b""
            async for data in resp.content.iter_any():
                now = time.monotonic()
                buf += data
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            continue
                        msg = json.loads(payload)
                        if msg.get("usage"):
                            res.output_tokens = msg["usage"].get("completion_tokens") or res.output_tokens
                            res.prompt_tokens = msg["usage"].get("prompt_tokens")
                        for ch in msg.get("choices") or []:
                            text = (ch.get("delta") or {}).get("content") if cfg.chat else ch.get("text")
                            if text:
                                chunks += 1
                                if res.ttft is None:
                                    res.ttft = now - t0
                                res.chunk_times.append(now - t0)
            res.latency = time.monotonic() - t0
            if not res.output_tokens:
                res.output_tokens = chunks
            res.ok = res.ttft is not None
            if not res.ok:
                res.error = "no content in the response"
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        if res.latency is None:
            res.latency = time.monotonic() - t0  # a failed request occupied the server this long


def _check(cfg: BenchConfig) -> str:
    """Refuse a configuration that names no load or two, before any request; the base URL."""
    base = check_url(cfg.url)
    given = [name for name, v in (("--rate", cfg.rate), ("--concurrency", cfg.concurrency),
                                  ("--trace-file", cfg.trace_file), ("--sweep", cfg.sweep)) if v is not None]
    if len(given) != 1:
        raise ValueError("give exactly one of --rate, --concurrency, --trace-file and --sweep"
                         + (f" (got {' and '.join(given)})" if given else ""))
    if cfg.arrivals not in ARRIVALS:
        raise ValueError(f"--arrivals must be one of {', '.join(ARRIVALS)}, got {cfg.arrivals!r}")
    if cfg.arrivals != "poisson" and cfg.rate is None and cfg.sweep is None:
        raise ValueError(f"--arrivals {cfg.arrivals} shapes --rate or --sweep arrivals; "
                         f"drop it or use --rate/--sweep (got {given[0]})")
    if cfg.rate is not None and not cfg.rate > 0:
        raise ValueError(f"--rate must be > 0 requests/s, got {cfg.rate:g}")
    if cfg.sweep is not None and (not cfg.sweep or any(not r > 0 for r in cfg.sweep)):
        raise ValueError(f"--sweep must be rates > 0 separated by commas, e.g. 2,4,8; got {cfg.sweep}")
    if cfg.concurrency is not None and cfg.concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {cfg.concurrency}")
    if cfg.num_requests is None and cfg.trace_file is None:
        raise ValueError("--num-requests is needed (all requests of the trace is only for --trace-file)")
    return base


async def _stage(session, base: str, cfg: BenchConfig, plan: list, rate: Optional[float],
                 times: Optional[list], warmup: int, progress: bool, gap_state=None) -> tuple[dict, list[Result]]:
    """One run: ``warmup`` requests one by one, then ``plan`` ((isl, osl), ...)
    at the times ``times`` (seconds from the start; a trace), at ``rate``
    (``cfg.arrivals``) or by ``cfg.concurrency`` closed-loop clients.  Poisson
    gaps come from the seeded generator in ``gap_state`` (after the lengths)."""
    if times is None and rate:
        if cfg.arrivals == "constant":
            times = [(i + 1) / rate for i in range(len(plan))]  # no accumulated rounding
        else:
            rng = random.Random()
            rng.setstate(gap_state)
            t, times = 0.0, []
            for _ in plan:
                t += rng.expovariate(rate)
                times.append(t)
    results: list[Result] = []
    bar = _Progress(len(plan))
    bar.enabled = progress
    stopped_by_duration = False
    for w in range(warmup):  # one after the other, not counted
        wres = Result(-1 - w, 0.0, *plan[w % len(plan)]) if plan else None
        if wres is not None:
            await _one(session, base, cfg, wres, random.Random(cfg.seed * 7 + w), time.monotonic())
            if not wres.ok and progress:
                print(f"pdctl bench: warm-up request failed: {wres.error}", file=sys.stderr)
    t_bench0 = time.monotonic()
    started_at = time.time()  # wall clock of t_bench0, to line other samples up with the requests
    deadline = t_bench0 + cfg.duration

    async def go(i: int, scheduled: Optional[float] = None) -> None:
        res = Result(i, 0.0, *plan[i], scheduled=scheduled)
        results.append(res)
        await _one(session, base, cfg, res, random.Random(cfg.seed * 1_000_003 + i), t_bench0)
        bar.tick(res.ok)

    tasks: list[asyncio.Task] = []
    if times is not None:
        for i in range(len(plan)):
            t = t_bench0 + times[i]
            if t > deadline:
                stopped_by_duration = True
                break
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            tasks.append(asyncio.create_task(go(i, times[i])))
    else:
        counter = iter(range(len(plan)))

        async def worker() -> None:
            nonlocal stopped_by_duration
            for i in counter:
                if time.monotonic() > deadline:
                    stopped_by_duration = True
                    return
                await go(i)

        tasks = [asyncio.create_task(worker()) for _ in range(cfg.concurrency)]
    if tasks:
        _done, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()) + cfg.drain_timeout)
        for p in pending:
            p.cancel()
    bar.close(len(results))
    wall = time.monotonic() - t_bench0
    for r in results:
        if not r.ok and not r.error:
            r.error = "cancelled (duration + drain timeout)"
    results.sort(key=lambda r: r.index)
    summary = summarize(results, wall, cfg, planned=len(plan),
                        stopped_by_duration=stopped_by_duration and len(results) < len(plan))
    return summary | {"started_at": started_at, "warmup": warmup}, results


async def _run(cfg: BenchConfig, progress: bool, on_stage=None) -> list[tuple[Optional[float], dict, list[Result]]]:
    import aiohttp

    base = _check(cfg)
    times = gap_state = None
    if cfg.trace_file is not None:
        from ..autoscalesim.trace import load_trace

        try:
            trace = load_trace(cfg.trace_file)
        except OSError as err:
            raise ValueError(f"--trace-file {cfg.trace_file}: cannot read it ({err.strerror or err})") from None
        reqs = trace.requests[:cfg.num_requests] if cfg.num_requests is not None else trace.requests
        plan = [(isl, osl) for _t, isl, osl, _line in reqs]
        times = [t for t, _isl, _osl, _line in reqs]
    else:
        rng = random.Random(cfg.seed)
        isl, osl = LengthDist.parse(cfg.isl), LengthDist.parse(cfg.osl)
        plan = [(isl.sample(rng), osl.sample(rng)) for _ in range(cfg.num_requests)]
        gap_state = rng.getstate()
    rates = list(cfg.sweep) if cfg.sweep is not None else [cfg.rate]
    out = []
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        for k, rate in enumerate(rates):
            summary, results = await _stage(session, base, cfg, plan, rate, times,
                                            cfg.warmup if k == 0 else 0, progress, gap_state)
            if cfg.sweep is not None:
                summary = summary | {"rate": rate}
            out.append((rate, summary, results))
            if on_stage is not None:
                on_stage(rate, summary)
    return out


async def run_bench(cfg: BenchConfig, progress: bool = True) -> tuple[dict, list[Result]]:
    """One run (``--rate``, ``--concurrency`` or ``--trace-file``): the summary and the requests."""
    if cfg.sweep is not None:
        raise ValueError("--sweep runs several stages: use run_sweep")
    [(_rate, summary, results)] = await _run(cfg, progress)
    return summary, results


async def run_sweep(cfg: BenchConfig, progress: bool = True, on_stage=None) -> list[tuple[float, dict, list[Result]]]:
    """``--sweep``: (rate, summary, requests) per stage, in the order of ``cfg.sweep``;
    ``on_stage(rate, summary)`` is called as each stage ends."""
    if cfg.sweep is None:
        raise ValueError("run_sweep needs cfg.sweep (the rates)")
    return await _run(cfg, progress, on_stage)


def format_summary(s: dict) -> str:
    def ms(v):
        return "       -" if v is None else f"{v * 1e3:8.1f}"
    sent = f"{s['completed']}/{s['sent']} completed ({s['failed']} failed) in {s['duration_s']:.1f} s"
    if s.get("warmup"):
        sent += f", after {s['warmup']} warm-up request(s) not counted"
    lines = [f"requests: {sent}"]
    if s.get("stopped_by_duration"):
        lines.append(f"stopped at the {s['duration_limit_s']:g} s duration: {s['sent']} of {s['planned']} sent "
                     "(raise --duration to send all of -n)")
    lines += [
        f"throughput: {s['request_throughput']:.2f} req/s, {s['input_token_throughput']:.1f} input tok/s, "
        f"{s['output_token_throughput']:.1f} output tok/s; mean concurrency {s['mean_concurrency']:.1f}",
        f"{'(ms)':28}{'mean':>9}{'p50':>9}{'p90':>9}{'p95':>9}{'p99':>9}",
    ]
    for label, key in (("TTFT", "ttft_s"), ("ITL per gap (all tokens)", "itl_s"),
                       ("TPOT (mean ITL per request)", "mean_itl_per_request_s"), ("E2E latency", "latency_s")):
        d = s[key]
        lines.append(f"{label:28}" + " ".join(ms(d[q]) for q in ("mean", "p50", "p90", "p95", "p99")))
    lines.append(f"goodput (TTFT < {s['slo']['ttft_s'] * 1e3:g} ms and TPOT < {s['slo']['mean_itl_s'] * 1e3:g} ms): "
                 f"{s['goodput_rps']:.2f} req/s, {100 * s['goodput_fraction']:.1f}% of requests")
    lag = s.get("schedule_lag_s") or {}
    if lag.get("p99") is not None:
        kept = "kept up with" if s["client_kept_up"] else "FELL BEHIND"
        lines.append(f"client {kept} the arrival schedule: send lag p99 {lag['p99'] * 1e3:.1f} ms, "
                     f"max {lag['max'] * 1e3:.1f} ms"
                     + ("" if s["client_kept_up"] else " (the load was lighter than asked: lower --rate or "
                        "run the client on a less busy machine)"))
    if s["errors"]:
        lines.append("errors: " + "; ".join(s["errors"]))
    return "\n".join(lines)


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:.1f}"


def format_stage(rate: float, s: dict) -> str:
    """One line for a ``--sweep`` stage."""
    line = (f"stage rate {rate:g} req/s: {s['completed']}/{s['sent']} completed ({s['failed']} failed) in "
            f"{s['duration_s']:.1f} s, {s['request_throughput']:.2f} req/s achieved; "
            f"TTFT p50 {_ms(s['ttft_s']['p50'])} p99 {_ms(s['ttft_s']['p99'])} ms, "
            f"TPOT p50 {_ms(s['mean_itl_per_request_s']['p50'])} p99 {_ms(s['mean_itl_per_request_s']['p99'])} ms; "
            f"goodput {s['goodput_rps']:.2f} req/s ({100 * s['goodput_fraction']:.1f}%)")
    if s.get("stopped_by_duration"):
        line += f"; {s['sent']} of {s['planned']} sent in the {s['duration_limit_s']:g} s"
    if s.get("client_kept_up") is False:
        line += f"; client FELL BEHIND the schedule (send lag p99 {_ms(s['schedule_lag_s']['p99'])} ms)"
    return line


def format_sweep(stages: list) -> str:
    """The ``--sweep`` table: one row per stage (rate, summary)."""
    cols = ("rate", "achieved req/s", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "goodput req/s", "goodput %")
    rows = [(f"{rate:g}", f"{s['request_throughput']:.2f}", _ms(s["ttft_s"]["p50"]), _ms(s["ttft_s"]["p99"]),
             _ms(s["mean_itl_per_request_s"]["p50"]), _ms(s["mean_itl_per_request_s"]["p99"]),
             f"{s['goodput_rps']:.2f}", f"{100 * s['goodput_fraction']:.1f}") for rate, s in stages]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    slo = stages[0][1]["slo"] if stages else {"ttft_s": 0, "mean_itl_s": 0}
    lines = [f"sweep (TTFT and TPOT in ms; goodput: TTFT < {slo['ttft_s'] * 1e3:g} ms and "
             f"TPOT < {slo['mean_itl_s'] * 1e3:g} ms)",
             "  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


CSV_FIELDS = ("index", "scheduled_s", "start_s", "lag_s", "isl", "osl", "input_tokens", "output_tokens", "ok",
              "ttft_s", "tpot_s", "latency_s", "error")


def write_csv(path: str, results: list[Result], stages: Optional[list] = None) -> None:
    """One row per request (seconds; empty when not measured).  With ``stages``
    ((rate, requests), ... of a sweep) a first column ``rate`` names each row's
    stage, and times are from the start of that stage."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow((("rate",) if stages is not None else ()) + CSV_FIELDS)
        for rate, rs in stages if stages is not None else [(None, results)]:
            for r in rs:
                w.writerow(([rate] if stages is not None else [])
                           + [r.index, r.scheduled, r.start, r.lag, r.isl, r.osl, r.input_tokens, r.output_tokens,
                              int(r.ok), r.ttft, r.mean_itl, r.latency, r.error])


def _parse_rates(text: str) -> list:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        rates = []
    if not rates or any(not r > 0 for r in rates):
        import argparse

        raise argparse.ArgumentTypeError(f"expected rates > 0 separated by commas, e.g. 2,4,8; got {text!r}")
    return [int(r) if r == int(r) else r for r in rates]


def main_bench(args) -> int:
    n = args.num_requests if args.num_requests is not None else (None if args.trace_file else 100)
    cfg = BenchConfig(url=args.url, model=args.model, api_key=args.api_key, rate=args.rate,
                      concurrency=args.concurrency, num_requests=n, duration=args.duration,
                      isl=args.isl, osl=args.osl, chat=not args.completions, seed=args.seed,
                      ttft_slo=args.ttft_slo, itl_slo=args.itl_slo, timeout=args.timeout,
                      drain_timeout=args.drain_timeout, warmup=args.warmup, arrivals=args.arrivals,
                      trace_file=args.trace_file, sweep=args.sweep)
    try:
        if cfg.sweep is not None and args.plot:
            raise ValueError("--plot draws one run; with --sweep use --json or --csv (every stage)")
        LengthDist.parse(cfg.isl), LengthDist.parse(cfg.osl)
        if cfg.sweep is not None:
            stages = asyncio.run(run_sweep(cfg, progress=not args.quiet,
                                           on_stage=lambda rate, s: print(format_stage(rate, s), flush=True)))
        else:
            summary, results = asyncio.run(run_bench(cfg, progress=not args.quiet))
    except ValueError as err:  # a bad trace file (TraceError) names the file and line
        print(f"pdctl bench: {err}", file=sys.stderr)
        return 2
    if cfg.sweep is not None:
        print(format_sweep([(rate, s) for rate, s, _ in stages]))
        if args.json:
            doc = {"config": asdict(cfg) | {"api_key": "***" if cfg.api_key else None},
                   "stages": [{"rate": rate, "summary": s, "requests": [asdict(r) | {"itls": r.itls} for r in rs]}
                              for rate, s, rs in stages]}
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=1)
        if args.csv:
            write_csv(args.csv, [], stages=[(rate, rs) for rate, _s, rs in stages])
        return 0 if all(s["completed"] for _r, s, _rs in stages) else 1
    print(format_summary(summary))
    if args.json:
        doc = {"config": asdict(cfg) | {"api_key": "***" if cfg.api_key else None}, "summary": summary,
               "requests": [asdict(r) | {"itls": r.itls} for r in results]}
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=1)
    if args.csv:
        write_csv(args.csv, results)
    if args.plot:
        from .plot import write_png

        write_png(args.plot, results, cfg.ttft_slo, cfg.itl_slo)
        print(f"plot: {args.plot}")
    return 0 if summary["completed"] else 1


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="goodput benchmark against an OpenAI-compatible endpoint (TTFT, ITL, goodput)")
    p.add_argument("--url", required=True, help="explicit base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)")
    p.add_argument("--model", help="model name to send (default: none; the server's only model)")
    p.add_argument("--api-key", help="sent as Authorization: Bearer KEY")
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--rate", type=float, help="arrival rate, requests/s (Poisson unless --arrivals constant)")
    load.add_argument("--concurrency", type=int, help="fixed number of clients in a closed loop")
    load.add_argument("--trace-file", metavar="FILE",
                      help="replay recorded arrivals: CSV with a t,isl,osl header or JSON Lines {t, isl, osl} "
                           "(t: seconds from the start); each request sent at its t with its lengths")
    load.add_argument("--sweep", type=_parse_rates, metavar="R1,R2,...",
                      help="one stage per rate, in order, each --duration long; a table at the end")
    p.add_argument("--arrivals", choices=ARRIVALS, default="poisson",
                   help="with --rate/--sweep: poisson (default) or constant (exactly 1/rate apart)")
    p.add_argument("-n", "--num-requests", type=int, default=None,
                   help="at most this many requests per stage (default 100; with --trace-file all of it)")
    p.add_argument("--duration", type=float, default=60.0,
                   help="start no request after this many seconds (default 60); the summary says when it cut -n short")
    p.add_argument("--warmup", type=int, default=0, metavar="N", help="send N requests one by one first, not counted")
    p.add_argument("--drain-timeout", type=float, default=120.0, help="wait this long for in-flight requests after the duration")
    p.add_argument("--timeout", type=float, default=300.0, help="per-request timeout, s")
    p.add_argument("--isl", default="512", help="input length: N | fixed:N | uniform:MEAN[:FRAC] | lognormal:MEAN[:SIGMA]")
    p.add_argument("--osl", default="128", help="output length, same forms")
    p.add_argument("--completions", action="store_true", help="use /v1/completions (default /v1/chat/completions)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ttft-slo", type=float, default=1.0, help="goodput SLO on TTFT, seconds (default 1)")
    p.add_argument("--itl-slo", type=float, default=0.05, help="goodput SLO on mean ITL, seconds (default 0.05)")
    p.add_argument("--json", metavar="FILE", help="write summary and per-request records as JSON")
    p.add_argument("--plot", metavar="FILE", help="write a PNG: TTFT and mean ITL per request over time")
    p.add_argument("--csv", metavar="FILE", help="write one CSV row per request (times in seconds)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress (a bar on a terminal, periodic lines otherwise)")
    p.set_defaults(func=main_bench)
