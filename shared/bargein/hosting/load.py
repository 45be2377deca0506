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
import gc
import logging
import time
from collections.abc import Callable
from typing import Any

from bargein import metrics
from bargein.tasks import cancel_and_wait

log = logging.getLogger("bargein.hosting.load")

LONG_PAUSE_MS = 100.0  # a collection longer than this is logged (at most once a minute)
TELL_EVERY_S = 60.0
THAW_FROM = 100  # sessions held at the busiest below which thawing is not worth a pass
# ... and not while they are falling fast: a thousand callers hanging up at once brought a
# reasoning worker to a quarter of its busiest mid-way, and the thaw there paused it 1.4 s while
# it was ending the rest (issue 27). The thaw waits until the sessions held fell by at most a
# tenth over the last THAW_STEADY_S.
THAW_STEADY_S = 5.0
THAW_STEADY_FALL = 0.1


class LoopLag:
    """The worst lateness of the event loop over the last ``window_s``, sampled every
    ``interval_s``; ``overloaded`` once it passes ``limit_ms``. Each sample also tends the
    process's garbage collector (:class:`Collector`), the usual cause of a late loop in a process
    with many sessions; ``sessions`` says how many it holds."""

    def __init__(
        self,
        limit_ms: float,
        *,
        interval_s: float = 0.05,
        window_s: float = 2.0,
        name: str = "",
        sessions: Callable[[], int] | None = None,
    ) -> None:
        self.limit_ms = limit_ms
        self.interval_s = interval_s
        self.window_s = window_s
        self.name = name
        self._samples: collections.deque[tuple[float, float]] = collections.deque()
        self._task: asyncio.Task[None] | None = None
        self._was_overloaded = False
        self.collector = Collector(name, sessions)  # the usual reason for a late loop

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
        self.collector.start()
        if self._task is None:
            self._task = asyncio.create_task(self._sample(), name="loop-lag")

    async def stop(self) -> None:
        self.collector.stop()
        await cancel_and_wait(self._task)
        self._task = None

    async def _sample(self) -> None:
        while True:
            due = time.monotonic() + self.interval_s
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            self._samples.append((now, max(0.0, (now - due) * 1000)))
            self.collector.tend()


class Collector:
    """Python's garbage collector, kept from pausing a process that holds many sessions.

    A full collection (generation 2) walks every object the process holds, and CPython runs one
    each time a quarter more objects have survived since the last. With thousands of sessions that
    is a pause of hundreds of milliseconds, every few seconds while sessions come in, in which no
    chunk, interrupt or handshake is handled: measured on the 2-core machine, an edge with 1,900
    idle sessions paused 506 ms (and then refused new sessions as overloaded), a reasoning worker
    with 1,770 paused 637-1,276 ms. So what survives a full collection is frozen (``gc.freeze``:
    a session's state lives as long as its call, and is freed by its references when the call
    ends), and later full collections walk only what came after: their pause no longer grows with
    the sessions held.

    The price: a reference cycle among frozen objects is not collected while they stay frozen.
    They are thawed and collected once the process holds at most a quarter of the sessions it held
    when it last did so (a quiet hour, or a drain), and no longer loses them fast (``THAW_STEADY_S``:
    not in the middle of a mass hang-up), when the walk is short, and that pass is
    logged with what it found. Every pass is timed in ``bargein_gc_pause_seconds``, and a long one
    is logged (at most once a minute)."""

    def __init__(
        self,
        name: str,
        sessions: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.sessions = sessions  # how many the process holds now (None: no thaw by sessions)
        self.clock = clock
        self._recent: collections.deque[tuple[float, int]] = collections.deque()  # (when, held)
        self._began = 0.0
        self._told_at = -TELL_EVERY_S
        self._freeze_due = False
        self._froze = False  # whether this collector has frozen anything since it last thawed
        self.peak_since_thaw = 0
        self.longest_ms = 0.0

    def start(self) -> None:
        if self._observe not in gc.callbacks:
            gc.callbacks.append(self._observe)

    def stop(self) -> None:
        """No longer watched; what it froze is handed back to the collector (a process that runs
        services one after another, a test suite, keeps no garbage frozen for good)."""
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._observe)
        if self._froze:
            self._froze = False
            gc.unfreeze()

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        """gc.callbacks: it may run on any thread, so the freeze waits for :meth:`tend`."""
        now = time.perf_counter()
        if phase == "start":
            self._began = now
            return
        seconds = now - self._began
        generation = info.get("generation", 0)
        metrics.GC_PAUSE_SECONDS.labels(generation=str(generation)).observe(seconds)
        self.longest_ms = max(self.longest_ms, seconds * 1000)
        if generation == 2:
            self._freeze_due = True
        if seconds * 1000 > LONG_PAUSE_MS and time.monotonic() - self._told_at > TELL_EVERY_S:
            self._told_at = time.monotonic()
            log.warning(
                "%s: a garbage collection (generation %d) paused it %.0f ms (%d objects collected)",
                self.name,
                generation,
                seconds * 1000,
                info.get("collected", 0),
            )

    def tend(self) -> None:
        """On the event loop, now and then: freeze what the last full collection left, or thaw
        and collect everything once the sessions have mostly gone."""
        held = self._held()
        self.peak_since_thaw = max(self.peak_since_thaw, held)
        steady = self._steady(held)
        if self._freeze_due:
            self._freeze_due = False
            self._froze = True
            gc.freeze()
        # (gc.get_freeze_count() walks every frozen object: it is never asked here)
        elif (
            self._froze and self.peak_since_thaw >= THAW_FROM and held * 4 <= self.peak_since_thaw and steady
        ):
            self.thaw()

    def _steady(self, held: int) -> bool:
        """Whether the sessions held have fallen by at most ``THAW_STEADY_FALL`` over the last
        ``THAW_STEADY_S`` (and that much has been watched): no mass hang-up is under way."""
        now = self.clock()
        recent = self._recent
        recent.append((now, held))
        while len(recent) > 1 and recent[1][0] <= now - THAW_STEADY_S:
            recent.popleft()  # the oldest kept is the last one at least THAW_STEADY_S old
        then, held_then = recent[0]
        return now - then >= THAW_STEADY_S and held_then - held <= held_then * THAW_STEADY_FALL

    def thaw(self) -> None:
        began = time.perf_counter()
        frozen = gc.get_freeze_count()
        gc.unfreeze()
        collected = gc.collect()
        gc.freeze()
        log.info(
            "%s: thawed %d objects kept since its busiest (%d sessions) and collected %d in %.0f ms",
            self.name,
            frozen,
            self.peak_since_thaw,
            collected,
            (time.perf_counter() - began) * 1000,
        )
        self.peak_since_thaw = self._held()
        self._freeze_due = False
        self._froze = True

    def _held(self) -> int:
        return self.sessions() if self.sessions is not None else 0
