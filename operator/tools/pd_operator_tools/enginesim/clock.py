"""Injectable clocks: the same engine runs in real time or in virtual time.

Both offer ``now()`` (seconds) and ``call_at(t, fn, *args)``.
``AsyncioClock`` is the event loop's monotonic clock; ``VirtualClock`` is a
discrete-event queue that jumps from event to event (``run()``), so a benchmark
of minutes of traffic runs in well under a second of CPU.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from typing import Any, Callable


class VirtualClock:
    def __init__(self, start: float = 0.0):
        self._t = start
        self._heap: list[tuple[float, int, Callable, tuple]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._t

    def call_at(self, t: float, fn: Callable, *args: Any) -> None:
        heapq.heappush(self._heap, (max(t, self._t), next(self._seq), fn, args))

    def call_later(self, dt: float, fn: Callable, *args: Any) -> None:
        self.call_at(self._t + dt, fn, *args)

    def run(self, until: float | None = None, max_events: int | None = None) -> int:
        """Run events in time order (ties: in scheduling order); returns how many ran."""
        n = 0
        while self._heap:
            if until is not None and self._heap[0][0] > until:
                self._t = until
                break
            t, _, fn, args = heapq.heappop(self._heap)
            self._t = t
            fn(*args)
            n += 1
            if max_events is not None and n >= max_events:
                break
        return n

    def pending(self) -> int:
        return len(self._heap)


class AsyncioClock:
    def __init__(self, loop: asyncio.AbstractEventLoop | None = None):
        self._loop = loop or asyncio.get_running_loop()

    def now(self) -> float:
        return self._loop.time()

    def call_at(self, t: float, fn: Callable, *args: Any) -> None:
        self._loop.call_at(t, fn, *args)

    def call_later(self, dt: float, fn: Callable, *args: Any) -> None:
        self._loop.call_later(dt, fn, *args)
