"""The edge hears an answer's chunks in order and whole: what comes after a lost one waits for it,
the edge asks the owner for it again (``OutputMissed``), and lets the rest go without it only after
``BARGEIN_RESEND_WAIT_MS``. In process, on the in-memory transport: the tests are the owner."""

from __future__ import annotations

import asyncio
from typing import Any

from bargein.agent.events import AgentGenerationComplete, AgentResponse, Event, OutputMissed, TurnInterrupted
from bargein.edge.core import SESSIONS_PER_STEP, Edge, JsonWire
from bargein.settings import BroadcastSettings
from bargein.transport.memory import MemoryStateStore, MemoryTransport
from bargein.wire.envelope import Envelope, new_session_id
from bargein.wire.names import IN, TIER_REASONING

from ..sdk.helpers import seen_half_done, wait_for
from .test_edge_unit import FakeSocket, push


async def edge_and_owner(wait_ms: float, report_ms: float = 10_000) -> tuple[Edge, list[OutputMissed]]:
    """An edge, and what it asks of session s1's owner (whose mailbox the test reads)."""
    settings = BroadcastSettings(report_interval_ms=report_ms, resend_wait_ms=wait_ms)
    edge = Edge(MemoryTransport(), MemoryStateStore(), settings, owner="t", max_frame_bytes=64_000)
    await edge.start()
    asked: list[OutputMissed] = []

    async def owner(envelope: Envelope, event: Event) -> None:
        if isinstance(event, OutputMissed):
            asked.append(event)

    await edge.transport.open_mailbox("s1", TIER_REASONING, IN, owner)
    return edge, asked


def words(sock: FakeSocket) -> list[Any]:
    return [f.get("text", f["type"]) for f in sock.sent if f["type"] in ("agent_chunk", "turn_complete")]


def word(seq: int) -> AgentResponse:
    return AgentResponse(content=f"w{seq}")


async def chunk_1_lost(edge: Edge) -> FakeSocket:
    """A caller on s1, and turn 1's chunks 0 and 2 from its owner: 1 was lost on its way."""
    sock = FakeSocket()
    await edge.join("s1", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
    await push(edge, "s1", word(0), turn=1, seq=0, epoch=1)
    await push(edge, "s1", word(2), turn=1, seq=2, epoch=1)
    return sock


async def test_a_lost_chunk_is_asked_for_and_the_answer_reaches_the_caller_whole_and_in_order() -> None:
    edge, asked = await edge_and_owner(wait_ms=10_000)
    try:
        sock = FakeSocket()
        await edge.join("s1", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        for seq in (0, 1, 3, 4):  # 2 was lost on its way
            await push(edge, "s1", word(seq), turn=1, seq=seq, epoch=1)
        await push(edge, "s1", AgentGenerationComplete(), turn=1, seq=5, epoch=1)
        await wait_for(lambda: len(asked) == 1)
        assert asked == [OutputMissed(turn=1, first=2, last=2)]  # once, though three came after it
        await asyncio.sleep(0.05)
        assert words(sock) == ["w0", "w1"]  # the rest waits for it
        await push(edge, "s1", word(2), turn=1, seq=2, epoch=1)  # sent again by the owner
        await wait_for(lambda: len(words(sock)) == 6)
        assert words(sock) == ["w0", "w1", "w2", "w3", "w4", "turn_complete"]
        assert edge.counters["chunks_asked_again"] == 1 and edge.counters["chunks_lost"] == 0
        await push(edge, "s1", word(3), turn=1, seq=3, epoch=1)  # one that came twice: once
        await asyncio.sleep(0.05)
        assert len(words(sock)) == 6
    finally:
        await edge.stop()


async def test_the_first_answers_first_chunk_lost_is_asked_for_by_the_edge_that_created_the_session() -> None:
    """The edge that created a session heard it from before its owner could speak, so the first
    chunk it hears being the second means the first was lost (a node that froze deleted the edge's
    queue with it, docs/operations.md): it is asked for, and the caller hears the answer whole. An
    edge a caller joins mid-call cannot tell, and asks for nothing (tests/sdk/test_order.py)."""
    edge, asked = await edge_and_owner(wait_ms=10_000)
    try:
        session = await edge.create_session({}, {})
        await edge.transport.open_mailbox(session, TIER_REASONING, IN, lambda e, ev: _note(asked, ev))
        sock = FakeSocket()
        await edge.join(session, JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        await push(edge, session, word(1), turn=1, seq=1, epoch=1)  # 0 was lost on its way
        await wait_for(lambda: len(asked) == 1)
        assert asked == [OutputMissed(turn=1, first=0, last=0)]
        await asyncio.sleep(0.05)
        assert words(sock) == []  # the second word waits for the first
        await push(edge, session, word(0), turn=1, seq=0, epoch=1)  # sent again by the owner
        await wait_for(lambda: len(words(sock)) == 2)
        assert words(sock) == ["w0", "w1"]
    finally:
        await edge.stop()


async def _note(asked: list[OutputMissed], event: Event) -> None:
    if isinstance(event, OutputMissed):
        asked.append(event)


async def test_what_waits_goes_on_without_a_chunk_that_never_comes() -> None:
    edge, asked = await edge_and_owner(wait_ms=200)
    try:
        sock = await chunk_1_lost(edge)
        await wait_for(lambda: len(asked) == 1)
        await asyncio.sleep(0.05)
        assert words(sock) == ["w0"]
        await wait_for(lambda: len(words(sock)) == 2, timeout=5)
        assert words(sock) == ["w0", "w2"]
        assert edge.counters["chunks_lost"] == 1
        await push(edge, "s1", word(1), turn=1, seq=1, epoch=1)  # too late: the caller is past it
        await push(edge, "s1", word(3), turn=1, seq=3, epoch=1)
        await wait_for(lambda: len(words(sock)) == 3)
        assert words(sock) == ["w0", "w2", "w3"]
    finally:
        await edge.stop()


async def test_a_turn_cut_off_while_it_waits_for_a_lost_chunk_sends_nothing_more() -> None:
    edge, asked = await edge_and_owner(wait_ms=200)
    try:
        sock = await chunk_1_lost(edge)
        await wait_for(lambda: len(words(sock)) == 1)
        await push(edge, "s1", TurnInterrupted(turn=1), turn=1, epoch=1)
        await asyncio.sleep(0.4)  # past the wait
        assert asked == [OutputMissed(turn=1, first=1, last=1)]
        assert words(sock) == ["w0"]
        assert edge.counters["chunks_lost"] == 0
        await push(edge, "s1", word(0), turn=2, seq=0, epoch=1)  # the next turn is not held up
        await wait_for(lambda: len(words(sock)) == 2)
    finally:
        await edge.stop()


async def test_a_turn_whose_end_was_lost_is_asked_for_the_rest_and_completes() -> None:
    edge, asked = await edge_and_owner(wait_ms=50, report_ms=20)  # the report loop looks for them
    try:
        sock = FakeSocket()
        await edge.join("s1", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        await push(edge, "s1", word(0), turn=1, seq=0, epoch=1)
        await push(edge, "s1", word(1), turn=1, seq=1, epoch=1)  # its end (seq 2) is lost
        await wait_for(lambda: len(asked) == 1)
        assert asked == [OutputMissed(turn=1, first=2, last=2 + 9_999)]
        await push(edge, "s1", AgentGenerationComplete(), turn=1, seq=2, epoch=1)  # sent again
        await wait_for(lambda: "turn_complete" in words(sock))
        await push(edge, "s1", word(0), turn=2, seq=0, epoch=1)
        await push(edge, "s1", AgentGenerationComplete(), turn=2, seq=1, epoch=1)
        await asyncio.sleep(0.4)  # ended turns are never asked about
        assert len(asked) == 1 and edge.counters["turns_asked_for_the_rest"] == 1
    finally:
        await edge.stop()


async def test_the_report_loop_lets_what_waits_go_first_while_it_walks_many_sessions() -> None:
    """Every report interval the edge walks all its sessions; with 10,000 that walk was a 27 ms
    step five times a second, in which no chunk, barge-in or clear was handled. Now it lets what
    waits go first every SESSIONS_PER_STEP sessions: another task finds a walk half done."""
    settings = BroadcastSettings(report_interval_ms=20)
    edge = Edge(MemoryTransport(), MemoryStateStore(), settings, owner="t", max_frame_bytes=64_000)
    await edge.start()
    try:
        count = 2 * SESSIONS_PER_STEP + 1
        for _ in range(count):
            await edge.listen(new_session_id())
        sessions = list(edge.sessions.values())
        for session in sessions:
            session.heard.heard(1, 0)  # each has something to report
        await seen_half_done(lambda: sum(not s.heard.unreported for s in sessions), count)
        await wait_for(lambda: not any(s.heard.unreported for s in sessions))  # every one reported
    finally:
        await edge.stop()
