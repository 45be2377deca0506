"""One VAD batcher per speech process: every session's windows go through shared inference calls.

Sessions hand the batcher full 512-sample windows (:meth:`VadBatcher.submit`) as their audio
arrives. Every ``vad_tick_ms`` the batcher takes one window from each session that has one (up to
``vad_max_batch`` sessions) and runs them in ONE inference call; it repeats while windows that
were waiting at the start of the tick remain (a session that fell behind catches up one window per
call, never two in the same call, because its next window needs this one's state). Then it hands
each session its probabilities, in window order. Collecting for a few milliseconds costs a little
latency (at most a tick) and buys the batch: see ``bargein bench vad``.

Inference runs on a single worker thread (onnxruntime releases the GIL), so the event loop keeps
consuming mailboxes, including the reasoning side's interrupts it must forward, while a batch runs.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from collections.abc import Callable

import numpy as np

from bargein import metrics
from bargein.metrics import Counted
from bargein.speech.vad import (
    PCM16_SCALE,
    WINDOW_BYTES,
    WINDOW_SAMPLES,
    Floats,
    SileroModel,
    VadStream,
    infer_batch,
    shared_model,
)
from bargein.tasks import cancel_and_wait

log = logging.getLogger("bargein.speech.batcher")

DEFAULT_LOG_INTERVAL_S = 30.0


class VadSlot:
    """A session's place in the batcher: its VAD state, its windows waiting for inference, and
    where its probabilities go. ``room`` is set while the backlog is under ``backlog_limit``, so
    the session can stop taking audio from its mailbox (where old audio is dropped) instead of
    buffering without bound here."""

    def __init__(self, name: str, deliver: Callable[[list[float]], None], backlog_limit: int) -> None:
        self.name = name
        self.deliver = deliver
        self.backlog_limit = backlog_limit
        self.stream = VadStream()
        self.pending: collections.deque[bytes] = collections.deque()
        self.room = asyncio.Event()
        self.room.set()
        self.closed = False

    def _update_room(self) -> None:
        if len(self.pending) < self.backlog_limit:
            self.room.set()
        else:
            self.room.clear()

    async def wait_for_room(self) -> None:
        while not self.closed and len(self.pending) >= self.backlog_limit:
            self.room.clear()
            await self.room.wait()


class VadBatcher:
    def __init__(
        self,
        model: SileroModel | None = None,
        *,
        tick_ms: float = 8.0,
        max_batch: int = 256,
        backlog_limit: int = 64,
        log_interval_s: float = DEFAULT_LOG_INTERVAL_S,
    ) -> None:
        self.model = model or shared_model()
        self.tick_s = tick_ms / 1000
        self.max_batch = max_batch
        self.backlog_limit = backlog_limit
        self.log_interval_s = log_interval_s
        self.slots: dict[VadSlot, None] = {}  # insertion-ordered set
        self._ready: dict[VadSlot, None] = {}  # slots with windows waiting, in arrival order
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.counters: collections.Counter[str] = Counted("vad")
        self.max_seen_batch = 0
        self.inference_cpu_s = 0.0  # CPU time of the inference thread (model + stacking)
        self._window: collections.Counter[str] = collections.Counter()
        self._window_cpu_s = 0.0
        self._window_max_batch = 0
        self._last_log = time.monotonic()

    # --- sessions ----------------------------------------------------------------------------------

    def register(self, name: str, deliver: Callable[[list[float]], None]) -> VadSlot:
        """A new session: fresh VAD state (the policy counts windows from here)."""
        slot = VadSlot(name, deliver, self.backlog_limit)
        self.slots[slot] = None
        self._ensure_running()
        return slot

    def unregister(self, slot: VadSlot) -> None:
        slot.closed = True
        slot.pending.clear()
        slot.room.set()  # release a handler waiting for room
        self.slots.pop(slot, None)
        self._ready.pop(slot, None)

    def submit(self, slot: VadSlot, window: bytes) -> None:
        """Queue one full window (512 PCM16 samples) of ``slot``'s audio for the next tick."""
        if len(window) != WINDOW_BYTES:
            raise ValueError(f"a VAD window is {WINDOW_BYTES} bytes, got {len(window)}")
        if slot.closed:
            return
        slot.pending.append(window)
        slot._update_room()
        self._ready[slot] = None
        if self._wakeup is not None:
            self._wakeup.set()

    # --- one tick, usable without an event loop (the bench drives it directly) ---------------------

    def collect(self, quota: dict[VadSlot, int]) -> tuple[list[VadSlot], list[bytes]]:
        """The next batch: one window each from up to ``max_batch`` slots that still have quota,
        oldest-waiting slots first; a slot that still has windows goes to the back of the line."""
        slots: list[VadSlot] = []
        windows: list[bytes] = []
        for slot in list(self._ready):
            if len(slots) >= self.max_batch:
                break
            if slot.closed or not slot.pending:
                self._ready.pop(slot, None)
                continue
            if quota.get(slot, 0) <= 0:
                continue
            quota[slot] -= 1
            slots.append(slot)
            windows.append(slot.pending.popleft())
            slot._update_room()
            del self._ready[slot]
            if slot.pending:
                self._ready[slot] = None
        return slots, windows

    def infer(self, slots: list[VadSlot], windows: list[bytes]) -> Floats:
        """ONE inference call for the batch: PCM16 → float for all rows at once, then the model."""
        audio = np.frombuffer(b"".join(windows), dtype="<i2").reshape(len(windows), WINDOW_SAMPLES)
        batch = audio.astype(np.float32) / np.float32(PCM16_SCALE)
        return infer_batch([slot.stream for slot in slots], batch, self.model)

    def _infer_timed(self, slots: list[VadSlot], windows: list[bytes]) -> tuple[Floats, float]:
        """:meth:`infer` and the CPU time it took on the thread that ran it."""
        started = time.thread_time()
        probabilities = self.infer(slots, windows)
        return probabilities, time.thread_time() - started

    def _account(self, size: int, cpu_s: float) -> None:
        metrics.VAD_BATCH_SESSIONS.observe(size)
        metrics.VAD_TICK_SECONDS.observe(cpu_s)
        self._window_cpu_s += cpu_s
        self.counters["calls"] += 1
        self.counters["windows"] += size
        self._window["calls"] += 1
        self._window["windows"] += size
        self.max_seen_batch = max(self.max_seen_batch, size)
        self._window_max_batch = max(self._window_max_batch, size)

    def _collect_results(
        self, slots: list[VadSlot], probabilities: Floats, cpu_s: float, results: dict[VadSlot, list[float]]
    ) -> int:
        """Count one inference call and file its probabilities per session, in window order."""
        self._account(len(slots), cpu_s)
        for slot, probability in zip(slots, probabilities.tolist(), strict=True):
            results[slot].append(probability)
        return len(slots)

    def _snapshot(self) -> dict[VadSlot, int]:
        return {slot: len(slot.pending) for slot in self._ready}

    @staticmethod
    def _dispatch(results: dict[VadSlot, list[float]]) -> None:
        for slot, probabilities in results.items():
            if slot.closed:
                continue
            try:
                slot.deliver(probabilities)
            except Exception:
                log.exception("session %s: handling VAD probabilities failed", slot.name)

    def step(self) -> int:
        """One tick, synchronously: every window waiting now, in as few calls as the batch size
        allows; then each session gets its probabilities in order. Returns windows processed."""
        quota = self._snapshot()
        results: dict[VadSlot, list[float]] = collections.defaultdict(list)
        done = 0
        while True:
            slots, windows = self.collect(quota)
            if not slots:
                break
            done += self._collect_results(slots, *self._infer_timed(slots, windows), results)
        self._dispatch(results)
        return done

    # --- the service's tick loop ------------------------------------------------------------------

    def _ensure_running(self) -> None:
        """Start the tick loop in the running event loop (none: driven by :meth:`step`, as the bench
        does)."""
        if self._task is not None and not self._task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._wakeup = asyncio.Event()
        if self._ready:
            self._wakeup.set()
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="vad")
        self._task = loop.create_task(self._loop(), name="vad-batcher")
        log.info(
            "VAD batcher running: a tick every %.1f ms, up to %d sessions per inference call",
            self.tick_s * 1000,
            self.max_batch,
        )

    async def tick(self) -> int:
        """One tick with inference on the worker thread; the event loop stays free meanwhile."""
        loop = asyncio.get_running_loop()
        quota = self._snapshot()
        results: dict[VadSlot, list[float]] = collections.defaultdict(list)
        done = 0
        while True:
            slots, windows = self.collect(quota)
            if not slots:
                break
            try:
                probabilities, cpu_s = await loop.run_in_executor(
                    self._executor, self._infer_timed, slots, windows
                )
            except Exception:
                # the windows are lost; the sessions' policies will count fewer windows than arrived
                log.exception("VAD inference failed for a batch of %d windows; dropped", len(slots))
                self.counters["failed_windows"] += len(slots)
                continue
            done += self._collect_results(slots, probabilities, cpu_s, results)
        self._dispatch(results)
        self.counters["ticks"] += 1
        self._window["ticks"] += 1
        self._maybe_log()
        return done

    async def _loop(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            await asyncio.sleep(self.tick_s)  # let the other sessions' windows arrive: that is the batch
            self._wakeup.clear()
            try:
                await self.tick()
            except Exception:
                log.exception("VAD tick failed; carrying on")

    def _maybe_log(self) -> None:
        now = time.monotonic()
        elapsed = now - self._last_log
        if elapsed < self.log_interval_s or not self._window["windows"]:
            return
        windows, calls = self._window["windows"], self._window["calls"]
        log.info(
            "VAD: %d sessions; %d ticks, %d calls, %d windows in %.0f s (mean batch %.1f, max %d); "
            "inference %.0f µs CPU per window, %.1f%% of a core",
            len(self.slots),
            self._window["ticks"],
            calls,
            windows,
            elapsed,
            windows / calls,
            self._window_max_batch,
            self._window_cpu_s / windows * 1e6,
            self._window_cpu_s / elapsed * 100,
        )
        self.inference_cpu_s += self._window_cpu_s
        self._window.clear()
        self._window_cpu_s = 0.0
        self._window_max_batch = 0
        self._last_log = now

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
