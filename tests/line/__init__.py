"""Tests of ``bargein.line``, the Cartesia Line 0.1 compatibility layer, on the in-process runtime.

Every test imports the agent API from ``bargein.line`` (as a migrated agent would); bargein's own
modules are imported only to check identity or to drive the session. The helpers below are shared.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from bargein.line import CallRequest, ConversationContext, ReasoningNode, VoiceAgentSystem
from bargein.line.events import AgentResponse, Event, UserStoppedSpeaking, UserTranscriptionReceived
from bargein.testing import LocalSession


async def ask(session: LocalSession, text: str) -> None:
    """The caller says ``text`` and stops talking: the usual trigger for a turn."""
    await session.emit(UserTranscriptionReceived(content=text))
    await session.emit(UserStoppedSpeaking())


def text_of(events: list[Event]) -> str:
    return "".join(e.content for e in events if isinstance(e, AgentResponse))


async def chunks(session: LocalSession, n: int, timeout: float = 10.0) -> str:
    """Read ``n`` AgentResponse chunks (what the caller has heard) and return their text."""
    out = ""
    for _ in range(n):
        event = await session.next(timeout=timeout)
        assert isinstance(event, AgentResponse), f"expected a chunk, got {event!r}"
        out += event.content
    return out


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``predicate`` until it holds: for state other tasks change without signalling."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - there is no event to wait on
            await asyncio.sleep(0.005)


class Speaker(ReasoningNode):
    """Says ``words`` one chunk at a time, ``delay`` seconds apart (slow enough to interrupt)."""

    def __init__(
        self, words: str = "one two three four five six seven eight", delay: float = 0.02, **kw: Any
    ) -> None:
        super().__init__(system_prompt="", **kw)
        self.words = words.split()
        self.delay = delay
        self.started = 0
        self.cancelled = 0

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        self.started += 1
        try:
            for i, word in enumerate(self.words):
                await asyncio.sleep(self.delay)
                yield AgentResponse(content=word + (" " if i < len(self.words) - 1 else ""))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


LineAgent = Callable[[VoiceAgentSystem, CallRequest], Awaitable[None]]


def line_agent(build: Callable[[VoiceAgentSystem], object]) -> LineAgent:
    """A Line-style ``handle_new_call`` that lets ``build`` register nodes and routes, then starts
    and waits for the end of the call, as Line's examples do."""

    async def handle_new_call(system: VoiceAgentSystem, call_request: CallRequest) -> None:
        build(system)
        await system.start()
        await system.wait_for_shutdown()

    return handle_new_call
