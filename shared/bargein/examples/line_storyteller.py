"""A storyteller in Cartesia Line 0.1's style that stops on speech or on a keypad button, importing
only from ``bargein.line``.

One route, two ``interrupt_on`` calls (the form Line's DTMF example used): the story is cut off when
the caller starts talking, and when they press the stop button (``#``), but not when they press a
choice button (``1`` or ``2``), which another route records instead (a property filter with a
predicate). The story comes from the node's language model: scripted unless
``BARGEIN_LLM_BASE_URL`` points at an OpenAI-compatible server.

In Line 0.1 the second ``interrupt_on`` was unreliable and a cut-off story stayed in the history as
if it had been told; here both interrupts cancel at once and the history keeps only what was heard.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from bargein.line import (
    Bridge,
    CallRequest,
    ConversationContext,
    Message,
    ReasoningNode,
    VoiceAgentApp,
    VoiceAgentSystem,
)
from bargein.line.events import (
    AgentResponse,
    DTMFInputEvent,
    Event,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)

logger = logging.getLogger("agent.line_storyteller")

STOP_BUTTON = "#"
CHOICE_BUTTONS = ("1", "2")
GREETING = "Tell me what the story should be about. Press pound to stop, one or two to choose."
SYSTEM_PROMPT = (
    "You are a storyteller on the phone. Tell short spoken stories, two or three sentences at a time, "
    "and offer the caller two choices for what happens next: press one or press two."
)


def is_stop_button(message: Message) -> bool:
    """The DTMF interrupt's filter: only the stop button cuts the story off."""
    return isinstance(message.event, DTMFInputEvent) and message.event.button == STOP_BUTTON


class StoryNode(ReasoningNode):
    """Tells the story with the configured model and remembers how it was interrupted."""

    def __init__(self) -> None:
        super().__init__(system_prompt=SYSTEM_PROMPT, node_id="storyteller")
        self.choices: list[str] = []
        self.interruptions: list[str] = []

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        logger.info("story turn after %r", context.get_latest_user_transcript_message())
        async for text in self.generate_response(context):
            yield AgentResponse(content=text)

    def choose(self, message: Message) -> None:
        """A choice button: remembered, and told to the model as the caller's words."""
        assert isinstance(message.event, DTMFInputEvent)
        self.choices.append(message.event.button)
        self.add_event(UserTranscriptionReceived(content=f"(pressed {message.event.button})"))

    def on_interrupt_generate(self, message: Message) -> None:
        event = message.event
        cause = f"button {event.button}" if isinstance(event, DTMFInputEvent) else type(event).__name__
        self.interruptions.append(cause)
        heard = self.conversation_events[-1] if self.conversation_events else None
        logger.info("story stopped by %s; the caller heard %r", cause, getattr(heard, "content", ""))


async def handle_new_call(system: VoiceAgentSystem, call_request: CallRequest) -> None:
    node = StoryNode()
    bridge = Bridge(node)
    system.with_speaking_node(node, bridge)

    bridge.on(UserTranscriptionReceived).map(node.add_event)
    bridge.on(DTMFInputEvent, button=lambda button: button in CHOICE_BUTTONS).map(node.choose)
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate)
        .interrupt_on(DTMFInputEvent, handler=node.on_interrupt_generate, filter_fn=is_stop_button)
        .stream(node.generate)
        .broadcast()
    )

    await system.start()
    await system.send_initial_message(GREETING)
    await system.wait_for_shutdown()


app = VoiceAgentApp(handle_new_call)

if __name__ == "__main__":
    app.run()
