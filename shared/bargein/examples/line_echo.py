"""An echo agent in Cartesia Line 0.1's style, importing only from ``bargein.line``.

It is what a Line 0.1 echo agent looks like after the migration (``line`` -> ``bargein.line``): the
node keeps the conversation with ``add_event`` and answers with what the caller said last, found with
``ConversationContext.get_latest_user_transcript_message()``. ``sleep_ms`` in the session options
delays each answer, so there is time to barge in.

Run it with ``BARGEIN_AGENT=bargein.examples.line_echo:handle_new_call`` (or ``:app``).
"""

from __future__ import annotations

import asyncio
import logging
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

logger = logging.getLogger("agent.line_echo")


class EchoNode(ReasoningNode):
    """Repeats the caller's latest words back to them."""

    def __init__(self, node_id: str, sleep_ms: int = 0) -> None:
        super().__init__(system_prompt="You repeat back what the caller says.", node_id=node_id)
        self.sleep_ms = sleep_ms

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        if self.sleep_ms:
            await asyncio.sleep(self.sleep_ms / 1000)
        heard = context.get_latest_user_transcript_message()
        logger.info("echoing %r", heard)
        yield AgentResponse(content=f"You said: {heard}")


async def handle_new_call(system: VoiceAgentSystem, call_request: CallRequest) -> None:
    logger.info("echo call %s", call_request.call_id)
    node = EchoNode(node_id="echo", sleep_ms=int(call_request.options.get("sleep_ms", 0)))
    bridge = Bridge(node)
    system.with_speaking_node(node, bridge)

    bridge.on(UserTranscriptionReceived).map(node.add_event)
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate)
        .stream(node.generate)
        .broadcast()
    )

    await system.start()
    await system.wait_for_shutdown()


app = VoiceAgentApp(handle_new_call)

if __name__ == "__main__":
    app.run()
