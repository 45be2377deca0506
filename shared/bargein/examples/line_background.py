"""A speaking node with a background node, in Cartesia Line 0.1's style, importing only from
``bargein.line``.

The background ``TaggerNode`` hears every caller turn and broadcasts a ``TopicTagged`` event; that
broadcast never reaches the caller (only the speaking node's output does), but the speaking node's
bridge hears it, records it in the conversation with ``add_event`` and answers from it. This is
Line's multi-node pattern (``with_speaking_node`` plus ``with_node``), here running in whichever
process owns the session.

One change a Line agent needs beyond its imports is visible here: a custom event subclasses
``Event`` (Line used a plain pydantic ``BaseModel``), because events travel between processes by
class name.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator

from bargein.line import (
    Bridge,
    CallRequest,
    ConversationContext,
    ReasoningNode,
    VoiceAgentApp,
    VoiceAgentSystem,
)
from bargein.line.events import (
    AgentResponse,
    Event,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)

logger = logging.getLogger("agent.line_background")

TOPICS: dict[str, tuple[str, ...]] = {
    "weather": ("weather", "rain", "sunny", "forecast", "snow"),
    "food": ("food", "eat", "pizza", "dinner", "hungry"),
    "travel": ("travel", "trip", "flight", "holiday", "train"),
}


class TopicTagged(Event):
    """The background node's verdict on one caller turn."""

    topic: str
    words: int
    utterance: str


def tag(text: str) -> str:
    words = set(re.findall(r"[a-z]+", text.lower()))
    return next((topic for topic, keys in TOPICS.items() if words & set(keys)), "something else")


class TaggerNode(ReasoningNode):
    """Background reasoning: tags what the caller said with a topic. It never speaks."""

    def __init__(self) -> None:
        super().__init__(system_prompt="You tag caller turns with a topic.", node_id="tagger")

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        said = context.get_latest_user_transcript_message() or ""
        yield TopicTagged(topic=tag(said), words=len(said.split()), utterance=said)


class ChatNode(ReasoningNode):
    """The speaking node: answers each turn once the tagger's verdict for it has arrived."""

    def __init__(self, word_delay: float = 0.0) -> None:
        super().__init__(system_prompt="You chat about what the caller brings up.", node_id="chat")
        self.word_delay = word_delay

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        tags = [event for event in context.events if isinstance(event, TopicTagged)]
        covered = list(dict.fromkeys(t.topic for t in tags))
        words = f"Sounds like {tags[-1].topic}. So far: {', '.join(covered)}.".split(" ")
        for i, word in enumerate(words):
            await asyncio.sleep(self.word_delay)
            yield AgentResponse(content=word if i == len(words) - 1 else word + " ")


async def handle_new_call(system: VoiceAgentSystem, call_request: CallRequest) -> None:
    chat = ChatNode(word_delay=float(call_request.options.get("word_delay", 0.0)))
    chat_bridge = Bridge(chat)
    system.with_speaking_node(chat, chat_bridge)

    tagger = TaggerNode()
    tagger_bridge = Bridge(tagger)
    system.with_node(tagger, tagger_bridge)

    # the background node reasons over every caller turn
    tagger_bridge.on(UserTranscriptionReceived).map(tagger.add_event)
    tagger_bridge.on(UserStoppedSpeaking).stream(tagger.generate).broadcast()

    # the speaking node hears the caller and the tagger, and answers once a turn is tagged
    chat_bridge.on(UserTranscriptionReceived).map(chat.add_event)
    chat_bridge.on(TopicTagged).map(chat.add_event)
    (
        chat_bridge.on(TopicTagged)
        .interrupt_on(UserStartedSpeaking, handler=chat.on_interrupt_generate)
        .stream(chat.generate)
        .broadcast()
    )

    await system.start()
    await system.wait_for_shutdown()


app = VoiceAgentApp(handle_new_call)

if __name__ == "__main__":
    app.run()
