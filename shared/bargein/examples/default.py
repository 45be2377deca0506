"""The default agent: a conversational node that records what the caller says, answers with the
configured LLM (scripted unless ``BARGEIN_LLM_BASE_URL`` is set), stops the moment the caller talks
over it, on an emergency stop, or on a hand-off, and picks its answer up again where it was cut off
when the barge-in turns out to have been only a cough (``FalseInterruption``)."""

from __future__ import annotations

import logging

from bargein import (
    AgentHandoff,
    Bridge,
    EmergencyStop,
    Event,
    FalseInterruption,
    Message,
    ReasoningNode,
    SessionInfo,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)

logger = logging.getLogger("agent")

SYSTEM_PROMPT = (
    "You are a friendly voice assistant. Answer in two or three short spoken sentences, without lists "
    "or markup. If you are interrupted, do not repeat what you already said."
)


class ConversationNode(ReasoningNode):
    def on_interrupt_generate(self, message: Message) -> None:
        heard = self.conversation_events[-1] if self.conversation_events else None
        logger.info(
            "interrupted by %s; the caller heard %r",
            type(message.event).__name__,
            getattr(heard, "content", ""),
        )


def agent(session: SessionInfo) -> Bridge:
    node = ConversationNode(system_prompt=session.options.get("system_prompt", SYSTEM_PROMPT))
    bridge = Bridge(node)
    bridge.on(UserTranscriptionReceived).map(node.add_event)
    interrupts: list[type[Event]] = [UserStartedSpeaking, EmergencyStop, AgentHandoff]
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(interrupts, handler=node.on_interrupt_generate)
        .stream(node.generate)
        .broadcast()
    )
    bridge.on(FalseInterruption).interrupt_on(interrupts).stream(node.resume).broadcast()
    return bridge
