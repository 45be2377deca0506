"""Dispatching never waits for a route's work: interrupts act at once, routes run side by side,
and a turn still sees what the events before its trigger did.

The case that started it: with ``bridge.on(SomeEvent).map(handler)`` where the handler awaits for
1 s, a ``UserStartedSpeaking`` sent 50 ms after ``SomeEvent`` took effect about 950 ms later,
because routes that do not stream ran inline under the session's dispatch lock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from bargein import (
    AgentResponse,
    Bridge,
    ConversationContext,
    CustomReceived,
    Event,
    Message,
    ReasoningNode,
    SessionInfo,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.testing import LocalSession
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN

from .helpers import take_chunks, wait_for

SLOW_MAP_S = 1.0


class Talker(ReasoningNode):
    """Streams a chunk every 10 ms until cut off; records when and against what it answered."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled_at: float | None = None
        self.map_started_at: float | None = None
        self.map_finished_at: float | None = None
        self.contexts: list[list[str]] = []  # the user lines each answer was given

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        self.contexts.append([m["content"] for m in context.format_messages() if m["role"] == "user"])
        try:
            for i in range(500):
                yield AgentResponse(content=f"c{i} ")
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.cancelled_at = time.monotonic()
            raise

    async def slow(self, message: Message) -> None:
        self.map_started_at = time.monotonic()
        await asyncio.sleep(SLOW_MAP_S)
        self.map_finished_at = time.monotonic()

    async def slowly_add(self, message: Message) -> None:
        await asyncio.sleep(0.3)
        self.add_event(message)


def agent(session: SessionInfo) -> Bridge:
    node = Talker()
    bridge = Bridge(node)
    bridge.on(CustomReceived).map(node.slow)
    bridge.on(UserTranscriptionReceived).map(node.slowly_add)
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate)
        .stream(node.generate)
        .broadcast()
    )
    return bridge


async def publish(s: LocalSession, event: Event) -> None:
    """Put ``event`` on the bus without waiting for anything (``emit`` waits for the routes)."""
    await s.transport.publish(Envelope.wrap(s.session_id, event, source="user"), IN)


def talker(s: LocalSession) -> Talker:
    node = s.nodes[0]
    assert isinstance(node, Talker)
    return node


async def test_an_interrupt_takes_effect_while_another_routes_slow_map_runs() -> None:
    async with LocalSession(agent) as s:
        await s.emit(UserStoppedSpeaking())
        await take_chunks(s, 2)  # the answer is streaming
        node = talker(s)
        await publish(s, CustomReceived(metadata={"slow": True}))  # its .map() takes 1 s
        await wait_for(lambda: node.map_started_at is not None)
        await asyncio.sleep(0.05)
        sent = time.monotonic()
        await publish(s, UserStartedSpeaking())
        await wait_for(lambda: node.cancelled_at is not None, timeout=SLOW_MAP_S * 3)
        assert node.cancelled_at is not None
        assert node.map_finished_at is None or node.map_finished_at > node.cancelled_at
        assert node.cancelled_at - sent < 0.05  # one hop in process, not behind the slow map
        await s.wait_interrupted(1)


async def test_routes_run_side_by_side_each_in_its_own_order() -> None:
    seen: list[str] = []

    def two_routes(session: SessionInfo) -> Bridge:
        node = Talker()
        bridge = Bridge(node)
        bridge.on(CustomReceived).map(node.slow)

        async def note(message: Message) -> None:
            await asyncio.sleep(0)
            assert isinstance(message.event, UserTranscriptionReceived)
            seen.append(message.event.content)

        bridge.on(UserTranscriptionReceived).map(note)
        return bridge

    async with LocalSession(two_routes) as s:
        node = talker(s)
        await publish(s, CustomReceived())
        for i in range(20):
            await publish(s, UserTranscriptionReceived(content=str(i)))
        await wait_for(lambda: len(seen) == 20, timeout=SLOW_MAP_S / 2)
        assert seen == [str(i) for i in range(20)]  # in order, and not after the slow route
        assert node.map_finished_at is None


async def test_a_turn_sees_what_a_slow_map_did_with_the_events_before_its_trigger() -> None:
    async with LocalSession(agent) as s:
        await publish(s, UserTranscriptionReceived(content="first question"))  # added after 0.3 s
        await publish(s, UserStoppedSpeaking())  # the turn waits for that
        await take_chunks(s, 1)
        assert talker(s).contexts == [["first question"]]


async def test_an_interrupt_drops_a_trigger_still_waiting_for_earlier_events() -> None:
    async with LocalSession(agent) as s:
        node = talker(s)
        await publish(s, UserTranscriptionReceived(content="never mind"))  # 0.3 s to add
        await publish(s, UserStoppedSpeaking())  # waits at the barrier
        await asyncio.sleep(0.05)
        await publish(s, UserStartedSpeaking())  # the caller speaks again before any answer
        assert await s.quiet(0.5) == []
        assert node.contexts == []  # no answer was started for the stale trigger
        assert s.runtime.counters["triggers_dropped"] == 1
        assert s.runtime.counters["interrupts"] == 0  # nothing ran, so nothing was cut (no handler)
        await s.emit(UserStoppedSpeaking())  # the next trigger is answered as usual
        await take_chunks(s, 1)
        assert node.contexts == [["never mind"]]


async def test_a_map_in_progress_when_the_owner_dies_runs_again_at_the_adopter() -> None:
    async with LocalSession(agent) as s:
        await publish(s, UserTranscriptionReceived(content="lost?"))
        await publish(s, UserStoppedSpeaking())
        await asyncio.sleep(0.1)  # acknowledged, checkpointed, the map is still running
        await s.crash()
        await take_chunks(s, 1)  # the adopter added the transcript, then ran the turn
        assert talker(s).contexts == [["lost?"]]
        assert s.runtime.counters["turns_resumed"] == 0  # the turn had not started: a plain run
