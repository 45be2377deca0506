"""Small agents and drivers the SDK tests share."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bargein import AgentResponse, Event, ReasoningNode, UserStoppedSpeaking, UserTranscriptionReceived
from bargein.testing import LocalSession


async def ask(session: LocalSession, text: str = "hello") -> None:
    """The caller says ``text`` and stops: the usual trigger for a turn."""
    await session.emit(UserTranscriptionReceived(content=text))
    await session.emit(UserStoppedSpeaking())


async def take_chunks(session: LocalSession, n: int, timeout: float = 10.0) -> list[str]:
    """Read ``n`` AgentResponse chunks (what the caller has 'heard')."""
    texts: list[str] = []
    while len(texts) < n:
        event: Event = await session.next(timeout=timeout)
        assert isinstance(event, AgentResponse), f"expected a chunk, got {event!r}"
        texts.append(event.content)
    return texts


def reply_text(events: list[Event]) -> str:
    return "".join(e.content for e in events if isinstance(e, AgentResponse))


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``predicate`` until it holds: for state changed by other tasks that signal nothing."""
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - there is no event to wait on
            await asyncio.sleep(0.005)


def history(session: LocalSession) -> list[tuple[str, str]]:
    """The session's (first) reasoning node's history as (role, content) pairs."""
    node = session.nodes[0]
    assert isinstance(node, ReasoningNode)
    return [(m["role"], m["content"]) for m in node.history_messages()]


async def seen_half_done(done: Callable[[], int | None], total: int, timeout: float = 10.0) -> None:
    """Wait until another task finds a walk over ``total`` items half done: ``done()`` (how many
    the walk has done, None while none is under way) strictly between 0 and ``total``, which a
    walk made in one step of the event loop never shows. It looks at every pass of the loop."""
    seen: set[int] = set()

    async def look() -> None:
        while True:
            n = done()
            if n is not None:
                seen.add(n)
            await asyncio.sleep(0)

    looking = asyncio.create_task(look())
    try:
        await wait_for(lambda: any(0 < n < total for n in seen), timeout=timeout)
    finally:
        looking.cancel()
