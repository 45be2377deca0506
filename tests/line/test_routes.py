"""The route DSL through ``bargein.line``: Line 0.1's forms, including the ones that were broken in
Line (several ``interrupt_on`` on one route, ``suspend_on``/``resume_on``, ``AgentHandoff``, async
handlers), each run in a session."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bargein.line import Bridge, Message, Node, VoiceAgentSystem
from bargein.line.events import (
    AgentGenerationComplete,
    AgentHandoff,
    AgentResponse,
    AgentStartedSpeaking,
    AgentStoppedSpeaking,
    CustomReceived,
    DTMFInputEvent,
    LogMetric,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.testing import LocalSession

from . import Speaker, ask, chunks, line_agent, text_of, wait_for

WORDS = "one two three four five six seven eight"


def speaking(node: Node, bridge: Bridge) -> Any:
    def build(system: VoiceAgentSystem) -> None:
        system.with_speaking_node(node, bridge)

    return build


async def test_property_filters_take_a_literal_or_a_predicate() -> None:
    literal: list[str] = []
    predicate: list[str] = []

    def build(system: VoiceAgentSystem) -> None:
        node = Node(node_id="keys")
        bridge = Bridge(node)
        bridge.on(DTMFInputEvent, button="1").map(lambda m: literal.append(m.event.button))
        bridge.on(DTMFInputEvent, button=lambda b: b in "*#").map(lambda m: predicate.append(m.event.button))
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as s:
        for button in "1#2*1":
            await s.emit(DTMFInputEvent(button=button))
    assert literal == ["1", "1"]
    assert predicate == ["#", "*"]


async def test_filter_fn_receives_the_bus_message_and_combines_with_property_filters() -> None:
    seen: list[Message] = []
    passed: list[str] = []

    def check(message: Message) -> bool:
        seen.append(message)
        return message.event.content.startswith("yes")

    def build(system: VoiceAgentSystem) -> None:
        node = Node(node_id="n")
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived, filter_fn=check, content=lambda c: c.endswith("!")).map(
            lambda m: passed.append(m.event.content)
        )
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as s:
        for text in ("yes!", "no!", "yes", "yes please!"):
            await s.emit(UserTranscriptionReceived(content=text))
    assert passed == ["yes!", "yes please!"]
    first = seen[0]
    assert isinstance(first, Message) and isinstance(first.event, UserTranscriptionReceived)
    assert first.source == "user" and isinstance(first.id, str) and first.id
    assert isinstance(first.timestamp, float) and first.timestamp > 0
    assert len({m.id for m in seen}) == len(seen)


@pytest.mark.parametrize("keyword", ["filter_fn", "condition"])
async def test_interrupt_filter_fn_and_condition_are_the_same_thing(keyword: str) -> None:
    node = Speaker(WORDS, delay=0.02)

    def build(system: VoiceAgentSystem) -> None:
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived).map(node.add_event)
        only_hash = {keyword: lambda m: m.event.button == "#"}
        bridge.on(UserStoppedSpeaking).interrupt_on(DTMFInputEvent, **only_hash).stream(
            node.generate
        ).broadcast()
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as s:
        await ask(s, "go")
        await chunks(s, 2)
        await s.emit(DTMFInputEvent(button="3"))  # declined by the filter
        assert s.interrupted_turns == []
        await s.emit(DTMFInputEvent(button="#"))
        assert s.interrupted_turns == [1]
        assert await s.quiet(0.2) == []


async def test_several_interrupt_on_calls_on_one_route_each_interrupt_with_their_own_handler() -> None:
    node = Speaker(WORDS, delay=0.02)
    by_speech: list[Message] = []
    by_key: list[Message] = []

    async def on_key(message: Message) -> None:  # async handlers are awaited
        await asyncio.sleep(0)
        by_key.append(message)

    def build(system: VoiceAgentSystem) -> None:
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived).map(node.add_event)
        (
            bridge.on(UserStoppedSpeaking)
            .interrupt_on(UserStartedSpeaking, handler=by_speech.append)
            .interrupt_on(DTMFInputEvent, handler=on_key, filter_fn=lambda m: m.event.button == "0")
            .stream(node.generate)
            .broadcast()
        )
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as s:
        await ask(s, "first")
        await chunks(s, 2)
        await s.emit(DTMFInputEvent(button="0"))
        await wait_for(lambda: len(by_key) == 1)
        assert s.interrupted_turns == [1] and by_speech == []
        assert by_key[0].event == DTMFInputEvent(button="0")

        await ask(s, "second")
        await chunks(s, 2)
        await s.emit(UserStartedSpeaking())
        await wait_for(lambda: len(by_speech) == 1)
        assert s.interrupted_turns == [1, 2] and len(by_key) == 1

        await ask(s, "third")
        await chunks(s, 2)
        await s.emit(DTMFInputEvent(button="7"))  # not the button: the answer goes on to the end
        rest = await s.collect_turn()
        assert isinstance(rest[-1], AgentGenerationComplete) and s.interrupted_turns == [1, 2]
    assert node.cancelled == 2


async def test_suspend_on_and_resume_on_stop_and_restart_a_route_with_their_handlers() -> None:
    node = Speaker("short answer", delay=0.001)
    calls: list[str] = []

    def build(system: VoiceAgentSystem) -> None:
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived).map(node.add_event)
        (
            bridge.on(UserStoppedSpeaking)
            .suspend_on(
                AgentStartedSpeaking, handler=lambda m: calls.append(f"suspend:{type(m.event).__name__}")
            )
            .resume_on(AgentStoppedSpeaking, handler=lambda: calls.append("resume"))
            .stream(node.generate)
            .broadcast()
        )
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as s:
        await ask(s, "before")
        assert text_of(await s.collect_turn()) == "short answer"
        await s.emit(AgentStartedSpeaking())
        await ask(s, "while suspended")
        assert await s.quiet(0.2) == []
        await s.emit(AgentStoppedSpeaking())
        await ask(s, "after")
        assert text_of(await s.collect_turn()) == "short answer"
    assert calls == ["suspend:AgentStartedSpeaking", "resume"]
    assert node.started == 2


async def test_suspend_on_cuts_off_the_running_turn_then_runs_its_handler() -> None:
    """Line's ``_suspend``: mark the route suspended, cancel what it is running, then run the suspend
    handler (in Line 0.1 the last two steps tripped an assertion while a turn was running)."""
    node = Speaker(WORDS, delay=0.02)
    handled: list[int] = []

    def build(system: VoiceAgentSystem) -> None:
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived).map(node.add_event)
        (
            bridge.on(UserStoppedSpeaking)
            .suspend_on(AgentStartedSpeaking, handler=lambda: handled.append(node.cancelled))
            .resume_on(AgentStoppedSpeaking)
            .stream(node.generate)
            .broadcast()
        )
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as s:
        await ask(s, "go")
        await chunks(s, 2)
        await s.emit(AgentStartedSpeaking())
        assert s.interrupted_turns == [1]
        assert await s.quiet(0.2) == []
        await wait_for(lambda: handled == [1])  # the handler ran after the turn had unwound


async def test_authorize_limits_which_nodes_broadcasts_a_bridge_hears() -> None:
    heard: dict[str, list[str]] = {"open": [], "helper_only": [], "other_only": []}

    def build(system: VoiceAgentSystem) -> None:
        speaker = Node(node_id="speaker")
        speaker_bridge = Bridge(speaker)
        system.with_speaking_node(speaker, speaker_bridge)

        helper = Node(node_id="helper")
        helper_bridge = Bridge(helper)
        helper_bridge.on(UserTranscriptionReceived).map(
            lambda m: CustomReceived(metadata={"said": m.event.content})
        ).broadcast()
        system.with_node(helper, helper_bridge)

        for name, allowed in (("open", None), ("helper_only", "helper"), ("other_only", "nobody")):
            listener = Node(node_id=f"listener-{name}")
            bridge = Bridge(listener)
            if allowed is not None:
                assert bridge.authorize(allowed) is bridge
            bridge.on(CustomReceived).map(lambda m, name=name: heard[name].append(m.source))
            bridge.on(LogMetric).map(lambda m, name=name: heard[name].append(f"user:{m.event.name}"))
            system.with_node(listener, bridge)

    async with LocalSession(line_agent(build)) as s:
        await s.emit(UserTranscriptionReceived(content="hi"))
        await s.emit(LogMetric(name="from-caller", value=1))  # the caller's events reach every bridge
        await wait_for(lambda: len(heard["open"]) == 2 and len(heard["helper_only"]) == 2)
        assert await s.quiet(0.1) == []  # a background node's broadcast never reaches the caller
    assert sorted(heard["open"]) == sorted(["helper", "user:from-caller"])
    assert sorted(heard["helper_only"]) == sorted(["helper", "user:from-caller"])
    assert heard["other_only"] == ["user:from-caller"]


async def test_agent_handoff_reaches_bridges_and_interrupts() -> None:
    node = Speaker(WORDS, delay=0.02)
    handoffs: list[str] = []
    handled: list[Message] = []

    def build(system: VoiceAgentSystem) -> None:
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived).map(node.add_event)
        bridge.on(AgentHandoff).map(lambda m: handoffs.append(m.event.target_agent))
        (
            bridge.on(UserStoppedSpeaking)
            .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate)
            .interrupt_on(AgentHandoff, handler=handled.append)
            .stream(node.generate)
            .broadcast()
        )
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as s:
        await ask(s, "go")
        heard = await chunks(s, 2)
        await s.emit(AgentHandoff(target_agent="billing", reason="asked about a bill"))
        assert s.interrupted_turns == [1]
        await wait_for(lambda: len(handled) == 1)
        assert await s.quiet(0.2) == []
        assert handoffs == ["billing"]
        assert handled[0].event == AgentHandoff(target_agent="billing", reason="asked about a bill")
        assert node.conversation_events[-1] == AgentResponse(content=heard)


async def test_map_filter_broadcast_event_type_and_on_chained_from_a_route() -> None:
    def build(system: VoiceAgentSystem) -> None:
        node = Node(node_id="shout")
        bridge = Bridge(node)
        (
            bridge.on(UserTranscriptionReceived)
            .map(lambda m: m.event.content)
            .filter(lambda text: text != "skip")
            .map(str.upper)
            .broadcast(AgentResponse)
            .on(DTMFInputEvent)  # Line's user bridge chained its routes like this
            .map(lambda m: {"content": f"key {m.event.button}"})
            .broadcast(event_type=AgentResponse)
        )
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as s:
        await s.emit(UserTranscriptionReceived(content="hello"))
        await s.emit(UserTranscriptionReceived(content="skip"))
        await s.emit(DTMFInputEvent(button="9"))
        assert [await s.next(), await s.next()] == [
            AgentResponse(content="HELLO"),
            AgentResponse(content="key 9"),
        ]
        assert await s.quiet(0.1) == []


async def test_node_start_and_cleanup_are_called() -> None:
    calls: list[str] = []

    class Tracked(Node):
        async def start(self) -> None:
            calls.append("start")

        async def cleanup(self) -> None:
            calls.append("cleanup")

    def build(system: VoiceAgentSystem) -> None:
        node = Tracked(node_id="t")
        system.with_speaking_node(node, Bridge(node))

    async with LocalSession(line_agent(build)):
        await wait_for(lambda: calls == ["start"])
    assert calls == ["start", "cleanup"]


# --- Line 0.1.12 behaviour bargein does not have yet -------------------------------------------------


async def test_bridge_on_filters_on_the_message_source() -> None:
    """Line's ``bridge.on(Event, source=...)`` (also ``id=``, ``timestamp=``) filters on the message,
    not the event: a literal or a predicate, like the property filters."""
    from_helper: list[str] = []

    def build(system: VoiceAgentSystem) -> None:
        speaker = Node(node_id="speaker")
        speaker_bridge = Bridge(speaker)
        speaker_bridge.on(CustomReceived, source="helper").map(lambda m: from_helper.append(m.source))
        system.with_speaking_node(speaker, speaker_bridge)
        helper = Node(node_id="helper")
        helper_bridge = Bridge(helper)
        helper_bridge.on(UserTranscriptionReceived).map(lambda m: CustomReceived(metadata={})).broadcast()
        system.with_node(helper, helper_bridge)

    async with LocalSession(line_agent(build)) as s:
        await s.emit(CustomReceived(metadata={}))  # from the caller: filtered out
        await s.emit(UserTranscriptionReceived(content="hi"))  # makes the helper broadcast
        await wait_for(lambda: from_helper == ["helper"])
        assert await s.quiet(0.1) == []
    assert from_helper == ["helper"]


async def test_a_bridge_hears_its_own_broadcasts() -> None:
    """Line's bus delivered every broadcast to every bridge, the sender's included; Line's DTMF
    storyteller relies on it (its node broadcasts DTMFStoppedEvent and its own bridge generates on
    it)."""
    node = Speaker("you pressed a key", delay=0.001)

    def build(system: VoiceAgentSystem) -> None:
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived).map(node.add_event)
        bridge.on(DTMFInputEvent).map(lambda m: LogMetric(name="dtmf_done", value=m.event.button)).broadcast()
        bridge.on(LogMetric, name="dtmf_done").stream(node.generate).broadcast()
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as s:
        await s.emit(UserTranscriptionReceived(content="menu"))
        await s.emit(DTMFInputEvent(button="4"))
        assert await s.next() == LogMetric(name="dtmf_done", value="4")
        assert text_of(await s.collect_turn(timeout=5)) == "you pressed a key"
