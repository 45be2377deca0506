"""``bargein demo``: a whole conversation with a barge-in, in one process.

The caller asks a question, the agent streams its answer, the caller talks over it halfway, the
turn is cancelled and the interrupt handler runs, then the caller asks something else and the
agent answers in full. Finally the history the model will see next is printed: the interrupted
answer is cut to exactly what the caller received.

It runs the real session runtime on the in-process transport, so it needs nothing else installed.
"""

from __future__ import annotations

import asyncio
import logging
import time

from bargein.agent.events import (
    AgentError,
    AgentGenerationComplete,
    AgentResponse,
    Event,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.nodes import ReasoningNode
from bargein.hosting.loader import load_agent
from bargein.settings import CoreSettings, LLMSettings, load
from bargein.testing import LocalSession
from bargein.tools.timeline import Timeline, TimelineLogHandler

FIRST_QUESTION = "What's the weather going to be like this weekend?"
SECOND_QUESTION = "Sorry, actually, could you tell me a short story instead?"
CHUNKS_BEFORE_BARGE_IN = 8


async def _say(session: LocalSession, tl: Timeline, text: str, *, barge_in: bool = False) -> None:
    started = time.monotonic()
    interrupted_before = len(session.interrupted_turns)
    await session.emit(UserStartedSpeaking())
    tl.line("user", "▸ starts speaking" + (" over the agent (barge-in)" if barge_in else ""))
    if len(session.interrupted_turns) > interrupted_before:
        ms = (time.monotonic() - started) * 1000
        dropped = session.fence.dropped["interrupted_turn"]
        tl.line(
            "edge",
            f"✂ turn {session.interrupted_turns[-1]} cut off {ms:.1f} ms after the barge-in; "
            f"{dropped} queued chunk(s) of it dropped, none will reach the caller",
        )
    await asyncio.sleep(0.4)  # the caller talking
    await session.emit(UserTranscriptionReceived(content=text))
    tl.line("user", f'"{text}"')
    await session.emit(UserStoppedSpeaking())
    tl.line("user", "▸ stops speaking")


async def _stream_until(session: LocalSession, tl: Timeline, max_chunks: int | None) -> Event | None:
    chunks = 0
    while max_chunks is None or chunks < max_chunks:
        event = await session.next(timeout=30)
        if isinstance(event, AgentResponse):
            tl.stream(event.content)
            chunks += 1
        elif isinstance(event, AgentGenerationComplete):
            tl.line("agent", "▪ turn complete")
            return event
        elif isinstance(event, AgentError):
            tl.line("agent", f"✗ the turn failed: {event.message}")
            return event
    return None


async def run_demo(agent_spec: str | None = None) -> int:
    settings = load(CoreSettings)
    load(LLMSettings)  # a bad LLM setting fails here, at start-up, not in the middle of a turn
    spec = agent_spec or settings.agent
    agent = load_agent(spec)
    tl = Timeline()
    handler = TimelineLogHandler(tl)
    for name in ("agent", "bargein.runtime"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False

    async with LocalSession(agent, session_id="demo") as session:
        tl.line("system", f"session {session.session_id} on the in-process runtime, agent {spec}")
        await _say(session, tl, FIRST_QUESTION)
        await _stream_until(session, tl, CHUNKS_BEFORE_BARGE_IN)
        await _say(session, tl, SECOND_QUESTION, barge_in=True)
        await _stream_until(session, tl, None)
        await session.quiet(0.05)

        tl.line("system", "the history the model sees on the next turn:")
        for node in session.nodes:
            if isinstance(node, ReasoningNode):
                for msg in node.history_messages():
                    tl.line("", f"  {msg['role']:>9}: {msg['content']}")
        counters = dict(session.runtime.counters)
        tl.line("system", f"runtime counters: {counters}")
    return 0


def main(agent_spec: str | None = None) -> int:
    return asyncio.run(run_demo(agent_spec))
