"""The agent the Line integration tests' reasoning process runs: a Line-style dispatcher.

``tests.integration.agents:by_option`` cannot start a Line-style agent: it calls ``agent(session)``,
and the runtime recognises a Line-style ``handle_new_call(system, call_request)`` by the signature of
the configured agent, which is ``by_option``'s one parameter. This dispatcher has the two-parameter
signature, so the runtime hands it the ``VoiceAgentSystem`` and ``CallRequest``, and it passes both on
to the ``handle_new_call`` (or ``VoiceAgentApp``) that ``options["agent"]`` names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from pydantic import BaseModel

from bargein.hosting.loader import load_agent
from bargein.line import (
    Bridge,
    CallRequest,
    ConversationContext,
    Message,
    Node,
    PreCallResult,
    ReasoningNode,
    VoiceAgentApp,
    VoiceAgentSystem,
)
from bargein.line.events import (
    AgentResponse,
    DTMFInputEvent,
    DTMFOutputEvent,
    Event,
    LogMetric,
    ToolCall,
    ToolResult,
    TransferCall,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.line.system import is_line_style


async def by_option(system: VoiceAgentSystem, call_request: CallRequest) -> None:
    spec = str(call_request.options["agent"])
    agent = load_agent(spec)
    if not is_line_style(agent):
        raise TypeError(f"{spec} is not a Line-style handle_new_call(system, call_request)")
    await agent(system, call_request)  # type: ignore[call-arg]


# --- a Line agent with its own events as plain pydantic models (sales_with_leads' shape) ----------


class Lead(BaseModel):
    name: str


class LeadsChat(ReasoningNode):
    """Answers with every lead its history holds (the leads node's plain-model events)."""

    async def process_context(self, context: ConversationContext) -> AsyncIterator[AgentResponse]:
        names = [e.name for e in context.events if isinstance(e, Lead)]
        yield AgentResponse(content="Leads: " + ", ".join(names) + ".")


async def leads(system: VoiceAgentSystem, call_request: CallRequest) -> None:
    chat, scout = LeadsChat(node_id="chat"), Node(node_id="scout")
    chat_bridge, scout_bridge = Bridge(chat), Bridge(scout)
    scout_bridge.on(UserTranscriptionReceived).map(lambda m: Lead(name=m.event.content)).broadcast()
    chat_bridge.on(Lead).map(chat.add_event)
    chat_bridge.on(UserStoppedSpeaking).stream(chat.generate).broadcast()
    system.with_speaking_node(chat, chat_bridge)
    system.with_node(scout, scout_bridge)
    await system.start()
    await system.wait_for_shutdown()


# --- a Line agent that acts besides speaking (form-filling's and personal_banking's shapes) --------


class Desk(ReasoningNode):
    """Records answers with a tool (a ``ToolCall``, its ``ToolResult`` and a ``LogMetric``, as
    form-filling does), presses keys (``DTMFOutputEvent``) and transfers the call (``TransferCall``,
    as personal_banking's handoff to a human does): "answer 42", "press 5", "transfer +1...".
    Anything else is answered with what it was."""

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        said = context.get_latest_user_transcript_message() or ""
        verb, _, rest = said.partition(" ")
        if verb == "answer":
            yield ToolCall(tool_name="record_answer", tool_args={"answer": rest}, tool_call_id="call-1")
            yield LogMetric(name="answer", value=rest)
            yield ToolResult(tool_name="record_answer", tool_args={"answer": rest}, result="recorded")
            yield AgentResponse(content=f"Recorded {rest}.")
        elif verb == "press":
            yield DTMFOutputEvent(button=rest)
            yield AgentResponse(content=f"Pressed {rest}.")
        elif verb == "transfer":
            yield AgentResponse(content="Transferring you now.")
            yield TransferCall(target_phone_number=rest, reason="the caller asked for a person")
        else:
            yield AgentResponse(content=f"You said {said}.")


async def desk(system: VoiceAgentSystem, call_request: CallRequest) -> None:
    node = Desk(node_id="desk")
    bridge = Bridge(node)
    system.with_speaking_node(node, bridge=bridge)
    bridge.on(UserTranscriptionReceived).map(node.add_event)
    bridge.on(UserStoppedSpeaking).interrupt_on(
        UserStartedSpeaking, handler=node.on_interrupt_generate
    ).stream(node.generate).broadcast()
    await system.start()
    await system.wait_for_shutdown()


# --- a pre-call handler (outbound_call_info's shape): it may reject a call or give it metadata ----


async def screen(call_request: CallRequest) -> PreCallResult | None:
    if call_request.to == "911":
        return None  # not a number this agent calls
    care = "extra" if call_request.to == "+15555555555" else "normal"
    return PreCallResult(metadata={"care": care}, config={"tts": {"voice": "ignored-by-bargein"}})


async def greet_by_metadata(system: VoiceAgentSystem, call_request: CallRequest) -> None:
    node = Desk(node_id="outbound")
    bridge = Bridge(node)
    system.with_speaking_node(node, bridge=bridge)
    bridge.on(UserTranscriptionReceived).map(node.add_event)
    bridge.on(UserStoppedSpeaking).stream(node.generate).broadcast()
    await system.start()
    await system.send_initial_message(f"Hello {call_request.to}, with {call_request.metadata['care']} care.")
    await system.wait_for_shutdown()


outbound = VoiceAgentApp(call_handler=greet_by_metadata, pre_call_handler=screen)


# --- keys, debounced (dtmf_storyteller's shape): a key press waits to see whether another follows --


class KeysDone(BaseModel):
    buttons: str


class Keys(ReasoningNode):
    """Tells a long story on "story"; answers the keys pressed once no other key followed for
    ``debounce_s`` (the options' ``debounce_s``, 1.0 s by default, as in Line's example)."""

    def __init__(self, debounce_s: float) -> None:
        super().__init__(node_id="keys")
        self.debounce_s = debounce_s
        self.latest_key: str | None = None
        self.buttons = ""

    async def on_key(self, message: Message) -> KeysDone | None:
        self.latest_key = message.id
        self.buttons += message.event.button
        await asyncio.sleep(self.debounce_s)
        if self.latest_key != message.id:
            return None  # a later key answers for both
        done, self.buttons = KeysDone(buttons=self.buttons), ""
        return done

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        keys = [e for e in context.events if isinstance(e, KeysDone)]
        if keys and isinstance(context.events[-1], KeysDone):
            yield AgentResponse(content=f"You pressed {keys[-1].buttons}.")
            return
        for i in range(200):  # a long story, a word every 50 ms
            await asyncio.sleep(0.05)
            yield AgentResponse(content=f"word{i} ")


async def keys(system: VoiceAgentSystem, call_request: CallRequest) -> None:
    node = Keys(float(call_request.options.get("debounce_s", 1.0)))
    bridge = Bridge(node)
    system.with_speaking_node(node, bridge=bridge)
    bridge.on(UserTranscriptionReceived).map(node.add_event)
    bridge.on(DTMFInputEvent).map(node.on_key).broadcast()
    bridge.on(KeysDone).map(node.add_event)
    bridge.on(KeysDone).interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate).stream(
        node.generate
    ).broadcast()
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate)
        .interrupt_on(DTMFInputEvent, handler=node.on_interrupt_generate)
        .stream(node.generate)
        .broadcast()
    )
    await system.start()
    await system.wait_for_shutdown()
