"""Agents the integration tests run inside real reasoning processes.

``by_option`` is what the test cluster runs: it builds whichever agent the session start names
(``options["agent"]``), so one pair of processes serves every test. ``probe`` reports what happens
inside the process (turn starts, cancellations, how much backlog it had handled) to Redis, where the
test, in another process, reads it.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio as aioredis

from bargein import (
    AgentResponse,
    Bridge,
    ConversationContext,
    CustomReceived,
    DTMFInputEvent,
    Event,
    Message,
    ReasoningNode,
    SessionInfo,
    TransferCall,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.llm import ScriptedLLM
from bargein.hosting.loader import load_agent

_redis: aioredis.Redis | None = None


def notes_key(session: str) -> str:
    return f"bargein-test:{{{session}}}:notes"


async def note(session: str, text: str) -> None:
    global _redis
    if _redis is None:
        _redis = aioredis.Redis.from_url(os.environ.get("BARGEIN_REDIS_URL", "redis://localhost:6379/0"))
    await _redis.rpush(notes_key(session), f"{text}|pid={os.getpid()}")
    await _redis.expire(notes_key(session), 3600)


async def by_option(session: SessionInfo) -> Any:
    agent = load_agent(session.options.get("agent", "tests.integration.agents:probe"))
    result = agent(session)
    if inspect.isawaitable(result):
        result = await result
    rate = session.options.get("tokens_per_s")
    if rate:
        for bridge in result if isinstance(result, list) else [result]:
            if isinstance(bridge.node, ReasoningNode):
                bridge.node.llm_client = ScriptedLLM(first_token_delay=0.005, tokens_per_second=float(rate))
    return result


class ProbeNode(ReasoningNode):
    """Echoes every user transcript so far, word by word, reporting to Redis as it goes."""

    def __init__(self, session: SessionInfo) -> None:
        super().__init__()
        self.session_id = session.session_id
        self._options = dict(session.options)
        self.custom_seen = 0

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        await note(self.session_id, f"start:{len(self.conversation_events)}")
        words = " ".join(
            ev.content for ev in context.events if isinstance(ev, UserTranscriptionReceived)
        ).split()
        if self._options.get("echo") == "no":  # only its own words: the same answer whatever was heard
            words = []
        words += [f"tail{i}" for i in range(int(self._options.get("tail", 0)))]
        words += str(self._options.get("say", "")).split()  # words of its own (to be spoken, say)
        delay = float(self._options.get("word_delay", 0.02))
        try:
            for i, word in enumerate(words):
                await asyncio.sleep(delay)
                yield AgentResponse(content=word + (" " if i < len(words) - 1 else ""))
        except asyncio.CancelledError:
            await note(self.session_id, f"cancelled:custom_seen={self.custom_seen}")
            raise
        await note(self.session_id, "completed")

    async def count_custom(self, message: Message) -> None:
        await asyncio.sleep(float(self._options.get("custom_delay", 0.0)))
        self.custom_seen += 1


def probe(session: SessionInfo) -> Bridge:
    node = ProbeNode(session)
    bridge = Bridge(node)
    bridge.on(UserTranscriptionReceived).map(node.add_event)
    bridge.on(CustomReceived).map(node.count_custom)
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate)
        .stream(node.generate)
        .broadcast()
    )
    return bridge


class KeypadNode(ReasoningNode):
    """Says which keys the caller has pressed so far (a phone call's DTMF, as the agent gets it)."""

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        keys = "".join(e.button for e in context.events if isinstance(e, DTMFInputEvent))
        yield AgentResponse(content=f"You pressed {keys}.")


def keypad(session: SessionInfo) -> Bridge:
    node = KeypadNode()
    bridge = Bridge(node)
    bridge.on(DTMFInputEvent).map(node.add_event)
    bridge.on(DTMFInputEvent).stream(node.generate).broadcast()
    return bridge


OPERATOR = "+15550001111"


class OperatorNode(ReasoningNode):
    """Any key puts the caller through to the operator (the agent's ``TransferCall``)."""

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        yield AgentResponse(content="Putting you through.")
        yield TransferCall(target_phone_number=OPERATOR)


def operator(session: SessionInfo) -> Bridge:
    node = OperatorNode()
    bridge = Bridge(node)
    bridge.on(DTMFInputEvent).stream(node.generate).broadcast()
    return bridge
