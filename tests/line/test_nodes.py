"""``ReasoningNode`` and ``ConversationContext`` through ``bargein.line``: Line 0.1's history handling
(``add_event`` merging, ``clear_context``, the context ``process_context`` gets) and the exact
committed history after an interrupt."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from bargein.line import Bridge, ConversationContext, Message, ReasoningNode, VoiceAgentSystem
from bargein.line.events import (
    AgentGenerationComplete,
    AgentResponse,
    AgentSpeechSent,
    DTMFInputEvent,
    Event,
    ToolCall,
    ToolResult,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.testing import LocalSession

from . import Speaker, ask, chunks, line_agent, text_of, wait_for


class Recorder(ReasoningNode):
    """Remembers every context it was given; answers 'ok'."""

    def __init__(self, **kw: Any) -> None:
        super().__init__("You are terse.", **kw)
        self.contexts: list[ConversationContext] = []

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        self.contexts.append(context)
        yield AgentResponse(content="ok")


def test_add_event_merges_consecutive_text_events_as_line_does() -> None:
    node = Recorder()
    node.add_event(UserTranscriptionReceived(content="Hello, "))
    node.add_event(Message(event=UserTranscriptionReceived(content="world")))  # a Message is unwrapped
    node.add_event(AgentResponse(content="Hi"))
    node.add_event(AgentResponse(content=" there."))
    node.add_event(DTMFInputEvent(button="1"))
    node.add_event(AgentSpeechSent(content="Hi "))
    node.add_event(AgentSpeechSent(content="there."))
    assert node.conversation_events == [
        UserTranscriptionReceived(content="Hello, world"),
        AgentResponse(content="Hi there."),
        DTMFInputEvent(button="1"),
        AgentSpeechSent(content="Hi there."),
    ]


def test_user_texts_that_would_run_together_are_joined_with_a_space() -> None:
    """Two texts typed while the broker was away reach the node at once: "alpha" and "bravo" are
    two utterances, not the word "alphabravo" (issue 27). The agent's own pieces stay as they are."""
    node = Recorder()
    for text in ("alpha", "bravo", " charlie", "delta. "):
        node.add_event(UserTranscriptionReceived(content=text))
    node.add_event(AgentResponse(content="Hel"))
    node.add_event(AgentResponse(content="lo."))
    assert node.conversation_events == [
        UserTranscriptionReceived(content="alpha bravo charlie delta. "),
        AgentResponse(content="Hello."),
    ]


def test_add_event_does_not_merge_across_other_events() -> None:
    node = Recorder()
    for event in (
        UserTranscriptionReceived(content="a"),
        AgentResponse(content="b"),
        UserTranscriptionReceived(content="c"),
    ):
        node.add_event(event)
    assert [type(e) for e in node.conversation_events] == [
        UserTranscriptionReceived,
        AgentResponse,
        UserTranscriptionReceived,
    ]


def test_clear_context_empties_the_history_and_returns_what_it_held() -> None:
    node = Recorder()
    node.add_event(UserTranscriptionReceived(content="a"))
    node.add_event(AgentResponse(content="b"))
    cleared = node.clear_context()
    assert cleared == [UserTranscriptionReceived(content="a"), AgentResponse(content="b")]
    assert node.conversation_events == []


def test_conversation_context_helpers() -> None:
    events: list[Event] = [
        UserTranscriptionReceived(content="first"),
        AgentResponse(content="answer"),
        UserTranscriptionReceived(content="second"),
        DTMFInputEvent(button="3"),
    ]
    ctx = ConversationContext(events, "be brief", {})
    assert ctx.get_latest_user_transcript_message() == "second"
    assert ctx.get_event_count() == 4
    ctx.add_metadata("caller", "+15550100")
    assert ctx.metadata == {"caller": "+15550100"}
    assert ConversationContext([], "x").get_latest_user_transcript_message() is None


def test_format_events_is_lines_text_rendering() -> None:
    """Line's ``format_events`` returns one line per event, ``"{type(event)}: {event}"``, of the last
    ``max_messages`` events (and no system prompt)."""
    events: list[Event] = [
        UserTranscriptionReceived(content="first"),
        AgentResponse(content="answer"),
        UserTranscriptionReceived(content="second"),
    ]
    ctx = ConversationContext(events, "be brief")
    assert ctx.format_events() == "\n".join(f"{type(e)}: {e}" for e in events)
    assert ctx.format_events(max_messages=1) == f"{type(events[-1])}: {events[-1]}"


async def test_process_context_gets_the_recent_history_and_the_system_prompt() -> None:
    node = Recorder(max_context_length=3, node_id="rec")

    def build(system: VoiceAgentSystem) -> None:
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived).map(node.add_event)
        bridge.on(UserStoppedSpeaking).stream(node.generate).broadcast()
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as s:
        for text in ("one", "two", "three"):
            await ask(s, text)
            assert await s.collect_turn() == [AgentResponse(content="ok"), AgentGenerationComplete()]
        assert s.received[0][0].source == "rec"  # the node's id is the source of its output
    ctx = node.contexts[-1]
    assert ctx.system_prompt == "You are terse."
    assert ctx.events == [  # the last max_context_length events
        UserTranscriptionReceived(content="two"),
        AgentResponse(content="ok"),
        UserTranscriptionReceived(content="three"),
    ]
    assert len(node.conversation_events) == 6 and node.conversation_events[-1] == AgentResponse(content="ok")


async def test_committed_events_after_an_interrupt_hold_exactly_what_was_delivered() -> None:
    words = " ".join(f"w{i}" for i in range(60))
    node = Speaker(words, delay=0.004, node_id="speaker")
    contexts: list[ConversationContext] = []
    original = node.process_context

    async def spy(context: ConversationContext) -> AsyncIterator[Event]:
        contexts.append(context)
        async for item in original(context):
            yield item

    node.process_context = spy  # type: ignore[method-assign]

    def build(system: VoiceAgentSystem) -> None:
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived).map(node.add_event)
        (
            bridge.on(UserStoppedSpeaking)
            .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate)
            .stream(node.generate)
            .broadcast()
        )
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as s:
        await ask(s, "talk")
        heard = await chunks(s, 3)
        await s.emit(UserStartedSpeaking())
        assert s.interrupted_turns == [1]
        await wait_for(lambda: node.cancelled == 1)
        assert heard == "w0 w1 w2 "
        await ask(s, "stop")
        text_of(await s.collect_turn())
    committed = contexts[-1].get_committed_events()
    assert committed == [
        UserTranscriptionReceived(content="talk"),
        AgentResponse(content="w0 w1 w2 "),
        UserTranscriptionReceived(content="stop"),
    ]


async def test_generate_records_tool_events_in_the_history_as_line_did() -> None:
    """Line's ``generate`` added every event ``process_context`` yielded to the history (via
    ``add_event``), so tool calls and results are part of the next context."""

    class Tooling(ReasoningNode):
        async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
            yield AgentResponse(content="Let me check. ")
            yield ToolCall(tool_name="lookup", tool_args={"q": "x"}, tool_call_id="c1")
            yield ToolResult(tool_name="lookup", tool_args={"q": "x"}, result=42, tool_call_id="c1")
            yield AgentResponse(content="It is 42.")

    node = Tooling("", node_id="tool")

    def build(system: VoiceAgentSystem) -> None:
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived).map(node.add_event)
        bridge.on(UserStoppedSpeaking).stream(node.generate).broadcast()
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as s:
        await ask(s, "what is it?")
        await s.collect_turn()
    assert node.conversation_events == [
        UserTranscriptionReceived(content="what is it?"),
        AgentResponse(content="Let me check. "),
        ToolCall(tool_name="lookup", tool_args={"q": "x"}, tool_call_id="c1"),
        ToolResult(tool_name="lookup", tool_args={"q": "x"}, result=42, tool_call_id="c1"),
        AgentResponse(content="It is 42."),
    ]
