"""Workers: taking session starts while there is room, adopting orphans, draining.

The in-memory transport and store stand in for RabbitMQ and Redis (the same code runs against them
in tests/integration, with real processes).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from bargein import (
    AgentGenerationComplete,
    AgentSpeechSent,
    Bridge,
    EndCall,
    Event,
    ReasoningNode,
    SessionInfo,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.llm import ScriptedLLM
from bargein.hosting.host import RENEWALS_PER_STEP, SessionHost
from bargein.hosting.sessions import create_session
from bargein.hosting.worker import Worker
from bargein.runtime.agents import Agent
from bargein.runtime.session import SessionRuntime
from bargein.testing.caller import Caller
from bargein.transport.memory import MemoryBroker, MemoryStateStore, MemoryTransport
from bargein.wire.envelope import Envelope, new_session_id
from bargein.wire.names import TIER_REASONING, Tier

from .helpers import reply_text, seen_half_done, take_chunks, wait_for

REPLY = " ".join(f"x{i}" for i in range(20))


def agent(session: SessionInfo) -> Bridge:
    node = ReasoningNode(llm_client=ScriptedLLM([REPLY], first_token_delay=0.005, tokens_per_second=40))
    bridge = Bridge(node)
    bridge.on(UserStoppedSpeaking).stream(node.generate).broadcast()
    return bridge


class Pool:
    def __init__(self) -> None:
        self.broker = MemoryBroker()
        self.store = MemoryStateStore()
        self.workers: list[Worker] = []
        self.client = MemoryTransport(self.broker)

    async def worker(self, agent: Agent = agent, **kw: float) -> Worker:
        host = SessionHost.for_agent(
            MemoryTransport(self.broker), self.store, agent, owner=f"w{len(self.workers) + 1}"
        )
        worker = Worker(host, adopt_interval_s=0.05, status_interval_s=60, **kw)  # type: ignore[arg-type]
        await worker.start()
        self.workers.append(worker)
        return worker

    async def session(self, session_id: str | None = None) -> Caller:
        caller = Caller(self.client, session_id or new_session_id(), settle=self.broker.settle)
        await caller.attach()
        await create_session(
            self.client, self.store, SessionInfo(caller.session_id, edge_reports_delivery=True)
        )
        return caller


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    p = Pool()
    yield p
    for w in p.workers:
        await w.drain()


async def test_a_worker_takes_sessions_only_while_it_has_room(pool: Pool) -> None:
    first = await pool.worker(max_sessions=1)
    a = await pool.session()
    await wait_for(lambda: a.session_id in first.host.sessions)
    b = await pool.session()  # no room in the first worker: it stays queued...
    second = await pool.worker(max_sessions=1)
    await wait_for(lambda: b.session_id in second.host.sessions)  # ...until a worker with room takes it
    assert list(first.host.sessions) == [a.session_id]
    for caller in (a, b):
        await caller.emit(UserStoppedSpeaking())
        assert reply_text(await caller.collect_turn()) == REPLY


def line_listening(session: SessionInfo) -> Bridge:
    """As Line's examples keep a history: the caller's words, and what the caller was sent."""
    bridge = agent(session)
    node = bridge.node
    assert isinstance(node, ReasoningNode)
    bridge.on(UserTranscriptionReceived).map(node.add_event)
    bridge.on(AgentSpeechSent).map(node.add_event)
    return bridge


async def history_after_a_move_before_the_report(worker: Worker, caller: Caller) -> list[tuple[str, str]]:
    """The caller's words and what the bridges were told, as the session's next owner (``worker``
    again) has them: the session left ``worker`` between an answer and the caller's report of it,
    and the report reached the next owner just before the caller's next words."""
    caller.report_interval_s = 3600  # the caller reports what it got when it speaks next, not before
    await caller.emit(UserTranscriptionReceived(content="hello"))
    await caller.emit(UserStoppedSpeaking())
    assert reply_text(await caller.collect_turn()) == REPLY
    await worker.host.close(caller.session_id)  # handed over before the report came
    await caller.emit(UserTranscriptionReceived(content="again"))  # the report first, then the words
    await caller.emit(UserStoppedSpeaking())
    assert reply_text(await caller.collect_turn()) == REPLY
    told = (UserTranscriptionReceived, AgentSpeechSent)  # (its own text it keeps as it generates)
    events = node_of(worker, caller).conversation_events
    return [(type(e).__name__, e.content) for e in events if isinstance(e, told)]


HISTORY_AFTER_THE_MOVE = [
    ("UserTranscriptionReceived", "hello"),
    ("AgentSpeechSent", REPLY),
    ("UserTranscriptionReceived", "again"),
]


async def test_an_answer_reported_heard_after_its_session_moved_is_in_the_next_owners_history(
    pool: Pool,
) -> None:
    """As tests/sdk/test_partitions.py's test of that name, with a mailbox per session: there the
    edge's record waits behind the report (one queue, one message at a time), so the next owner
    tells its bridges what the report said once the record comes."""
    worker = await pool.worker(agent=line_listening)  # (it adopts the session back: its next look)
    caller = await pool.session()
    assert await history_after_a_move_before_the_report(worker, caller) == HISTORY_AFTER_THE_MOVE


async def test_the_start_of_a_session_that_ended_while_it_waited_is_dropped(pool: Pool) -> None:
    # every worker was full, the caller hung up (the session is forgotten), then a worker has room:
    # it must not open a session nobody will ever use (it would hold a slot until it idles out)
    gone = SessionInfo(new_session_id())
    await create_session(pool.client, pool.store, gone)
    await pool.store.unregister_session(TIER_REASONING, gone.session_id)
    worker = await pool.worker()
    live = await pool.session()  # behind the stale start: taken as usual
    await wait_for(lambda: live.session_id in worker.host.sessions)
    assert gone.session_id not in worker.host.sessions
    assert worker.started == 1


async def test_an_orphaned_session_is_adopted_and_its_turn_resumed(pool: Pool) -> None:
    first = await pool.worker()
    caller = await pool.session()
    await wait_for(lambda: caller.session_id in first.host.sessions)
    await caller.emit(UserStoppedSpeaking())
    heard = "".join(await take_chunks(caller, 4))
    await first.abandon()  # the process dies...
    pool.store.expire_lease(TIER_REASONING, caller.session_id)  # ...and its lease runs out
    second = await pool.worker()
    await wait_for(lambda: caller.session_id in second.host.sessions)
    assert second.adopted == 1
    rest = await caller.collect_turn()
    assert heard + reply_text(rest) == REPLY


class WatchedStore(MemoryStateStore):
    """Runs ``on_release`` as soon as a lease is released: another worker's look for orphans
    landing at that moment."""

    def __init__(self) -> None:
        super().__init__()
        self.on_release: Callable[[], Awaitable[None]] | None = None

    async def release_lease(self, tier: Tier, session: str, owner: str, epoch: int) -> None:
        await super().release_lease(tier, session, owner, epoch)
        if self.on_release is not None:
            await self.on_release()


async def test_a_call_that_ended_is_never_adopted_by_another_worker(pool: Pool) -> None:
    """Found on a 2-core machine (tests/integration/test_line.py, the Line counter's EndCall): the
    ending owner released the lease before it took the session out of the directory, and another
    worker's look for orphans between the two adopted the call that was over, and kept its state."""
    pool.store = WatchedStore()
    first = await pool.worker()
    caller = await pool.session()
    await wait_for(lambda: caller.session_id in first.host.sessions)
    second = await pool.worker()
    pool.store.on_release = second.adopt_orphans
    await caller.emit(EndCall(reason="caller hung up"))
    await wait_for(lambda: caller.session_id not in first.host.sessions)
    await asyncio.sleep(0.3)  # the ending owner forgets it; an adopter would have checkpointed it
    assert caller.session_id not in second.host.sessions
    assert second.adopted == 0
    assert await pool.store.load_state(TIER_REASONING, caller.session_id) is None


@pytest.mark.parametrize("dead_worker", [False, True])
async def test_a_worker_that_starts_adopts_only_the_sessions_whose_callers_are_still_there(
    pool: Pool, dead_worker: bool
) -> None:
    # the first worker dies (lease run out, or its heartbeat stopped); one caller is still on the
    # line, the other left without `end` longer ago than the edge's reconnect grace, and no edge was
    # there to end it: the adopter ends that one instead of bringing back a call nobody is on
    first = await pool.worker()
    here, gone, untracked = await pool.session(), await pool.session(), await pool.session()
    await wait_for(lambda: all(c.session_id in first.host.sessions for c in (here, gone, untracked)))
    now = time.time()
    await pool.store.expect_callers({here.session_id: now + 60, gone.session_id: now - 1})
    await first.abandon()
    if dead_worker:
        first.host.stop_heartbeat()
    else:
        for caller in (here, gone, untracked):
            pool.store.expire_lease(TIER_REASONING, caller.session_id)
    second = await pool.worker()
    await wait_for(lambda: here.session_id in second.host.sessions)
    await wait_for(lambda: untracked.session_id in second.host.sessions)  # no edge keeps its callers
    for _ in range(200):  # ended, not orphaned: out of the directory (the sessions are taken in turn)
        if await pool.store.session_info(TIER_REASONING, gone.session_id) is None:
            break
        await asyncio.sleep(0.01)
    assert await pool.store.session_info(TIER_REASONING, gone.session_id) is None
    await pool.broker.settle()
    assert gone.session_id not in second.host.sessions
    assert second.adopted == 2
    await here.emit(UserStoppedSpeaking())
    assert reply_text(await here.collect_turn()) == REPLY


def runtime_of(worker: Worker, caller: Caller) -> SessionRuntime:
    runtime = worker.host.sessions[caller.session_id].runtime
    assert isinstance(runtime, SessionRuntime)
    return runtime


def node_of(worker: Worker, caller: Caller) -> ReasoningNode:
    """The session's reasoning node, at ``worker``."""
    node = runtime_of(worker, caller).nodes[0]
    assert isinstance(node, ReasoningNode)
    return node


def _counters(worker: Worker, caller: Caller) -> Counter[str]:
    return runtime_of(worker, caller).counters


@pytest.mark.parametrize("drain_timeout_s, resumed", [(5.0, False), (0.0, True)])
async def test_drain_lets_turns_finish_or_hands_them_over(
    pool: Pool, drain_timeout_s: float, resumed: bool
) -> None:
    first = await pool.worker(drain_timeout_s=drain_timeout_s)
    caller = await pool.session()
    await wait_for(lambda: caller.session_id in first.host.sessions)
    await caller.emit(UserStoppedSpeaking())
    heard = "".join(await take_chunks(caller, 2))
    await first.drain()
    assert first.host.sessions == {}
    second = await pool.worker()
    await wait_for(lambda: caller.session_id in second.host.sessions)
    if not resumed:  # the turn ended in the first worker, during the drain
        rest = await caller.quiet(0.1)
        assert isinstance(rest[-1], AgentGenerationComplete)
        assert heard + reply_text(rest) == REPLY
        assert _counters(second, caller)["turns_resumed"] == 0
    else:
        rest = await caller.collect_turn()
        assert heard + reply_text(rest) == REPLY
        assert _counters(second, caller)["turns_resumed"] == 1


async def test_a_session_nobody_talks_to_any_more_is_ended() -> None:
    """A caller who vanished without hanging up must not hold a worker's room for ever."""
    broker, store = MemoryBroker(), MemoryStateStore()
    host = SessionHost.for_agent(MemoryTransport(broker), store, agent, lease_ttl_ms=600, idle_end_s=0.5)
    client = MemoryTransport(broker)
    quiet = Caller(client, new_session_id(), settle=broker.settle)
    busy = Caller(client, new_session_id(), settle=broker.settle)
    for caller in (quiet, busy):
        await caller.attach()
        await create_session(client, store, SessionInfo(caller.session_id))
        await host.open(SessionInfo(caller.session_id))
    for _ in range(8):  # one caller keeps talking, the other says nothing
        await busy.emit(UserStoppedSpeaking())
        await asyncio.sleep(0.15)
    await wait_for(lambda: quiet.session_id not in host.sessions)
    assert busy.session_id in host.sessions
    assert await store.session_info(TIER_REASONING, quiet.session_id) is None  # forgotten everywhere
    assert await store.load_state(TIER_REASONING, quiet.session_id) is None
    await host.close_all()


async def test_callers_on_one_edge_queue_each_hear_their_own_session(pool: Pool) -> None:
    """As a broadcast process's callers do (and the peers bench's distributed ones): many sessions'
    output on one edge queue, each message handed to its session's caller, none to another's."""
    await pool.worker()
    callers: dict[str, Caller] = {}

    async def hear(envelope: Envelope, event: Event) -> None:
        await callers[envelope.session].receive(envelope, event)

    edge = await pool.client.open_edge_queue("edge-1", hear)
    for _ in range(2):
        caller = Caller(pool.client, new_session_id(), settle=pool.broker.settle)
        callers[caller.session_id] = caller
        await caller.attach(edge)
        await create_session(
            pool.client, pool.store, SessionInfo(caller.session_id, edge_reports_delivery=True)
        )
    a, b = callers.values()
    await a.emit(UserStoppedSpeaking())
    assert reply_text(await a.collect_turn()) == REPLY
    assert await b.quiet(0.1) == []  # b said nothing: nothing of a's answer reached it
    await b.emit(UserStoppedSpeaking())
    assert reply_text(await b.collect_turn()) == REPLY
    await b.detach()  # b's session is no longer heard here
    await a.emit(UserStoppedSpeaking())
    assert reply_text(await a.collect_turn()) == REPLY
    await edge.cancel()


class StalledCaller(Caller):
    """A caller whose edge stops taking the session's output while ``flowing`` is clear."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flowing = asyncio.Event()
        self.flowing.set()

    async def receive(self, envelope: Envelope, event: Event) -> None:
        await self.flowing.wait()
        await super().receive(envelope, event)


async def test_a_turn_whose_output_finds_no_broker_for_longer_than_the_wait_goes_on_after_it() -> None:
    """The transport gives a publish up after BARGEIN_BROKER_WAIT_S (here: its caller's queue stays
    full, as when RabbitMQ cannot take anything); the owner still holds the lease, so the turn waits
    and goes on, whole, instead of failing (a frozen RabbitMQ node ended every answer in flight)."""
    broker, store = MemoryBroker(), MemoryStateStore()
    host = SessionHost.for_agent(MemoryTransport(broker, broker_wait_s=0.2), store, agent, owner="w1")
    worker = Worker(host, adopt_interval_s=0.05, status_interval_s=60)
    await worker.start()
    client = MemoryTransport(broker, queue_max_messages=2)
    caller = StalledCaller(client, new_session_id(), settle=broker.settle)
    await caller.attach()
    await create_session(client, store, SessionInfo(caller.session_id, edge_reports_delivery=True))
    try:
        await wait_for(lambda: caller.session_id in host.sessions)
        await caller.emit(UserStoppedSpeaking())
        heard = "".join(await take_chunks(caller, 2))
        caller.flowing.clear()
        runtime = host.sessions[caller.session_id].runtime
        assert isinstance(runtime, SessionRuntime)
        await wait_for(lambda: runtime.counters["output_waited_for_broker"] == 1)
        await asyncio.sleep(0.5)  # more than twice the transport's wait
        caller.flowing.set()
        rest = await caller.collect_turn()
        assert heard + reply_text(rest) == REPLY
        assert not runtime.counters["route_errors"]
    finally:
        await worker.drain()


async def test_renewing_many_leases_lets_what_waits_meanwhile_go_first() -> None:
    """A process with thousands of sessions acts on their renewals a batch at a time: acting on
    10,000 in one step of the event loop held up every interrupt that came meanwhile (measured: the
    Redis pipeline alone was a 57 ms step). Here the renewals of a pass are seen half done by
    another task, which they could not be if the pass were one step."""
    broker, store = MemoryBroker(), MemoryStateStore()
    host = SessionHost.for_agent(MemoryTransport(broker), store, agent, lease_ttl_ms=600)
    count = 2 * RENEWALS_PER_STEP + 1
    try:
        for _ in range(count):
            info = SessionInfo(new_session_id())
            await create_session(host.transport, store, info)
            await host.open(info)
        runtimes = [owned.runtime for owned in host.sessions.values()]
        opened = time.monotonic()  # what a renewal pass confirms from now on is later than this

        def renewed() -> int | None:  # of the latest pass
            latest = max(r.lease_confirmed_at for r in runtimes)
            if not opened < latest < math.inf:
                return None
            return sum(r.lease_confirmed_at == latest for r in runtimes)

        await seen_half_done(renewed, count)
    finally:
        await host.close_all()


async def test_a_drain_that_is_stuck_says_where(pool: Pool, caplog: pytest.LogCaptureFixture) -> None:
    """Past its limit a drain logs, once, every task and where it waits: a process that does not
    stop on SIGTERM (a drain waited for ever once: tests/sdk/test_tasks.py) must say why."""
    worker = await pool.worker()
    caller = await pool.session()
    await wait_for(lambda: caller.session_id in worker.host.sessions)
    stuck = asyncio.Event()
    real_close_all = worker.host.close_all

    async def close_all_stuck() -> None:
        await stuck.wait()
        await real_close_all()

    worker.host.close_all = close_all_stuck  # type: ignore[method-assign]
    worker.drain_limit_s = 0.2
    with caplog.at_level(logging.ERROR, logger="bargein.hosting.worker"):
        draining = asyncio.create_task(worker.drain())
        await wait_for(lambda: "has not ended after" in caplog.text, timeout=5)
        assert "close_all_stuck" in caplog.text  # where the drain waits
        stuck.set()
        await draining
    assert not worker.host.sessions
    assert caplog.text.count("has not ended after") == 1
