"""Workers of a partitioned tier (``BARGEIN_MAILBOXES=partitioned``): sharing the partitions, taking
a dead worker's, handing some over to a worker that joins, draining.

The in-memory transport and store stand in for RabbitMQ and Redis; tests/integration runs the same
workers over the real ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest

from bargein import (
    AgentSpeechSent,
    Bridge,
    ReasoningNode,
    SessionInfo,
    SpeechDelivered,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
    metrics,
)
from bargein.agent.llm import ScriptedLLM
from bargein.errors import SettingsError
from bargein.hosting.host import SessionHost
from bargein.hosting.worker import Worker
from bargein.runtime.agents import Agent
from bargein.testing.caller import Caller
from bargein.transport.memory import MemoryStateStore, MemoryTransport
from bargein.wire.envelope import Envelope, Source, new_session_id
from bargein.wire.names import IN, TIER_REASONING, Tier, partition_of

from . import test_worker
from .helpers import reply_text, take_chunks, wait_for
from .test_worker import (
    HISTORY_AFTER_THE_MOVE,
    REPLY,
    agent,
    history_after_a_move_before_the_report,
    line_listening,
    node_of,
    runtime_of,
)

PARTITIONS = 8
LIVENESS_MS = 200  # a partition's lease lives twice that


class Pool(test_worker.Pool):
    """test_worker's pool, its transports partitioned."""

    def __init__(self) -> None:
        super().__init__()
        self.client = MemoryTransport(self.broker, partitions=PARTITIONS)

    async def worker(  # type: ignore[override]
        self,
        partitions: int = PARTITIONS,
        agent: Agent = agent,
        adopt_interval_s: float = 0.05,
        max_sessions: int = 500,
    ) -> Worker:
        transport = MemoryTransport(self.broker, partitions=partitions)
        host = SessionHost.for_agent(transport, self.store, agent, owner=f"w{len(self.workers) + 1}")
        worker = Worker(
            host,
            adopt_interval_s=adopt_interval_s,
            status_interval_s=60,
            liveness_ttl_ms=LIVENESS_MS,
            drain_timeout_s=2,
            max_sessions=max_sessions,
        )
        await worker.start()
        self.workers.append(worker)
        return worker

    async def session_at(self, worker: Worker) -> Caller:
        """A session whose id hashes to one of the worker's partitions: a test that needs one
        there cannot leave it to chance (six random ids all missed one worker's half about once in
        64 runs, and failed the test)."""
        session_id = new_session_id()
        while partition_of(session_id, PARTITIONS) not in held(worker):
            session_id = new_session_id()
        return await self.session(session_id)

    def owner_of(self, caller: Caller) -> Worker | None:
        owners = [w for w in self.workers if caller.session_id in w.host.sessions]
        assert len(owners) <= 1, "a session owned twice"
        return owners[0] if owners else None


@pytest.fixture
async def pool() -> AsyncIterator[Pool]:
    p = Pool()
    yield p
    for w in p.workers:
        if not w.draining:
            await w.drain()


def held(worker: Worker) -> set[int]:
    assert worker.partitions is not None
    return set(worker.partitions.held)


async def answered(*callers: Caller) -> None:
    """Each caller asks, and is answered whole (all at once)."""

    async def ask(caller: Caller) -> None:
        await caller.emit(UserStoppedSpeaking())
        assert reply_text(await caller.collect_turn()) == REPLY

    await asyncio.gather(*(ask(caller) for caller in callers))


async def test_workers_share_the_partitions_and_a_session_goes_to_its_partitions_owner(pool: Pool) -> None:
    first, second = await pool.worker(), await pool.worker()
    await wait_for(lambda: len(held(first)) == len(held(second)) == PARTITIONS // 2)
    assert held(first) | held(second) == set(range(PARTITIONS))
    callers = [await pool.session() for _ in range(8)]
    await answered(*callers)
    for caller in callers:
        owner = pool.owner_of(caller)
        assert owner is not None and partition_of(caller.session_id, PARTITIONS) in held(owner)
    # each opened once, from its start or found as an orphan first (a race either may win)
    assert sum(w.started + w.adopted for w in (first, second)) == len(callers)
    # no mailbox of its own: the partition is the session's mailbox
    assert not [name for name in pool.broker.mailboxes if name.startswith("bargein.mailbox.reasoning")]


async def test_a_dead_workers_partitions_and_sessions_are_taken_and_the_turn_resumed(pool: Pool) -> None:
    first, second = await pool.worker(), await pool.worker()
    await wait_for(lambda: len(held(first)) == len(held(second)) == PARTITIONS // 2)
    victim = await pool.session_at(first)
    callers = [victim, *[await pool.session() for _ in range(5)]]
    await answered(*callers)
    assert pool.owner_of(victim) is first
    await victim.emit(UserStoppedSpeaking())
    heard = "".join(await take_chunks(victim, 4))
    await first.abandon()  # the process dies: its leases lapse, nothing is handed over
    await wait_for(lambda: held(second) == set(range(PARTITIONS)), timeout=10)
    rest = await victim.collect_turn()
    assert heard + reply_text(rest) == REPLY  # resumed where the caller's ears were
    assert pool.owner_of(victim) is second
    await answered(*callers)


async def test_a_worker_that_joins_is_handed_its_share_and_no_session_is_lost(pool: Pool) -> None:
    first = await pool.worker()
    await wait_for(lambda: held(first) == set(range(PARTITIONS)))
    callers = [await pool.session() for _ in range(8)]
    await answered(*callers)
    second = await pool.worker()
    await wait_for(lambda: len(held(first)) == len(held(second)) == PARTITIONS // 2, timeout=10)
    await answered(*callers)
    for caller in callers:
        owner = pool.owner_of(caller)
        assert owner is not None and partition_of(caller.session_id, PARTITIONS) in held(owner)


async def test_a_drained_worker_gives_its_partitions_back_at_once(pool: Pool) -> None:
    first, second = await pool.worker(), await pool.worker()
    await wait_for(lambda: len(held(first)) == len(held(second)) == PARTITIONS // 2)
    callers = [await pool.session() for _ in range(6)]
    await answered(*callers)
    await first.drain()
    assert held(first) == set()
    # released, not lapsed: the other takes them at its next look (it would wait out the lease
    # otherwise), with their sessions' checkpoints
    await wait_for(lambda: held(second) == set(range(PARTITIONS)), timeout=2)
    await answered(*callers)


async def test_a_worker_with_another_partition_count_refuses_to_start(pool: Pool) -> None:
    await pool.worker()
    with pytest.raises(SettingsError, match="BARGEIN_PARTITIONS=4"):
        await pool.worker(partitions=4)


async def test_a_session_that_ended_leaves_nothing_that_reopens_it(pool: Pool) -> None:
    worker = await pool.worker()
    caller = await pool.session()
    await answered(caller)
    await worker.host.finish(caller.session_id)
    assert await pool.store.session_info(TIER_REASONING, caller.session_id) is None
    await caller.emit(UserStoppedSpeaking())  # what the partition still gets of it is dropped
    await pool.broker.settle()
    assert pool.owner_of(caller) is None


def listening(session: SessionInfo) -> Bridge:
    """The workers' agent, which also keeps what the caller says in its history."""
    bridge = agent(session)
    node = bridge.node
    assert isinstance(node, ReasoningNode)
    bridge.on(UserTranscriptionReceived).map(node.add_event)
    return bridge


class SlowStore(MemoryStateStore):
    """Takes its time restoring a checkpoint, as Redis under load may."""

    async def load_state(self, tier: Tier, session: str) -> bytes | None:
        await asyncio.sleep(0.2)
        return await super().load_state(tier, session)


async def test_what_arrives_while_a_session_is_being_taken_waits_for_it(pool: Pool) -> None:
    """A partition's control and data queues are consumed side by side, so a session that comes to
    this worker (its partition moved here) may be taken by its control message while its data
    arrives: that data must wait for the session's checkpoint to be restored, or the restore
    overwrites what it changed (the caller's words, lost from the history)."""
    pool.store = SlowStore()
    worker = await pool.worker(agent=listening, adopt_interval_s=3600)
    await wait_for(lambda: held(worker) == set(range(PARTITIONS)))
    caller = await pool.session()
    await answered(caller)  # the session has a history, in its checkpoint
    await worker.host.close(caller.session_id)  # as a worker that handed its partition over
    await caller.emit(UserStartedSpeaking())  # control: takes the session (a slow restore)...
    await caller.emit(UserTranscriptionReceived(content="my words"))  # ...while its data arrives
    await caller.emit(UserStoppedSpeaking())
    assert reply_text(await caller.collect_turn()) == REPLY
    node = node_of(worker, caller)
    assert ("user", "my words") in [(m["role"], m["content"]) for m in node.history_messages()]


async def test_what_arrives_while_an_adopter_restores_the_session_waits_for_it(pool: Pool) -> None:
    """The worker's look for orphans takes a session up (its partition came here, its previous
    owner let it go) while the caller's next words arrive through the partition: they must wait
    until the session runs. Measured before (tests/integration/test_line_gemini.py, about one run
    in eight): they were handed to the runtime while it restored its checkpoint, before its routes
    existed, and went nowhere: the caller's words were missing from the model's request ("You said
    ."), or the turn never started."""
    pool.store = SlowStore()
    worker = await pool.worker(agent=listening, adopt_interval_s=3600)
    await wait_for(lambda: held(worker) == set(range(PARTITIONS)))
    caller = await pool.session()
    await answered(caller)
    await worker.host.close(caller.session_id)  # as a worker that handed its partition over
    adopting = asyncio.create_task(worker.adopt_orphans())
    await wait_for(lambda: caller.session_id in worker.host.sessions)  # taken up, still restoring
    await caller.emit(UserTranscriptionReceived(content="my words"), settle=False)
    await caller.emit(UserStoppedSpeaking(), settle=False)
    assert await adopting == 1
    assert reply_text(await caller.collect_turn()) == REPLY
    node = node_of(worker, caller)
    assert ("user", "my words") in [(m["role"], m["content"]) for m in node.history_messages()]


async def test_an_answer_reported_heard_after_its_session_moved_is_in_the_next_owners_history(
    pool: Pool,
) -> None:
    """The session moves between an answer and the edge's report that the caller got it: the next
    owner must tell its bridges (``AgentSpeechSent``), once, before the caller's next words.
    Measured before (tests/integration/test_line_gemini.py, about one run in ten): the new owner
    had the turn's text from the edge's record, so the report added nothing to what it knew and
    it told the bridges nothing; the model's next request lacked the answer the caller heard."""
    worker = await pool.worker(agent=line_listening, adopt_interval_s=3600)
    await wait_for(lambda: held(worker) == set(range(PARTITIONS)))
    caller = await pool.session()
    assert await history_after_a_move_before_the_report(worker, caller) == HISTORY_AFTER_THE_MOVE


async def test_what_the_bridges_were_told_moves_with_the_session(pool: Pool) -> None:
    """A report the first owner told its bridges about, delivered again to the next owner (the
    first took it, then the session moved before it was acknowledged), tells them nothing more."""
    worker = await pool.worker(agent=line_listening, adopt_interval_s=3600)
    await wait_for(lambda: held(worker) == set(range(PARTITIONS)))
    caller = await pool.session()
    caller.report_interval_s = 3600  # reports when told to, or when it speaks
    await caller.emit(UserTranscriptionReceived(content="hello"))
    await caller.emit(UserStoppedSpeaking())
    assert reply_text(await caller.collect_turn()) == REPLY
    await caller.report_now()
    await pool.broker.settle()  # told at the first owner
    runtime = runtime_of(worker, caller)
    turn = runtime.last_turn
    report = SpeechDelivered(turn=turn, seq=runtime.ledger.last_sent(turn))
    await worker.host.close(caller.session_id)
    await pool.client.publish(Envelope.wrap(caller.session_id, report, source=Source.EDGE), IN)
    await caller.emit(UserTranscriptionReceived(content="again"))
    await caller.emit(UserStoppedSpeaking())
    assert reply_text(await caller.collect_turn()) == REPLY
    node = node_of(worker, caller)
    told = [e.content for e in node.conversation_events if isinstance(e, AgentSpeechSent)]
    assert told == [REPLY]


async def test_a_worker_finds_its_own_orphans_behind_many_of_other_partitions(pool: Pool) -> None:
    """A worker looks at as many orphans as it adopts at one look (its room); were the other
    partitions' orphans counted toward that, one ahead of its own in the directory in greater
    number would hide them from it for good."""
    mine, theirs = (
        await pool.worker(adopt_interval_s=3600, max_sessions=2),
        await pool.worker(adopt_interval_s=3600),
    )
    await wait_for(lambda: len(held(mine)) == len(held(theirs)) == PARTITIONS // 2)
    orphans: dict[str, list[str]] = {"mine": [], "theirs": []}
    for i in range(200):  # registered, never started: nobody holds their leases
        if len(orphans["mine"]) == 2 and len(orphans["theirs"]) >= 10:
            break
        sid = f"orphan-{i}"
        whose = "mine" if partition_of(sid, PARTITIONS) in held(mine) else "theirs"
        if whose == "mine" and len(orphans["theirs"]) < 10:
            continue  # theirs first in the directory
        orphans[whose].append(sid)
        await pool.store.register_session(TIER_REASONING, sid, SessionInfo(sid).encode())
    assert await mine.adopt_orphans() == 2
    assert set(mine.host.sessions) == set(orphans["mine"])


async def lost_by_redis_with_its_owner(pool: Pool, worker: Worker, caller: Caller) -> bytes:
    """The session's owner gone and Redis's record of it too (a restart without persistence while
    its worker died): nobody knows the session but its caller's edge, which holds its record and
    gives it back with the turns it saw (edge/records.py), as this returns it."""
    record = await pool.store.session_info(TIER_REASONING, caller.session_id)
    assert record is not None
    await worker.host.close(caller.session_id, checkpoint=False)
    await pool.store.unregister_session(TIER_REASONING, caller.session_id)
    await pool.store.delete_state(TIER_REASONING, caller.session_id)
    return dataclasses.replace(SessionInfo.decode(record), turns_before=1).encode()


async def test_what_a_session_redis_lost_is_told_waits_for_its_record_to_come_back(pool: Pool) -> None:
    """With a mailbox per session, what the caller says while no worker knows the session waits
    in its mailbox until the edge writes the record back and a worker adopts it. A partition is
    shared, so its worker keeps such messages aside: measured before (the fault suite's Redis lost
    while an owner dies, partitioned), they were dropped as an ended session's, and the caller
    never heard an answer."""
    worker = await pool.worker(agent=listening, adopt_interval_s=0.05)
    await wait_for(lambda: held(worker) == set(range(PARTITIONS)))
    caller = await pool.session()
    await answered(caller)
    record = await lost_by_redis_with_its_owner(pool, worker, caller)
    await caller.emit(UserTranscriptionReceived(content="my words"))
    await caller.emit(UserStoppedSpeaking())
    await pool.broker.settle()
    assert pool.owner_of(caller) is None and worker.host.parked.holds(caller.session_id)
    assert await pool.store.restore_sessions(TIER_REASONING, {caller.session_id: record})  # the edge
    assert reply_text(await caller.collect_turn()) == REPLY  # adopted, and told what was kept
    node = node_of(worker, caller)
    assert ("user", "my words") in [(m["role"], m["content"]) for m in node.history_messages()]
    assert not worker.host.parked.holds(caller.session_id)


async def test_what_an_ended_session_is_told_is_given_up_after_the_wait(pool: Pool) -> None:
    worker = await pool.worker(adopt_interval_s=3600)
    await wait_for(lambda: held(worker) == set(range(PARTITIONS)))
    caller = await pool.session()
    await answered(caller)
    await worker.host.finish(caller.session_id)
    worker.host.parked.wait_s = 0.1
    before = metrics.events_total(TIER_REASONING, "partition_messages_of_ended_sessions")
    await caller.emit(UserStoppedSpeaking())
    await pool.broker.settle()
    assert worker.host.parked.holds(caller.session_id)
    await asyncio.sleep(0.2)
    other = await pool.session()  # the next message through the worker gives up what waited too long
    await answered(other)
    assert not worker.host.parked.holds(caller.session_id)
    assert metrics.events_total(TIER_REASONING, "partition_messages_of_ended_sessions") == before + 1
    assert pool.owner_of(caller) is None


async def test_a_redis_restart_that_lost_the_leases_leaves_each_worker_its_partitions(pool: Pool) -> None:
    """Redis restarted empty: every partition's lease is gone, and each holder takes its own back
    at its next renewal. A worker that saw too few heartbeats yet (the others' next beats not come)
    took the free-looking partitions of a live worker first, which then let go of its sessions and
    the conversations only it still held (measured with partitions: the fault suite's Redis restart
    lost one in about one run of four). Now a worker that finds its own leases gone takes none for a
    lease's life."""
    first, second = await pool.worker(agent=listening), await pool.worker(agent=listening)
    await wait_for(lambda: len(held(first)) == len(held(second)) == PARTITIONS // 2)
    shares = (held(first), held(second))
    callers = [await pool.session() for _ in range(6)]
    await answered(*callers)
    owners = {c.session_id: pool.owner_of(c) for c in callers}
    pool.store.lose_everything()
    pool.store.heartbeat_missing(TIER_REASONING, "w2")  # w1 counts itself alone for a while
    await asyncio.sleep(LIVENESS_MS * 2 / 1000)  # w1's rounds (each a quarter of that) see it
    pool.store.heartbeat_missing(TIER_REASONING, "w2", missing=False)
    await asyncio.sleep(LIVENESS_MS * 2 / 1000)
    assert (held(first), held(second)) == shares
    assert {c.session_id: pool.owner_of(c) for c in callers} == owners
    await answered(*callers)


async def test_a_dead_workers_partitions_are_taken_at_once_not_when_their_leases_lapse(pool: Pool) -> None:
    """As a dead worker's sessions are: once its heartbeat has stopped, not twice the liveness TTL
    later when its partitions' leases lapse (measured before: a killed owner's answers resumed
    2.6 s after the kill, partitioned, against about 1 s per-session)."""
    first, second = await pool.worker(adopt_interval_s=3600), await pool.worker(adopt_interval_s=3600)
    await wait_for(lambda: len(held(first)) == len(held(second)) == PARTITIONS // 2)
    victim = await pool.session_at(first)
    callers = [victim, *[await pool.session() for _ in range(7)]]
    await answered(*callers)
    assert pool.owner_of(victim) is first
    await first.abandon()  # killed: nothing released, its heartbeat stops
    assert await pool.store.dead_workers(TIER_REASONING) == ["w1"]
    await second.take_over_dead_workers()  # its leases have not lapsed yet
    assert held(second) == set(range(PARTITIONS))
    assert pool.owner_of(victim) is second
    await answered(*callers)


def slow_talker(session: SessionInfo) -> Bridge:
    """Answers take about 2 s: still under way when a hand-over or a drain begins."""
    node = ReasoningNode(llm_client=ScriptedLLM([REPLY], first_token_delay=0.005, tokens_per_second=10))
    bridge = Bridge(node)
    bridge.on(UserStoppedSpeaking).stream(node.generate).broadcast()
    return bridge


async def test_a_worker_drained_while_it_hands_partitions_over_stops_and_loses_no_session(pool: Pool) -> None:
    """The drain stops the partition keeper in the middle of a hand-over (waiting for its turns to
    end): the drain must still end within its time (it hung when the keeper's stop was lost in a
    session's close), and every session must go on, whole, at the other worker."""
    first = await pool.worker(agent=slow_talker)
    await wait_for(lambda: held(first) == set(range(PARTITIONS)))
    callers = [await pool.session() for _ in range(8)]
    for caller in callers:
        await caller.emit(UserStoppedSpeaking())
    await asyncio.gather(*(take_chunks(caller, 1) for caller in callers))  # every turn under way
    await pool.worker(agent=slow_talker)  # first hands half its partitions over...

    def handing_over() -> bool:  # (a session being handed over holds its next turns)
        return any(getattr(owned.runtime, "holding", False) for owned in first.host.sessions.values())

    await wait_for(handing_over)  # ...waiting for their turns to end
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(10):
        await first.drain()
    # the drain's wait for the turns (drain_timeout_s, 2 s) and a little more, not the hang
    assert asyncio.get_running_loop().time() - started < 5.0
    assert held(first) == set() and not first.host.sessions
    for caller in callers:  # each turn finishes (here or resumed there), then the next is answered
        await caller.collect_turn()
    await answered(*callers)
