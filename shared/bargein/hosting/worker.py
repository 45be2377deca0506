"""A worker process's session ownership loop for one tier.

New sessions arrive on the tier's shared work queue; whichever worker has room takes one (competing
consumers: this is the load balancer). Sessions whose owner died are found in the session
directory (registered, but nobody holds the lease) and adopted by any worker with room. On SIGTERM
a worker drains: it stops taking sessions, checkpoints and releases every lease, so other workers
adopt them at their next look, resuming any turn that was running.

A partitioned tier (``BARGEIN_MAILBOXES=partitioned``) balances by partitions instead
(:mod:`bargein.hosting.partitions`): a session belongs to the worker that holds its partition, its
start comes down the partition, and a worker adopts only the orphans of its own partitions (it
cannot refuse them for want of room: ``BARGEIN_MAX_SESSIONS`` does not apply).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from bargein import metrics
from bargein.errors import EnvelopeError, SessionRejected
from bargein.hosting.host import SessionHost, SessionTaken
from bargein.hosting.load import LoopLag
from bargein.hosting.partitions import PartitionKeeper
from bargein.hosting.sessions import end_session
from bargein.tasks import cancel_and_wait
from bargein.transport.abc import Subscription
from bargein.wire.session_info import SessionInfo

log = logging.getLogger("bargein.hosting.worker")

# A drain waits up to BARGEIN_DRAIN_TIMEOUT_S twice (a partition keeper's round, then the turns);
# this much more is for checkpointing and releasing every session. Past it, the drain is stuck:
# what every task is doing is logged, once, so that an operator sees why the process is not stopping.
DRAIN_SPARE_S = 30.0
LOGGED_STUCK_TASKS = 20


class Worker:
    def __init__(
        self,
        host: SessionHost,
        *,
        max_sessions: int = 500,
        adopt_interval_s: float = 1.0,
        status_interval_s: float = 1.0,
        drain_timeout_s: float = 10.0,
        liveness_ttl_ms: int = 1000,
        overload_lag_ms: float = 500.0,
    ) -> None:
        self.host = host
        self.load = LoopLag(
            overload_lag_ms, name=f"{host.tier} worker {host.owner}", sessions=lambda: len(host.sessions)
        )
        self.liveness_ttl_ms = liveness_ttl_ms
        self.max_sessions = max_sessions
        self.adopt_interval_s = adopt_interval_s
        self.status_interval_s = status_interval_s
        self.drain_timeout_s = drain_timeout_s
        self.draining = False
        self.drain_limit_s = 2 * drain_timeout_s + DRAIN_SPARE_S  # past it, the drain says what is stuck
        self.adopted = 0
        self.started = 0
        self.refused_starts = 0  # offered while full or overloaded: left for another worker
        self._starts: Subscription | None = None
        self._tasks: list[asyncio.Task[None]] = []
        partitions = host.transport.partitions(host.tier)
        self.partitions = (
            PartitionKeeper(
                host, partitions, self._on_start, ttl_ms=2 * liveness_ttl_ms, hand_over_s=drain_timeout_s
            )
            if partitions
            else None
        )
        if self.partitions is not None:
            host.accepts = self._mine

    @property
    def room(self) -> int:
        if self.draining:
            return 0
        if self.partitions is not None:  # no limit: a partition's sessions are its owner's
            return self.max_sessions  # (at most this many adopted at one look)
        return self.max_sessions - len(self.host.sessions)

    @property
    def consuming(self) -> bool:
        """It takes session starts (between start and drain)."""
        started = self._starts is not None or (self.partitions is not None and self.partitions.running)
        return started and not self.draining

    @property
    def takes_new_sessions(self) -> bool:
        """New sessions go to a worker with room that keeps up. An overloaded one still adopts a
        dead worker's sessions: those calls exist already and have nowhere else to wait. (A
        partition's sessions have nowhere else to go at all.)"""
        return self.room > 0 and (self.partitions is not None or not self.load.overloaded)

    def _mine(self, session_id: str) -> bool:
        """Whether this worker may take ``session_id``: with partitions, only its partitions'."""
        return self.partitions is None or (not self.draining and self.partitions.holds(session_id))

    async def start(self) -> None:
        tier = self.host.tier
        self.host.keep_alive(self.liveness_ttl_ms)
        self.load.start()
        if self.partitions is not None:
            await self.partitions.start()
        else:
            self._starts = await self.host.transport.consume_session_starts(tier, self._on_start)
        self._tasks = [
            asyncio.create_task(self._adopt_loop(), name=f"adopt:{tier}"),
            asyncio.create_task(self._watch_loop(), name=f"watch:{tier}"),
            asyncio.create_task(self._status_loop(), name=f"status:{tier}"),
        ]
        if self.partitions is not None:  # ("ready (up to": what scripts and tests wait for)
            share = f"its share of {self.partitions.count} partitions, {len(self.partitions.held)} held now"
            log.info("%s worker %s ready (up to %s)", tier, self.host.owner, share)
        else:
            log.info("%s worker %s ready (up to %d sessions)", tier, self.host.owner, self.max_sessions)

    async def _on_start(self, raw: bytes) -> bool:
        info = SessionInfo.decode(raw)
        if info.session_id in self.host.sessions:
            return True
        if not self._mine(info.session_id):
            return False  # its partition is being handed over: for the next owner
        if not self.takes_new_sessions:
            self.refused_starts += 1
            return False
        # registered before its start is offered (create_session): not there = ended already (the
        # caller hung up while every worker was busy); opening it would make a session no one uses
        if await self.host.store.session_info(self.host.tier, info.session_id) is None:
            log.info("session %s ended before a worker took it; dropping its start", info.session_id)
            return True
        try:
            await self.host.open(info)
        except SessionTaken:
            log.info("session %s is already owned elsewhere", info.session_id)
            return True
        except SessionRejected:  # the host ended it: nothing to retry
            return True
        self.started += 1
        return True

    async def adopt_orphans(self) -> int:
        """Take over sessions nobody owns (their owner died or drained). Returns how many."""
        room = self.room
        if room <= 0:
            return 0
        taken = 0
        orphans = await self.host.store.orphaned_sessions(self.host.tier, limit=room, wanted=self._mine)
        for session_id, raw in orphans:
            if not self._mine(session_id) or session_id in self.host.sessions:
                continue
            if await self._call_over(session_id):
                continue
            try:
                runtime = await self.host.open(SessionInfo.decode(raw))
            except (SessionTaken, SessionRejected):
                continue  # another worker was quicker, or the agent declined it (and it is ended)
            except EnvelopeError as exc:
                log.warning("dropping unreadable directory entry %s: %s", session_id, exc)
                await self.host.store.unregister_session(self.host.tier, session_id)
                continue
            taken += 1
            metrics.count(self.host.tier, "adopted_orphans")
            log.info("adopted session %s (epoch %d)", session_id, runtime.epoch)
        self.adopted += taken
        return taken

    async def _call_over(self, session_id: str, replacing: str | None = None) -> bool:
        """Whether the session's call is over though nobody ended it: its caller left (or never
        came) longer ago than the edge waits (``BARGEIN_RECONNECT_GRACE_S``) and no edge was there
        to end it. Such a session is ended here on every tier, not adopted."""
        host = self.host
        deadline = await host.store.caller_deadline(session_id)
        if deadline is None or deadline > time.time():
            return False
        why = f"its caller left; the reconnect grace ran out {time.time() - deadline:.0f} s ago"
        by = host.owner
        await end_session(
            host.transport, host.store, session_id, by=by, reason=why, source=by, replacing=replacing
        )
        metrics.count(host.tier, "ended_not_adopted")
        log.info("session %s: %s; ended, not adopted", session_id, why)
        return True

    async def take_over_dead_workers(self) -> int:
        """Take the sessions of workers whose heartbeat stopped, without waiting for each session's
        lease to run out (a killed worker's sessions resume within about the liveness TTL)."""
        tier, store, taken = self.host.tier, self.host.store, 0
        for dead in await store.dead_workers(tier):
            if dead == self.host.owner:
                continue
            if self.partitions is not None:  # its partitions first: then its sessions are ours
                await self.partitions.take_from_dead(dead)
            for session_id in await store.owned_sessions(tier, dead):
                if self.room <= 0:
                    return taken
                if not self._mine(session_id):
                    continue  # another partition's: its owner takes it
                raw = await store.session_info(tier, session_id)
                if raw is None or await self._call_over(session_id, replacing=dead):  # it is over
                    await store.note_owned(tier, dead, session_id, False)
                    continue
                try:
                    await self.host.open(SessionInfo.decode(raw), replacing=dead)
                except (SessionTaken, SessionRejected):  # another worker was quicker, or it ended
                    await store.note_owned(tier, dead, session_id, False)
                    continue
                except EnvelopeError as exc:
                    log.warning("dropping unreadable directory entry %s: %s", session_id, exc)
                    await store.unregister_session(tier, session_id)
                    continue
                taken += 1
                metrics.count(tier, "took_over_from_dead_workers")
                log.info("took over session %s from %s, which stopped answering", session_id, dead)
            if not await store.owned_sessions(tier, dead):
                await store.forget_worker(tier, dead)
                log.info("%s worker %s is gone; its sessions live elsewhere now", tier, dead)
        self.adopted += taken
        return taken

    async def _watch_loop(self) -> None:
        await self._every(
            self.liveness_ttl_ms / 4000, self.take_over_dead_workers, "looking for dead workers"
        )

    async def _adopt_loop(self) -> None:
        await self._every(self.adopt_interval_s, self.adopt_orphans, "looking for orphaned sessions")

    async def _every(self, interval: float, look: Callable[[], Awaitable[int]], what: str) -> None:
        """Run ``look`` every ``interval`` seconds; a failure (Redis down) is logged once, not each time."""
        failing = False
        while True:
            await asyncio.sleep(interval)
            try:
                await look()
            except Exception as exc:
                if not failing:
                    log.warning("%s failed (%s: %s); retrying quietly", what, type(exc).__name__, exc)
                failing = True
            else:
                if failing:
                    log.info("%s works again", what)
                failing = False

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(self.status_interval_s)
            runtimes = [owned.runtime for owned in self.host.sessions.values()]
            log.info(
                "%s %s: %d sessions, %d active generations, %d started, %d adopted%s",
                self.host.tier,
                self.host.owner,
                len(runtimes),
                sum(r.active_turns for r in runtimes),
                self.started,
                self.adopted,
                " (draining)" if self.draining else "",
            )

    async def _stop_taking(self, *, graceful: bool = True) -> None:
        if self._starts is not None:
            await self._starts.cancel()
            self._starts = None
        if self.partitions is not None:
            await self.partitions.stop_keeping(graceful=graceful)
        await cancel_and_wait(*self._tasks)
        self._tasks = []
        await self.load.stop()

    async def abandon(self) -> None:
        """Stop dead, as a killed process would: nothing checkpointed, no lease released (tests)."""
        self.draining = True
        await self._stop_taking(graceful=False)
        if self.partitions is not None:
            await self.partitions.abandon()
        self.host.stop_heartbeat()
        await self.host.abandon_all()

    def active_turns(self) -> int:
        return sum(owned.runtime.active_turns for owned in self.host.sessions.values())

    async def _let_turns_finish(self) -> None:
        """Give the turns running now up to ``drain_timeout_s`` to end here (their sessions keep
        consuming, so interrupts still work, and start no new turns); whatever is still running
        then is resumed by the adopter."""
        deadline = asyncio.get_running_loop().time() + self.drain_timeout_s
        while self.active_turns() and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def drain(self) -> None:
        """Stop taking sessions, let running turns finish (briefly), then checkpoint and release
        every lease so other workers adopt the sessions at once."""
        watchdog = asyncio.create_task(self._report_a_stuck_drain(), name=f"drain-watch:{self.host.tier}")
        try:
            await self._drain()
        finally:
            await cancel_and_wait(watchdog)

    async def _report_a_stuck_drain(self) -> None:
        await asyncio.sleep(self.drain_limit_s)
        me = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not me and not task.done()]
        log.error(
            "%s worker %s: the drain has not ended after %.1f s; %d tasks are running (the first %d "
            "follow, with where each waits)",
            self.host.tier,
            self.host.owner,
            self.drain_limit_s,
            len(tasks),
            min(len(tasks), LOGGED_STUCK_TASKS),
        )
        for task in tasks[:LOGGED_STUCK_TASKS]:
            log.error("still running: %s, at %s", task.get_name(), _awaiting(task))

    async def _drain(self) -> None:
        self.draining = True
        await self._stop_taking()
        for owned in self.host.sessions.values():
            owned.runtime.hold()  # new turns wait for the next owner: the drain ends with today's
        await self._let_turns_finish()
        count = len(self.host.sessions)
        await self.host.close_all()
        if self.partitions is not None:  # consumed until now: interrupts reached the last turns
            await self.partitions.release_all()
        self.host.stop_heartbeat()
        await self.host.store.forget_worker(self.host.tier, self.host.owner)
        log.info("%s worker %s drained %d sessions", self.host.tier, self.host.owner, count)


def _awaiting(task: asyncio.Task[object]) -> str:
    """Where ``task`` waits: each coroutine on its chain of awaits, outermost first (a task's own
    stack shows its outermost coroutine only)."""
    places: list[str] = []
    coro: object = task.get_coro()
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            places.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return " → ".join(places) or "(nowhere to show)"
