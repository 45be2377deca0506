"""An answer reaches the caller whole and in order although the broker loses one of its messages.

The owner numbers what the caller gets without gaps; the edge holds what comes after a gap, asks
for the missing numbers again (``OutputMissed``) and the owner sends them as they were. Found with
the 3-node cluster's frozen node (``tests/faults/test_cluster.py``): the node deleted the edge's
queue with a chunk in it as it thawed, and the caller heard the answer a word short in about half
the runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bargein import (
    AgentResponse,
    Bridge,
    ConversationContext,
    Event,
    OutputMissed,
    ReasoningNode,
    SessionInfo,
    UserStoppedSpeaking,
)
from bargein.errors import InvalidEnvelope
from bargein.testing import LocalSession
from bargein.wire.envelope import Envelope
from bargein.wire.order import Gap, TurnOrder

from .helpers import ask, reply_text

WORDS = "alpha bravo charlie delta"


class Words(ReasoningNode):
    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        for word in WORDS.split():
            yield AgentResponse(content=f"{word} ")


def talker(session: SessionInfo) -> Bridge:
    node = Words()
    bridge = Bridge(node)
    bridge.on(UserStoppedSpeaking).stream(node.generate).broadcast()
    return bridge


def chunk(turn: int, seq: int) -> Envelope:
    return Envelope.wrap("s", AgentResponse(content=f"w{seq} "), turn=turn, seq=seq, epoch=1)


def seqs(ready: list[tuple[Envelope, str]]) -> list[int]:
    return [envelope.seq for envelope, _ in ready]


def test_in_order_messages_pass_at_once() -> None:
    order: TurnOrder[str] = TurnOrder()
    for seq in range(3):
        ready, gap = order.arrive(chunk(1, seq), "x")
        assert (seqs(ready), gap) == ([seq], None)


def test_what_comes_after_a_gap_waits_for_it_and_the_gap_is_asked_for_once() -> None:
    order: TurnOrder[str] = TurnOrder()
    order.arrive(chunk(1, 0), "x")
    ready, gap = order.arrive(chunk(1, 3), "x")
    assert (ready, gap) == ([], Gap(1, 1, 2))
    ready, gap = order.arrive(chunk(1, 4), "x")
    assert (ready, gap) == ([], None)  # the same gap: not asked again
    assert order.waiting(1)
    ready, gap = order.arrive(chunk(1, 1), "x")
    assert (seqs(ready), gap) == ([1], None)
    ready, gap = order.arrive(chunk(1, 2), "x")
    assert (seqs(ready), gap) == ([2, 3, 4], None)
    assert not order.waiting(1)


def test_a_second_gap_is_asked_for_from_where_the_first_ended() -> None:
    order: TurnOrder[str] = TurnOrder()
    order.arrive(chunk(1, 0), "x")
    assert order.arrive(chunk(1, 2), "x")[1] == Gap(1, 1, 1)
    assert order.arrive(chunk(1, 5), "x")[1] == Gap(1, 3, 4)


def test_a_turns_first_chunk_lost_is_a_gap_too() -> None:
    order: TurnOrder[str] = TurnOrder()
    order.arrive(chunk(1, 0), "x")
    assert order.arrive(chunk(2, 1), "x") == ([], Gap(2, 0, 0))


def test_what_an_edge_hears_first_of_a_session_may_be_the_middle_of_a_turn() -> None:
    """A caller who reconnects through another edge mid-answer: that edge hears the turn from
    where it is, and asks for nothing before it."""
    order: TurnOrder[str] = TurnOrder()
    ready, gap = order.arrive(chunk(5, 7), "x")
    assert (seqs(ready), gap) == ([7], None)
    assert order.arrive(chunk(5, 9), "x") == ([], Gap(5, 8, 8))
    assert order.arrive(chunk(6, 1), "x") == ([], Gap(6, 0, 0))


def test_an_edge_that_heard_the_session_from_its_start_misses_no_first_chunk() -> None:
    """The edge that created the session listened before its owner could say a word: the first
    chunk it hears being a later one means the first was lost, and it is asked for."""
    order: TurnOrder[str] = TurnOrder(from_start=True)
    assert order.arrive(chunk(1, 2), "x") == ([], Gap(1, 0, 1))
    ready, gap = order.arrive(chunk(1, 0), "x")
    assert (seqs(ready), gap) == ([0], None)
    ready, gap = order.arrive(chunk(1, 1), "x")
    assert (seqs(ready), gap) == ([1, 2], None)


def test_a_repeat_or_a_resumed_turns_start_passes_for_the_fence_to_judge() -> None:
    order: TurnOrder[str] = TurnOrder()
    for seq in range(3):
        order.arrive(chunk(1, seq), "x")
    ready, gap = order.arrive(chunk(1, 0), "x")  # a new owner resumes the turn from its start
    assert (seqs(ready), gap) == ([0], None)


def test_giving_up_lets_what_waits_go_in_order_and_names_what_never_came() -> None:
    order: TurnOrder[str] = TurnOrder()
    order.arrive(chunk(1, 0), "x")
    order.arrive(chunk(1, 4), "x")
    order.arrive(chunk(1, 2), "x")
    released, lost = order.give_up(1)
    assert (seqs(released), lost) == ([2, 4], [1, 3])
    assert seqs(order.arrive(chunk(1, 5), "x")[0]) == [5]  # and the turn goes on from there
    assert order.give_up(1) == ([], [])


def test_a_cut_turn_holds_nothing_and_old_turns_pass_unordered() -> None:
    order: TurnOrder[str] = TurnOrder()
    order.arrive(chunk(1, 0), "x")
    order.arrive(chunk(1, 2), "x")
    order.forget(1)
    assert not order.waiting(1)
    assert order.give_up(1) == ([], [])
    assert seqs(order.arrive(chunk(1, 7), "x")[0]) == [7]  # the fence drops it, not the order


def test_a_turn_that_stops_without_its_end_is_asked_for_the_rest_once() -> None:
    """Its last message lost shows no gap: after a while without it, the owner is asked for
    whatever follows; once, until the turn hears more. An ended turn, or one holding messages
    behind a gap (that has its own wait), is not."""
    order: TurnOrder[str] = TurnOrder()
    for seq in range(3):
        order.arrive(chunk(1, seq), "x", now=10.0)
    order.arrive(chunk(2, 0), "x", now=10.0)
    order.ended(2)
    order.arrive(chunk(3, 0), "x", now=10.0)
    order.arrive(chunk(3, 2), "x", now=10.0)  # held
    assert order.stalled(now=12.0, after_s=3.0) == []
    assert order.stalled(now=13.0, after_s=3.0) == [Gap(1, 3, 3 + 9_999)]
    assert order.stalled(now=20.0, after_s=3.0) == []  # asked already
    order.arrive(chunk(1, 3), "x", now=21.0)
    assert order.stalled(now=24.0, after_s=3.0) == [Gap(1, 4, 4 + 9_999)]


def test_only_recent_turns_are_remembered() -> None:
    order: TurnOrder[str] = TurnOrder()
    for turn in range(1, 100):
        order.arrive(chunk(turn, 0), "x")
    assert len(order._turns) <= 16
    assert seqs(order.arrive(chunk(1, 5), "x")[0]) == [5]


async def test_the_owner_sends_again_what_the_edge_missed_as_it_was() -> None:
    async with LocalSession(talker) as s:
        await ask(s)
        answer = await s.collect_turn()
        assert reply_text(answer) == "alpha bravo charlie delta "
        turn = s.received[-1][0].turn
        sent = [(e.seq, e.payload) for e, _ in s.received if e.turn == turn]
        assert [seq for seq, _ in sent] == list(range(5))  # four words and the end: no gaps
        before = s.fence.dropped["duplicate"]
        await s.emit(OutputMissed(turn=turn, first=1, last=2))
        # they come again with their numbers: the fence drops them here (nothing was lost)
        assert s.fence.dropped["duplicate"] - before == 2
        assert s.runtime.counters["output_sent_again"] == 2
        # an edge that heard nothing for a while asks for the rest: what there is of it comes
        await s.emit(OutputMissed(turn=turn, first=3, last=3 + 9_999))
        assert s.runtime.counters["output_sent_again"] == 4
        assert s.runtime.counters["output_missed_unknown"] == 0  # nothing past the end was sent
        assert await s.quiet(0.1) == []


async def test_a_resumed_turns_owner_has_nothing_to_send_again() -> None:
    async with LocalSession(talker) as s:
        await ask(s)
        await s.collect_turn()
        turn = s.received[-1][0].turn
        await s.restart()  # a new owner: it never sent that turn
        await s.emit(OutputMissed(turn=turn, first=0, last=1))
        assert s.runtime.counters["output_sent_again"] == 0
        assert await s.quiet(0.1) == []  # the edge then goes on without them (chunks_lost)


def test_an_ask_that_names_no_gap_is_refused_where_it_is_decoded() -> None:
    """A bad message (or a forged one) must not make an owner walk a billion numbers: it is refused
    by the envelope's decoding (dead-lettered and counted by the transport)."""
    for first, last in ((5, 4), (0, 10**9)):
        envelope = Envelope(
            v=1, type="OutputMissed", session="s", payload={"turn": 1, "first": first, "last": last}
        )
        with pytest.raises(InvalidEnvelope):
            envelope.event()
    assert OutputMissed(turn=1, first=3, last=3).last == 3


def test_only_turns_under_way_are_watched_for_a_stall() -> None:
    """What the edge's report loop asks of every session: most have no turn under way, and cost
    it a glance."""
    order: TurnOrder[str] = TurnOrder()
    assert not order.open_turns
    order.arrive(chunk(1, 0), "x")
    order.arrive(chunk(2, 0), "x")
    assert order.open_turns
    order.ended(1)
    assert order.open_turns and [g.turn for g in order.stalled(now=1e9, after_s=1)] == [2]
    order.forget(2)  # cut off
    assert not order.open_turns and order.stalled(now=2e9, after_s=1) == []
