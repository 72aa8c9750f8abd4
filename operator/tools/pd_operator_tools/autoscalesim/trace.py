"""Arrival traces for the simulator: synthetic (a function of documented
parameters) or recorded (a file of arrivals, :func:`load_trace`).

``rate(t)`` (requests/s at second ``t`` of the day) is a smooth base curve
through ``knots`` (hour, req/s) -- cosine interpolation between consecutive
knots, periodic over 24 h -- multiplied by zero or more :class:`Surge` s (a
linear ramp from 1 to ``factor`` over ``ramp_up_min``, hold until
``end_h``, linear ramp back over ``ramp_down_min``).  Arrivals are Poisson
(thinning of a homogeneous process at the peak rate), lengths lognormal with
caps; everything is drawn from ``random.Random(seed)``, so a trace is a pure
function of its parameters.

The reference day (BASELINES.md): trough 5 req/s at 04:00, plateau 20 req/s
09:00-22:30 (19:00-20:00 included), a 3x surge (60 req/s) from 20:00 with a
15-minute ramp up, held until 22:00, 30-minute ramp down::

    REFERENCE                                   # the day
    replace(REFERENCE, surges=REFERENCE.surges + (Surge(13.0, 15, 14.0, 30, 2.0),))  # a second surge
    replace(REFERENCE, knots=((4, 5), (16, 20), (22.5, 20)))                            # a slow ramp
    replace(REFERENCE, surges=(Surge(11.0, 1, 11.25, 1, 4.0),))                         # a flash crowd

A recorded trace is one request per line, CSV with a header or JSON Lines:
``t`` (seconds from the start of the trace, the request's arrival), ``isl``
(prompt tokens) and ``osl`` (generated tokens); other columns/keys are
ignored, blank lines and lines starting with ``#`` too::

    t,isl,osl                      {"t": 0.0, "isl": 1834, "osl": 412}
    0.000,1834,412                 {"t": 0.21, "isl": 2950, "osl": 1033}
    0.210,2950,1033
"""

from __future__ import annotations

import csv
import functools
import json
import math
import random
from dataclasses import dataclass, field, replace
from typing import Iterator

from ..workload import LengthDist

DAY = 86400.0


@dataclass(frozen=True)
class Surge:
    start_h: float          # ramp up begins (hour of day)
    ramp_up_min: float      # minutes from x1 to x factor
    end_h: float            # ramp down begins
    ramp_down_min: float    # minutes from x factor back to x1
    factor: float = 3.0

    def multiplier(self, h: float) -> float:
        up_end = self.start_h + self.ramp_up_min / 60
        down_end = self.end_h + self.ramp_down_min / 60
        if h < self.start_h or h >= down_end:
            return 1.0
        if h < up_end:
            return 1 + (self.factor - 1) * (h - self.start_h) / (up_end - self.start_h)
        if h < self.end_h:
            return self.factor
        return self.factor - (self.factor - 1) * (h - self.end_h) / (down_end - self.end_h)


@dataclass(frozen=True)
class Trace:
    knots: tuple = ((4.0, 5.0), (9.0, 20.0), (22.5, 20.0))  # (hour, req/s), periodic over 24 h
    surges: tuple = (Surge(20.0, 15, 22.0, 30, 3.0),)
    isl: LengthDist = field(default_factory=lambda: LengthDist("lognormal", 2000, 0.6, 1, 8192))
    osl: LengthDist = field(default_factory=lambda: LengthDist("lognormal", 1000, 0.6, 1, 4096))
    seed: int = 20251130
    start_h: float = 0.0     # simulated window: [start_h, start_h + hours) of the day
    hours: float = 24.0
    speed: float = 1.0       # > 1: the day's shape compressed (t simulated seconds = t*speed seconds of the day)
    rate_scale: float = 1.0  # all rates multiplied (e.g. 0.25 for a quick smoke run)
    # workload-mix shifts: ((from hour of day, ISL LengthDist, OSL LengthDist), ...) in hour order;
    # a request arriving at or after ``from`` draws its lengths from the last shift begun
    mix: tuple = ()

    @property
    def duration(self) -> float:
        return self.hours * 3600 / self.speed

    def lengths_at(self, t: float) -> tuple[LengthDist, LengthDist]:
        """The (ISL, OSL) distributions of a request arriving at simulated second ``t``."""
        h = self.hour_at(t)
        isl, osl = self.isl, self.osl
        for from_h, i, o in self.mix:
            if h >= from_h:
                isl, osl = i, o
        return isl, osl

    def base(self, h: float) -> float:
        ks, pts = _points(self.knots)
        h = h % 24
        for (h0, r0), (h1, r1) in zip(pts, pts[1:]):
            if h0 <= h < h1:
                x = (h - h0) / (h1 - h0)
                return r0 + (r1 - r0) * (1 - math.cos(math.pi * x)) / 2
        return ks[0][1]

    def hour_at(self, t: float) -> float:
        """Hour of day at simulated second ``t`` (t = 0 is ``start_h``)."""
        return self.start_h + t * self.speed / 3600

    def rate(self, t: float) -> float:
        h = self.hour_at(t)
        m = 1.0
        for s in self.surges:
            m *= s.multiplier(h % 24)
        return self.base(h) * m * self.rate_scale

    def peak_rate(self) -> float:
        step = 30.0 / self.speed
        n = int(self.duration / step) + 1
        return max(self.rate(i * step) for i in range(n + 1))

    def arrivals(self) -> Iterator[tuple[float, int, int]]:
        """(time s, ISL, OSL) in time order, deterministic for the parameters."""
        rng = random.Random(self.seed)
        lrng = random.Random(self.seed + 1)
        rmax = self.peak_rate() * 1.001 + 1e-9
        t, end = 0.0, self.duration
        while True:
            t += rng.expovariate(rmax)
            if t >= end:
                return
            if rng.random() * rmax < self.rate(t):
                isl, osl = self.lengths_at(t) if self.mix else (self.isl, self.osl)
                yield t, isl.sample(lrng), osl.sample(lrng)


@functools.lru_cache(maxsize=64)
def _points(knots: tuple) -> tuple:
    ks = sorted(knots)
    return ks, [(k[0] - 24, k[1]) for k in ks[-1:]] + list(ks) + [(k[0] + 24, k[1]) for k in ks[:1]]


REFERENCE = Trace()

TRACES = {
    "reference": REFERENCE,
    "second-surge": replace(REFERENCE, surges=REFERENCE.surges + (Surge(13.0, 15, 14.0, 30, 2.0),)),
    "slow-ramp": replace(REFERENCE, knots=((4.0, 5.0), (16.0, 20.0), (22.5, 20.0))),
    "flash-crowd": replace(REFERENCE, surges=(Surge(11.0, 1, 11.25, 1, 4.0),)),
}


# --------------------------------------------------------------------------- recorded traces
class TraceError(ValueError):
    """A recorded trace that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class RecordedTrace:
    """Arrivals read from a file: the same interface as :class:`Trace` for the simulator."""

    path: str
    requests: tuple          # ((t, isl, osl, line), ...) sorted by t
    start_h: float = 0.0     # for plots only: the recording is not tied to an hour of the day
    speed: float = 1.0
    rate_scale: float = 1.0
    seed: int | None = None

    @property
    def duration(self) -> float:
        last = self.requests[-1][0] if self.requests else 0.0
        return max(60.0, math.ceil(last / 60) * 60)  # to the end of the last arrival's minute

    @property
    def hours(self) -> float:
        return self.duration / 3600

    @property
    def isl_mean(self) -> float:
        return sum(r[1] for r in self.requests) / len(self.requests)

    @property
    def osl_mean(self) -> float:
        return sum(r[2] for r in self.requests) / len(self.requests)

    def arrivals(self) -> Iterator[tuple[float, int, int]]:
        for t, isl, osl, _ in self.requests:
            yield t, isl, osl

    @functools.cached_property
    def _per_min(self) -> list[int]:
        n = [0] * (int(self.duration // 60) + 1)
        for t, *_ in self.requests:
            n[int(t // 60)] += 1
        return n

    def rate(self, t: float) -> float:
        """Requests/s in the minute holding ``t`` (for the timeline)."""
        m = int(t // 60)
        return self._per_min[m] / 60 if 0 <= m < len(self._per_min) else 0.0


def _number(value, what: str, where: str, integer: bool) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {what} must be a number, got {value!r}") from None
    if math.isnan(x) or math.isinf(x):
        raise TraceError(f"{where}: {what} must be a finite number, got {value!r}")
    if integer:
        if x != int(x) or x < 1:
            raise TraceError(f"{where}: {what} must be a whole number of tokens >= 1, got {value!r}")
        return int(x)
    if x < 0:
        raise TraceError(f"{where}: {what} must be >= 0 (seconds from the start of the trace), got {value!r}")
    return x


def load_trace(path: str) -> RecordedTrace:
    """Read a recorded trace (CSV with a ``t,isl,osl`` header, or JSON Lines; see the module doc).

    The format is JSON Lines when the first non-blank, non-comment line starts
    with ``{``, CSV otherwise.  Arrivals need not be sorted.  Raises
    :class:`TraceError` naming the file and the line of the first bad record,
    ``OSError`` when the file cannot be read."""
    with open(path, encoding="utf-8", newline="") as fh:
        lines = fh.read().splitlines()
    body = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip() and not ln.lstrip().startswith("#")]
    if not body:
        raise TraceError(f"{path}: no requests (expected a CSV header t,isl,osl or JSON Lines)")
    out = []
    if body[0][1].lstrip().startswith("{"):
        for no, ln in body:
            where = f"{path}:{no}"
            try:
                rec = json.loads(ln)
            except json.JSONDecodeError as err:
                raise TraceError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(rec, dict):
                raise TraceError(f"{where}: expected a JSON object with t, isl, osl")
            missing = [k for k in ("t", "isl", "osl") if k not in rec]
            if missing:
                raise TraceError(f"{where}: missing {', '.join(missing)} (each line needs t, isl, osl)")
            out.append((_number(rec["t"], "t", where, False), _number(rec["isl"], "isl", where, True),
                        _number(rec["osl"], "osl", where, True), no))
    else:
        header_no, header = body[0]
        cols = [c.strip().lower() for c in next(csv.reader([header]))]
        missing = [k for k in ("t", "isl", "osl") if k not in cols]
        if missing:
            raise TraceError(f"{path}:{header_no}: the CSV header must name the columns t, isl, osl "
                             f"(missing {', '.join(missing)}; got {header.strip()!r})")
        ix = {k: cols.index(k) for k in ("t", "isl", "osl")}
        for no, ln in body[1:]:
            where = f"{path}:{no}"
            row = next(csv.reader([ln]))
            if len(row) < len(cols):
                raise TraceError(f"{where}: {len(row)} fields, the header has {len(cols)}")
            out.append((_number(row[ix["t"]].strip(), "t", where, False),
                        _number(row[ix["isl"]].strip(), "isl", where, True),
                        _number(row[ix["osl"]].strip(), "osl", where, True), no))
        if not out:
            raise TraceError(f"{path}: a header but no requests")
    out.sort(key=lambda r: (r[0], r[3]))
    return RecordedTrace(path, tuple(out))
