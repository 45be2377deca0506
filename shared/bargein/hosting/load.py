"""Is this process overloaded? Its event loop says so first.

A process with more work than CPU runs everything late: a timer due in 50 ms fires in 400. That
lateness is what callers feel (every chunk, every interrupt waits in the same loop), so it is what
a service measures to decide it is overloaded, and then it takes no new sessions: a worker stops
taking session starts (another worker with room takes them) and an edge says it is not ready (the
load balancer sends new callers elsewhere). Sessions it has keep running.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time

log = logging.getLogger("bargein.hosting.load")


class LoopLag:
    """The worst lateness of the event loop over the last ``window_s``, sampled every
    ``interval_s``; ``overloaded`` once it passes ``limit_ms``."""

    def __init__(
        self, limit_ms: float, *, interval_s: float = 0.05, window_s: float = 2.0, name: str = ""
    ) -> None:
        self.limit_ms = limit_ms
        self.interval_s = interval_s
        self.window_s = window_s
        self.name = name
        self._samples: collections.deque[tuple[float, float]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._was_overloaded = False

    @property
    def lag_ms(self) -> float:
        cutoff = time.monotonic() - self.window_s
        while self._samples and self._samples[0][0] < cutoff:
            self._samples.popleft()
        return max((lag for _, lag in self._samples), default=0.0)

    @property
    def overloaded(self) -> bool:
        overloaded = self.lag_ms > self.limit_ms
        if overloaded != self._was_overloaded:
            self._was_overloaded = overloaded
            if overloaded:
                log.warning("%s overloaded: its event loop runs %.0f ms late", self.name, self.lag_ms)
            else:
                log.info("%s no longer overloaded", self.name)
        return overloaded

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._sample(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _sample(self) -> None:
        while True:
            due = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            self._samples.append((now, max(0.0, (now - due) * 1000)))
