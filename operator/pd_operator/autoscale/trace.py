"""Arrival traces for the autoscaling benchmark: a function of documented parameters.

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
"""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass, field, replace
from typing import Iterator

from ..sim.fleet import LengthDist

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

    @property
    def duration(self) -> float:
        return self.hours * 3600 / self.speed

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
                yield t, self.isl.sample(lrng), self.osl.sample(lrng)


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
