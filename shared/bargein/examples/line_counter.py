"""A turn counter in Cartesia Line 0.1's style: it greets the caller, counts their turns, and after
the last one says goodbye and ends the call, importing only from ``bargein.line``.

It shows three pieces of Line's call wiring on bargein: ``send_initial_message`` (said once per
session, even if another process adopts the session and runs ``handle_new_call`` again), node state
that outlives a change of owner (``turns`` is plain data, so it is checkpointed), and ending the call
with ``EndCall`` through ``line.tools.system_tools.end_call``, which the client edge acts on only after
the goodbye's chunks. ``turns`` in the session options sets how many turns (default 3).
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
from bargein.line.tools.system_tools import EndCallArgs, end_call

logger = logging.getLogger("agent.line_counter")

DEFAULT_TURNS = 3


def greeting(limit: int) -> str:
    return f"Hi! I count your turns and hang up after {limit} of them."


class CounterNode(ReasoningNode):
    """Answers each turn with its number; ends the call after ``limit`` turns."""

    def __init__(self, limit: int, word_delay: float = 0.0) -> None:
        super().__init__(system_prompt="You count the caller's turns.", node_id="counter")
        self.limit = limit
        self.word_delay = word_delay
        self.turns = 0

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        self.turns += 1
        logger.info("turn %d of %d: %r", self.turns, self.limit, context.get_latest_user_transcript_message())
        words = f"That was turn {self.turns}.".split(" ")
        for i, word in enumerate(words):
            await asyncio.sleep(self.word_delay)
            yield AgentResponse(content=word if i == len(words) - 1 else word + " ")
        if self.turns >= self.limit:
            async for item in end_call(EndCallArgs(goodbye_message=" Goodbye!")):
                yield item


async def handle_new_call(system: VoiceAgentSystem, call_request: CallRequest) -> None:
    limit = int(call_request.options.get("turns", DEFAULT_TURNS))
    node = CounterNode(limit, word_delay=float(call_request.options.get("word_delay", 0.0)))
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
    await system.send_initial_message(greeting(limit))
    await system.wait_for_shutdown()


app = VoiceAgentApp(handle_new_call)

if __name__ == "__main__":
    app.run()
