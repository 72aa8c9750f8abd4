"""One keyed work queue for all reconciles.

- coalescing: a key is queued at most once; a key added while it is being
  processed runs once more afterwards (it reads the newest state then), no
  earlier than the delay it was added with (a run that asks to be looked at
  again in 10 s is not repeated at once), and after a failure no later than
  that (an edit that may fix the failure does not wait out the backoff);
- delays: ``add(key, delay)`` runs the key no earlier than that (a burst of
  pod events within the delay collapses into one run), and never later than
  an earlier request for it asked;
- per-key backoff: a failed run is retried after 1, 2, 5, 10, 30, 60 s (the
  last repeating), a success resets it; other keys are not held up;
- ``forget(key)``: a deleted service leaves nothing behind;
- ``active``: workers take keys only while this event is set (the replica
  holds the leader Lease), so a standby keeps its queue warm without writing.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)

BACKOFF_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class WorkQueue:
    def __init__(self, process: Callable[[Hashable], None], backoff: tuple[float, ...] = BACKOFF_SECONDS,
                 clock: Callable[[], float] = time.monotonic, active: threading.Event | None = None):
        self.process, self.backoff, self.clock = process, backoff, clock
        self.active = active
        self._cond = threading.Condition()
        self._due: dict[Hashable, float] = {}        # queued key -> when it may run
        self._heap: list[tuple[float, int, Hashable]] = []
        self._seq = itertools.count()
        self._running: set[Hashable] = set()
        self._dirty: dict[Hashable, float] = {}       # added while running -> earliest due asked
        self._failures: dict[Hashable, int] = {}
        self._stopped = False

    # -- producers -----------------------------------------------------------------
    def add(self, key: Hashable, delay: float = 0.0) -> None:
        with self._cond:
            due = self.clock() + delay
            if key in self._running:
                self._dirty[key] = min(due, self._dirty.get(key, due))
                return
            self._push(key, due)

    def _push(self, key: Hashable, due: float) -> None:
        if key in self._due and self._due[key] <= due:
            return
        self._due[key] = due
        heapq.heappush(self._heap, (due, next(self._seq), key))
        self._cond.notify()

    def forget(self, key: Hashable) -> None:
        """Drop everything kept for ``key`` (a run in progress finishes, and is not repeated)."""
        with self._cond:
            self._due.pop(key, None)
            self._dirty.pop(key, None)
            self._failures.pop(key, None)

    # -- introspection (tests, metrics) ------------------------------------------------
    def pending(self) -> int:
        with self._cond:
            return len(self._due)

    def state_size(self) -> int:
        """Keys remembered for any reason (queued, dirty, backing off)."""
        with self._cond:
            return len(set(self._due) | set(self._dirty) | set(self._failures))

    def failures(self, key: Hashable) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def due_in(self, key: Hashable) -> float | None:
        with self._cond:
            due = self._due.get(key)
            return None if due is None else due - self.clock()

    # -- consumers -----------------------------------------------------------------
    def _take(self, block: bool, timeout: float | None = None) -> Hashable | None:
        deadline = None if timeout is None else self.clock() + timeout
        with self._cond:
            while not self._stopped:
                now = self.clock()
                while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # superseded or forgotten
                if self._heap and self._heap[0][0] <= now and (self.active is None or self.active.is_set()):
                    _, _, key = heapq.heappop(self._heap)
                    del self._due[key]
                    self._running.add(key)
                    return key
                if not block:
                    return None
                if self._heap and (self.active is None or self.active.is_set()):
                    wait = min(1.0, max(0.0, self._heap[0][0] - now))
                else:  # nothing queued, or a standby: sleep until woken (add, wake) or a second passes
                    wait = 1.0
                if deadline is not None:
                    if now >= deadline:
                        return None
                    wait = min(wait, deadline - now)
                self._cond.wait(wait)
        return None

    def _done(self, key: Hashable, ok: bool) -> None:
        with self._cond:
            self._running.discard(key)
            dirty = self._dirty.pop(key, None)
            if ok:
                self._failures.pop(key, None)
                if dirty is not None:
                    self._push(key, dirty)
                return
            n = self._failures.get(key, 0) + 1
            self._failures[key] = n
            retry = self.clock() + self.backoff[min(n, len(self.backoff)) - 1]
            self._push(key, retry if dirty is None else min(retry, dirty))

    def run_once(self) -> Hashable | None:
        """Process one due key on this thread (None: nothing due)."""
        key = self._take(block=False)
        if key is not None:
            self._run(key)
        return key

    def _run(self, key: Hashable) -> None:
        ok = False
        try:
            self.process(key)
            ok = True
        except Exception:
            log.exception("reconcile of %s failed; retrying after backoff", key)
        finally:
            self._done(key, ok)

    def _worker(self) -> None:
        while True:
            key = self._take(block=True)
            if key is None:
                return
            self._run(key)

    def start(self, workers: int = 4) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._worker, name=f"reconcile-{i}", daemon=True) for i in range(workers)]
        for t in threads:
            t.start()
        return threads

    def wake(self) -> None:
        """Re-check the queue (e.g. leadership was just acquired)."""
        with self._cond:
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no key is being processed (at most ``timeout`` s); whether none is."""
        deadline = self.clock() + timeout
        with self._cond:
            while self._running and self.clock() < deadline:
                self._cond.wait(min(0.1, max(0.0, deadline - self.clock())))
            return not self._running

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
