"""The agent the Line integration tests' reasoning process runs: a Line-style dispatcher.

``tests.integration.agents:by_option`` cannot start a Line-style agent: it calls ``agent(session)``,
and the runtime recognises a Line-style ``handle_new_call(system, call_request)`` by the signature of
the configured agent, which is ``by_option``'s one parameter. This dispatcher has the two-parameter
signature, so the runtime hands it the ``VoiceAgentSystem`` and ``CallRequest``, and it passes both on
to the ``handle_new_call`` (or ``VoiceAgentApp``) that ``options["agent"]`` names.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from pydantic import BaseModel

from bargein.hosting.loader import load_agent
from bargein.line import Bridge, CallRequest, ConversationContext, Node, ReasoningNode, VoiceAgentSystem
from bargein.line.events import AgentResponse, UserStoppedSpeaking, UserTranscriptionReceived
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
