"""Owning sessions in one process: lease, mailbox, runtime.

A :class:`SessionHost` takes a session by acquiring its lease (which yields the fencing epoch),
restores and starts a :class:`~bargein.runtime.session.SessionRuntime`, and attaches it to the session's
mailbox. It renews each lease in the background; if a renewal fails another process has (or may
take) the session, so this one stops working it at once without writing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from bargein import metrics
from bargein.agent.events import AgentError, EndCall, Event
from bargein.errors import AgentFailedToStart, BargeinError, NotOwner, SessionRejected
from bargein.hosting.parked import ParkedMessages
from bargein.hosting.sessions import forget_session
from bargein.runtime.agents import Agent
from bargein.runtime.session import SessionRuntime
from bargein.transport.abc import Heartbeat, Renewal, SessionProcessor, StateStore, Subscription, Transport
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN, OUT, TIER_REASONING, Tier
from bargein.wire.session_info import SessionInfo

log = logging.getLogger("bargein.hosting.host")
REJECTED_STATE_S = 30.0  # a rejected session's epoch is kept this long, for the edge to check its EndCall
# Renewals acted on in one step of the event loop: a process with 10,000 sessions acting on all of
# theirs at once held up every interrupt that came meanwhile (the store renews them in batches too)
RENEWALS_PER_STEP = 256


class SessionTaken(BargeinError):
    """Another process holds this session's lease."""


def default_owner_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def owner_pid(lease: bytes | str) -> int:
    """The process id in an owner id, or in a lease's ``<owner>:<epoch>`` value (an owner id is
    ``[<tier>-]<host>-<pid>-<random>``): the benches and tests find the process to kill by it."""
    text = lease.decode() if isinstance(lease, bytes) else lease
    return int(text.rsplit(":", 1)[0].split("-")[-2])


@dataclass(frozen=True)
class Ownership:
    """Everything a tier's session processor is given when its host takes a session."""

    info: SessionInfo
    transport: Transport
    store: StateStore
    epoch: int
    owner: str
    tier: Tier
    state_ttl_ms: int
    on_end: Callable[[str], None]


ProcessorFactory = Callable[[Ownership], SessionProcessor]


def agent_sessions(agent: Agent) -> ProcessorFactory:
    """The reasoning tier: each owned session runs ``agent``'s routes."""

    def make(own: Ownership) -> SessionProcessor:
        return SessionRuntime(
            own.info,
            own.transport,
            own.store,
            agent=agent,
            epoch=own.epoch,
            owner=own.owner,
            tier=own.tier,
            state_ttl_ms=own.state_ttl_ms,
            on_end=own.on_end,
        )

    return make


@dataclass
class _Owned:
    info: SessionInfo
    runtime: SessionProcessor
    subscription: Subscription
    records_lost: bool = False  # Redis lost them; written back at each renewal until that works
    resubscribe_failing: bool = False  # the mailbox could not be consumed again at the last try
    # Being taken up here (deliver keeps aside what a partition brings it meanwhile): until its
    # runtime runs (checkpoint restored, routes built) everything; then, while what was kept is
    # handed over, what comes on the data lane goes behind it (control overtakes data, as in the
    # broker: the edge's record of what the caller heard, which a report being handed may wait for)
    running: bool = False
    catching_up: bool = True


class _NoSubscription(Subscription):
    """Stands in until the mailbox is open."""

    @property
    def alive(self) -> bool:
        return True

    async def cancel(self) -> None:
        return None


class SessionHost:
    def __init__(
        self,
        transport: Transport,
        store: StateStore,
        factory: ProcessorFactory,
        *,
        owner: str | None = None,
        tier: Tier = TIER_REASONING,
        lease_ttl_ms: int = 10_000,
        state_ttl_ms: int = 24 * 3600 * 1000,
        idle_end_s: float | None = None,
    ) -> None:
        self.transport = transport
        self.store = store
        self.factory = factory
        self.owner = owner or default_owner_id()
        self.tier = tier
        self.lease_ttl_ms = lease_ttl_ms
        self.state_ttl_ms = state_ttl_ms
        self.idle_end_s = idle_end_s  # a session with no message for this long is over (caller gone)
        self._background: set[asyncio.Task[None]] = set()
        self.sessions: dict[str, _Owned] = {}
        self.heartbeat: Heartbeat | None = None  # this process's liveness (Worker.start keeps it)
        self._renewer: asyncio.Task[None] | None = None  # renews every lease at once
        # a partitioned tier's worker says which sessions' messages it may take (their partition is
        # its own, and it is not draining); None: any (a mailbox per session)
        self.accepts: Callable[[str], bool] | None = None
        # a partitioned tier's messages of sessions Redis does not know (yet): hosting/parked.py
        self.parked = ParkedMessages(self._gave_up_parked)
        self._renewal_failing = False

    def keep_alive(self, ttl_ms: int) -> None:
        """Start this process's heartbeat; the sessions it owns act only while it holds."""
        self.heartbeat = self.store.keep_alive(self.tier, self.owner, ttl_ms)

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()

    @classmethod
    def for_agent(cls, transport: Transport, store: StateStore, agent: Agent, **kwargs: Any) -> SessionHost:
        return cls(transport, store, agent_sessions(agent), **kwargs)

    async def open(self, info: SessionInfo, *, replacing: str | None = None) -> SessionProcessor:
        """Take the session: its lease (from ``replacing``, a dead worker, if given), its checkpoint,
        its mailbox. :class:`SessionTaken` if another process holds it."""
        sid = info.session_id
        if sid in self.sessions:
            return self.sessions[sid].runtime
        acquired_at = time.monotonic()
        epoch = await self.store.acquire_lease(
            self.tier, sid, self.owner, self.lease_ttl_ms, replacing=replacing
        )
        if epoch is None:
            raise SessionTaken(f"session {sid} is owned by another process")
        await self.store.note_owned(self.tier, self.owner, sid, True)
        if replacing is not None:
            await self.store.note_owned(self.tier, replacing, sid, False)
        runtime = self.factory(
            Ownership(
                info, self.transport, self.store, epoch, self.owner, self.tier, self.state_ttl_ms, self._ended
            )
        )
        runtime.lease_deadline, runtime.lease_confirmed_at = self._deadline(acquired_at), acquired_at
        runtime.liveness = self.heartbeat
        owned = _Owned(info, runtime, _NoSubscription())
        self.sessions[sid] = owned  # its lease is renewed from now on
        metrics.SESSIONS.labels(self.tier).set(len(self.sessions))
        self._ensure_renewer()
        try:
            await runtime.start()
            owned.running = True
            if not self.transport.partitions(self.tier):  # a partition's consumer hands it over
                owned.subscription = await self.transport.open_mailbox(sid, self.tier, IN, runtime.handle)
            while parked := self.parked.take(sid):  # (what comes meanwhile is kept behind them)
                log.info("session %s: handing it the %d message(s) kept for it", sid, len(parked))
                # control first, as the broker's lanes would have it: a delivery report kept here
                # may wait for the edge's record (control) kept behind it
                for envelope, event in sorted(parked, key=lambda kept: not kept[0].control):
                    await runtime.handle(envelope, event)
            owned.catching_up = False
        except BaseException as exc:
            self.sessions.pop(sid, None)
            if isinstance(exc, SessionRejected):  # told while the lease vouches for its epoch
                await self._reject(sid, epoch, exc)
            await runtime.close(checkpoint=False)
            await self.store.release_lease(self.tier, sid, self.owner, epoch)
            if isinstance(exc, SessionRejected):  # out of the directory now: never adopted
                await self.store.unregister_session(self.tier, sid)
                await self.transport.delete_mailbox(sid, self.tier)
                # the rest later: the edge checks the EndCall's epoch against the store
                self._spawn(self._forget_later(sid))
            raise
        return runtime

    async def deliver(self, envelope: Envelope, event: Event) -> None:
        """A partitioned tier's handler: hand a message from a partition to its session's
        processor, taking the session first if this process does not own it yet (the partition
        came from another worker, or the session is new). :class:`~bargein.errors.NotOwner` puts
        the message back for later: the session's previous owner still holds it, or the partition
        is no longer this worker's (``accepts``). A message for a session that is over is dropped.

        A message for a session still being taken up here (by the look for orphans, or by the
        partition's other consumer: its control and data queues are consumed side by side) is kept
        aside until the session runs (``_Owned.running``): handed over before, it reached a runtime
        restoring its checkpoint, whose routes did not exist yet, and went nowhere (the caller's
        words missing from the next answer, or no answer at all)."""
        self.parked.expire()
        owned = self.sessions.get(envelope.session)
        if owned is None:
            await self._take_for(envelope, event)
            owned = self.sessions.get(envelope.session)
            if owned is None:  # kept aside (Redis does not know it), or the session is over
                return
        if not owned.running or (owned.catching_up and not envelope.control):
            self.parked.park(envelope, event)
            return
        await owned.runtime.handle(envelope, event)

    async def _take_for(self, envelope: Envelope, event: Event) -> SessionProcessor | None:
        """The session's processor, taken here now; None if there is none to hand the message to
        (kept aside when Redis does not know the session: :mod:`bargein.hosting.parked`)."""
        session_id = envelope.session
        if self.accepts is not None and not self.accepts(session_id):
            raise NotOwner(f"session {session_id}: its partition is not this worker's")
        raw = await self.store.session_info(self.tier, session_id)
        if raw is None:
            if not self.parked.holds(session_id):
                log.debug(
                    "session %s is not known (ended, or lost by Redis); keeping its message a while",
                    session_id,
                )
            self.parked.park(envelope, event)
            return None
        try:
            return await self.open(SessionInfo.decode(raw))
        except SessionTaken:
            raise NotOwner(f"session {session_id}: its previous owner still holds it") from None
        except SessionRejected:
            return None

    def _gave_up_parked(self, n: int) -> None:
        if n:
            metrics.count(self.tier, "partition_messages_of_ended_sessions", n)
            log.debug("dropped %d message(s) of sessions that stayed unknown (ended)", n)

    async def _forget_later(self, session_id: str) -> None:
        await asyncio.sleep(REJECTED_STATE_S)
        with contextlib.suppress(Exception):  # a stray epoch key is all that is left if this fails
            await self.store.delete_state(self.tier, session_id)

    async def _reject(self, session_id: str, epoch: int, why: SessionRejected) -> None:
        """The agent declined the session: end it for the caller (the edge ends the other tiers
        when it hears this); the caller then forgets it, so that no worker adopts it again."""
        if isinstance(why, AgentFailedToStart):
            log.error("session %s: %s; ending it", session_id, why)
            said = AgentError(message=str(why))
            await self.transport.publish(Envelope.wrap(session_id, said, epoch=epoch, source=self.owner), OUT)
        else:
            log.info("session %s rejected by its agent (%s); ending it", session_id, why)
        hangup = EndCall(reason=why.end_reason)
        await self.transport.publish(Envelope.wrap(session_id, hangup, epoch=epoch, source=self.owner), OUT)

    async def _resubscribe(self, session_id: str, owned: _Owned) -> None:
        """Consume the session's mailbox again (declaring it again if it vanished)."""
        try:
            owned.subscription = await self.transport.open_mailbox(
                session_id, self.tier, IN, owned.runtime.handle
            )
        except Exception as exc:
            # said once, not at every renewal while the broker is away (the transport names the outage)
            report = log.debug if owned.resubscribe_failing else log.warning
            report("session %s: cannot consume its mailbox again yet: %s", session_id, exc)
            owned.resubscribe_failing = True
            return
        owned.resubscribe_failing = False
        log.info("session %s: consuming its mailbox again", session_id)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _ended(self, session_id: str) -> None:
        """The caller hung up: close the session here and forget it everywhere."""
        self._spawn(self.finish(session_id))

    async def finish(self, session_id: str) -> None:
        if session_id not in self.sessions:
            return
        # Out of the directory before the lease goes: released while still listed, it was an
        # orphan to any worker that looked in between, which adopted a call that was over
        with contextlib.suppress(Exception):  # (Redis away: forget_session below says so)
            await self.store.unregister_session(self.tier, session_id)
        await self.close(session_id, checkpoint=False)
        await forget_session(self.transport, self.store, session_id, tier=self.tier)
        log.info("session %s ended", session_id)

    async def close(self, session_id: str, *, release: bool = True, checkpoint: bool = True) -> None:
        owned = self.sessions.pop(session_id, None)
        metrics.SESSIONS.labels(self.tier).set(len(self.sessions))
        if owned is None:
            return
        await owned.subscription.cancel()
        await owned.runtime.close(checkpoint=checkpoint)
        if release:
            await self.store.release_lease(self.tier, session_id, self.owner, owned.runtime.epoch)
        with contextlib.suppress(Exception):  # a record left behind only costs a later look
            await self.store.note_owned(self.tier, self.owner, session_id, False)
        log.info("session %s closed here (released=%s)", session_id, release)

    async def abandon(self, session_id: str) -> None:
        """Drop the session as a crashed process would: nothing acknowledged, checkpointed or
        released (used by tests to simulate a kill)."""
        owned = self.sessions.pop(session_id, None)
        metrics.SESSIONS.labels(self.tier).set(len(self.sessions))
        if owned is None:
            return
        await owned.subscription.cancel()
        await owned.runtime.close(checkpoint=False)

    async def abandon_all(self) -> None:
        for sid in list(self.sessions):
            await self.abandon(sid)

    async def close_all(self) -> None:
        for sid in list(self.sessions):
            await self.close(sid)

    def _gone_quiet(self, owned: _Owned) -> bool:
        idle = time.monotonic() - owned.runtime.last_activity
        return self.idle_end_s is not None and idle > self.idle_end_s and not owned.runtime.active_turns

    def _deadline(self, asked_at: float) -> float:
        """Until when a lease taken or renewed at ``asked_at`` surely holds (a tenth of it spare)."""
        return asked_at + 0.9 * self.lease_ttl_ms / 1000

    def _ensure_renewer(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew_all(), name=f"leases:{self.tier}"
            )

    async def _renew_all(self) -> None:
        """Every third of the lease's lifetime, renew all the leases this process holds in one go
        (a thousand sessions cost one round trip, not a thousand), then act on what came back."""
        interval = self.lease_ttl_ms / 3000
        while self.sessions:
            await asyncio.sleep(interval)
            leases = {sid: owned.runtime.epoch for sid, owned in self.sessions.items()}
            asked_at = time.monotonic()
            try:
                results = await self.store.renew_leases(self.tier, self.owner, leases, self.lease_ttl_ms)
            except Exception as exc:  # Redis is down: the sessions wait (their processors hold off)
                if not self._renewal_failing:
                    log.warning(
                        "renewing %d leases failed (%s: %s); retrying", len(leases), type(exc).__name__, exc
                    )
                self._renewal_failing = True
                continue
            if self._renewal_failing:
                log.info("leases renew again")
                self._renewal_failing = False
            for n, (session_id, result) in enumerate(results.items(), 1):
                await self._renewed(session_id, leases[session_id], result, asked_at)
                if n % RENEWALS_PER_STEP == 0:
                    await asyncio.sleep(0)  # what waits meanwhile (an interrupt) goes first

    async def _renewed(self, session_id: str, epoch: int, result: Renewal, asked_at: float) -> None:
        owned = self.sessions.get(session_id)
        if owned is None:  # closed meanwhile: a lease the renewal took again goes straight back
            if result is Renewal.RESTORED:
                await self.store.release_lease(self.tier, session_id, self.owner, epoch)
            return
        if not result:
            log.warning("session %s: lease lost (epoch %d); stopping work on it", session_id, epoch)
            owned.runtime.fenced = True
            self._spawn(self.close(session_id, release=False, checkpoint=False))
            return
        owned.runtime.lease_deadline, owned.runtime.lease_confirmed_at = self._deadline(asked_at), asked_at
        if result is Renewal.RESTORED:
            log.warning(
                "session %s: its lease was gone from Redis; taken again, writing its records back",
                session_id,
            )
            owned.records_lost = True
        if owned.records_lost:
            await self._restore_records(session_id, owned)
        if not owned.subscription.alive:  # the broker cancelled it, or the connection came back
            await self._resubscribe(session_id, owned)
        if self._gone_quiet(owned):
            log.info(
                "session %s: no message for %.0f s; the caller is gone, ending it",
                session_id,
                time.monotonic() - owned.runtime.last_activity,
            )
            self._spawn(self.finish(session_id))

    async def _restore_records(self, session_id: str, owned: _Owned) -> None:
        """Redis lost this session's lease (a restart without persistence): it has the lease and the
        epoch again; write back the rest it needs (the directory entry, so the session can be found
        and adopted; our record of owning it; the checkpoint)."""
        try:
            await self.store.register_session(self.tier, session_id, owned.info.encode())
            await self.store.note_owned(self.tier, self.owner, session_id, True)
            await owned.runtime.write_back()
            owned.records_lost = False
        except Exception as exc:
            log.warning(
                "session %s: writing its records back failed (%s); next renewal retries", session_id, exc
            )
