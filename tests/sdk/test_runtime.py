"""The session runtime: order, one turn at a time, checkpoints, leases and epochs, node ids."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bargein import (
    AgentGenerationComplete,
    AgentResponse,
    BargeinError,
    Bridge,
    ConversationContext,
    Event,
    Message,
    Node,
    ReasoningNode,
    SessionInfo,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.errors import StaleEpochError
from bargein.testing import LocalSession
from bargein.transport.memory import MemoryStateStore
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN

from .helpers import reply_text


async def test_events_are_handled_in_the_order_they_were_published() -> None:
    seen: list[str] = []

    def agent(session: SessionInfo) -> Bridge:
        bridge = Bridge(Node())

        async def record(message: Message) -> None:
            await asyncio.sleep(0)  # yields to other tasks: order must still hold
            seen.append(message.event.content)  # type: ignore[attr-defined]

        bridge.on(UserTranscriptionReceived).map(record)
        return bridge

    async with LocalSession(agent) as s:
        for i in range(200):  # published back to back, without waiting for each
            env = Envelope.wrap(s.session_id, UserTranscriptionReceived(content=str(i)), seq=i)
            await s.transport.publish(env, IN)
        await s.settle()
        assert seen == [str(i) for i in range(200)]


class Counting(ReasoningNode):
    """Counts concurrent generations and completed turns (plain data: checkpointed)."""

    active = 0
    max_active = 0

    def __init__(self) -> None:
        super().__init__()
        self.turns_done = 0
        self.notes: dict[str, Any] = {"greeting": "hi", "sizes": [1, 2, 3]}

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        Counting.active += 1
        Counting.max_active = max(Counting.max_active, Counting.active)
        try:
            for i in range(5):
                await asyncio.sleep(0.01)
                yield AgentResponse(content=f"t{self.turns_done}.{i} ")
            self.turns_done += 1
        finally:
            Counting.active -= 1


def counting_agent(session: SessionInfo) -> Bridge:
    node = Counting()
    bridge = Bridge(node)
    bridge.on(UserStoppedSpeaking).stream(node.generate).broadcast()
    return bridge


async def test_one_generation_at_a_time_and_turns_in_order() -> None:
    Counting.max_active = 0
    async with LocalSession(counting_agent) as s:
        for _ in range(3):  # three triggers at once, no interrupt
            await s.emit(UserStoppedSpeaking())
        turns = [await s.collect_turn() for _ in range(3)]
        assert Counting.max_active == 1
        assert [reply_text(t) for t in turns] == [
            "t0.0 t0.1 t0.2 t0.3 t0.4 ",
            "t1.0 t1.1 t1.2 t1.3 t1.4 ",
            "t2.0 t2.1 t2.2 t2.3 t2.4 ",
        ]
        assert [env.turn for env, _ in s.received if isinstance(_, AgentGenerationComplete)] == [1, 2, 3]


async def test_a_caller_that_keeps_nothing_still_hands_everything_out() -> None:
    """A long-running caller (a benchmark's) keeps none of what it received: memory, and work for
    the garbage collector, that would grow with the call."""
    async with LocalSession(counting_agent, keep_received=False) as s:
        await s.emit(UserStoppedSpeaking())
        assert reply_text(await s.collect_turn()) == "t0.0 t0.1 t0.2 t0.3 t0.4 "
        assert s.received == []


async def test_checkpoint_restores_nodes_and_turn_numbers_in_a_new_owner() -> None:
    async with LocalSession(counting_agent) as s:
        await s.emit(UserStoppedSpeaking())
        await s.collect_turn()
        first = s.nodes[0]
        assert isinstance(first, Counting)
        first.notes["greeting"] = "changed"
        first.turns_done = 7
        epoch_before = s.runtime.epoch
        await s.restart()
        second = s.nodes[0]
        assert isinstance(second, Counting) and second is not first
        assert second.turns_done == 7 and second.notes == {"greeting": "changed", "sizes": [1, 2, 3]}
        assert s.runtime.epoch == epoch_before + 1
        await s.emit(UserStoppedSpeaking())
        events = await s.collect_turn()
        assert reply_text(events).startswith("t7.0")
        assert s.received[-1][0].turn == 2
        assert s.received[-1][0].epoch == epoch_before + 1


async def test_leases_hand_out_increasing_epochs_and_fence_stale_writers() -> None:
    store = MemoryStateStore()
    e1 = await store.acquire_lease("reasoning", "s1", "worker-a", ttl_ms=50)
    assert e1 == 1
    assert await store.acquire_lease("reasoning", "s1", "worker-b", ttl_ms=50) is None  # held
    assert not await store.renew_lease("reasoning", "s1", "worker-b", 1, 50)  # not b's
    await store.save_state("reasoning", "s1", 1, b"a", 60_000)
    await asyncio.sleep(0.08)  # a's lease lapses (a paused, say)
    e2 = await store.acquire_lease("reasoning", "s1", "worker-b", ttl_ms=5_000)
    assert e2 == 2
    assert not await store.renew_lease("reasoning", "s1", "worker-a", 1, 50)
    with pytest.raises(StaleEpochError):
        await store.save_state("reasoning", "s1", 1, b"stale", 60_000)  # a wakes up and tries to write
    await store.save_state("reasoning", "s1", 2, b"b", 60_000)
    assert await store.load_state("reasoning", "s1") == b"b"
    await store.release_lease("reasoning", "s1", "worker-b", 2)
    assert await store.acquire_lease("reasoning", "s1", "worker-a", ttl_ms=50) == 3


async def test_a_superseded_runtime_cannot_checkpoint_over_its_successor() -> None:
    async with LocalSession(counting_agent) as s:
        runtime = s.runtime
        # another owner takes the session over behind this one's back
        await s.store.release_lease("reasoning", s.session_id, runtime.owner, runtime.epoch)
        assert await s.store.acquire_lease("reasoning", s.session_id, "intruder", 60_000) == 2
        await s.store.save_state("reasoning", s.session_id, 2, b"the successor's", 60_000)
        await runtime.checkpoint()
        assert runtime.counters["checkpoints_refused"] == 1
        assert await s.store.load_state("reasoning", s.session_id) == b"the successor's"
        # and the host's next renewal says the lease is lost, which closes the session here
        assert not await s.store.renew_lease("reasoning", s.session_id, runtime.owner, runtime.epoch, 60_000)


async def test_node_ids_are_deterministic() -> None:
    def agent(session: SessionInfo) -> list[Bridge]:
        return [Bridge(ReasoningNode()), Bridge(ReasoningNode()), Bridge(ReasoningNode(node_id="named"))]

    async with LocalSession(agent) as s:
        assert [n.id for n in s.nodes] == ["ReasoningNode", "ReasoningNode-2", "named"]


async def test_agent_must_return_bridges() -> None:
    with pytest.raises(BargeinError, match="must return a Bridge"):
        async with LocalSession(lambda session: "not a bridge"):  # type: ignore[arg-type, return-value]
            pass


async def test_async_agent_and_session_options() -> None:
    seen: dict[str, Any] = {}

    async def agent(session: SessionInfo) -> Bridge:
        seen.update(session.options, id=session.id)
        return Bridge(Node())

    async with LocalSession(agent, session_id="sess-1", options={"lang": "fr"}):
        assert seen == {"lang": "fr", "id": "sess-1"}


async def test_other_bridges_hear_a_nodes_broadcasts() -> None:
    """Line-style background reasoning: one node's output is input for the session's other bridges."""
    heard: list[str] = []

    def agent(session: SessionInfo) -> list[Bridge]:
        talker = ReasoningNode(node_id="talker")

        async def speak(message: Message) -> AsyncIterator[AgentResponse]:
            yield AgentResponse(content="hello there")

        talk = Bridge(talker)
        talk.on(UserStoppedSpeaking).stream(speak).broadcast()
        listener = Bridge(Node(node_id="listener"))
        listener.on(AgentResponse).map(lambda m: heard.append(f"{m.source}:{m.event.content}"))
        return [talk, listener]

    async with LocalSession(agent) as s:
        await s.emit(UserStoppedSpeaking())
        assert await s.next() == AgentResponse(content="hello there")
        await s.broker.settle()
        assert heard == ["talker:hello there"]


@pytest.mark.parametrize(
    "agent, policy",
    [
        ("basic", {"UserStartedSpeaking"}),
        ("condition", set()),  # conditional: the edge must wait for the owner's TurnInterrupted
        ("multiple_events", {"UserStartedSpeaking", "EmergencyStop", "AgentHandoff"}),
    ],
)
async def test_owner_tells_the_edge_which_events_always_interrupt(agent: str, policy: set[str]) -> None:
    from bargein.examples import seed

    async with LocalSession(getattr(seed, agent)) as s:
        await s.broker.settle()
        assert s.policy == policy
