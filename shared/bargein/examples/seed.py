"""Every example of ``interruption-handling.txt`` (the product's API spec), as runnable agents.

The classes and route expressions below are the seed's text unchanged; only imports and the free
names the seed leaves to the reader (``logger``, ``cleanup_resources``, ``messages``,
``generation_start_time``, ``MIN_SPEAK_TIME``) are supplied, and each agent function builds the
``node`` and ``bridge`` the seed's routes refer to. Run one with, for example,
``BARGEIN_AGENT=bargein.examples.seed:stateful``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from bargein import (
    AgentHandoff,
    AgentResponse,
    Bridge,
    EmergencyStop,
    Message,
    ReasoningNode,
    SessionInfo,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
    messages,
)

logger = logging.getLogger("agent.seed")

MIN_SPEAK_TIME = 1.0  # seconds the agent must have been generating before a barge-in counts
generation_start_time = 0.0  # set when a generation starts (see _track_generation_start)
cleanups = 0  # how many times cleanup_resources ran (the tests read it)


async def cleanup_resources() -> None:
    global cleanups
    await asyncio.sleep(0)  # stands in for closing sockets, cancelling API calls...
    cleanups += 1


def _track_generation_start(message: Message) -> None:
    global generation_start_time
    generation_start_time = time.time()


def _with_history(node: ReasoningNode) -> Bridge:
    """A bridge whose node records what the caller says; the seed's routes are added to it."""
    bridge = Bridge(node)
    bridge.on(UserTranscriptionReceived).map(node.add_event)
    return bridge


# --- Basic interruption setup ---------------------------------------------------------------------


def basic(session: SessionInfo) -> Bridge:
    node = ReasoningNode()
    bridge = _with_history(node)
    # fmt: off
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(UserStartedSpeaking)
        .stream(node.generate)
        .broadcast()
    )
    # fmt: on
    return bridge


# --- With custom interrupt handler ----------------------------------------------------------------


async def handle_interrupt(message: Any) -> None:
    logger.info("User interrupted, stopping generation")
    # Perform any needed cleanup
    await cleanup_resources()


def custom_handler(session: SessionInfo) -> Bridge:
    node = ReasoningNode()
    bridge = _with_history(node)
    # fmt: off
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(UserStartedSpeaking, handler=handle_interrupt)
        .stream(node.generate)
        .broadcast()
    )
    # fmt: on
    return bridge


# --- InterruptAwareNode, connected with node.on_interrupt_generate --------------------------------


class InterruptAwareNode(ReasoningNode):
    def on_interrupt_generate(self, message):
        """Called when generation is interrupted."""
        logger.info("Generation interrupted by user")
        # Cleanup streaming resources, cancel API calls, etc.

    async def process_context(self, context):
        try:
            # Stream response chunks
            async for chunk in self.llm_client.generate_stream(messages):
                yield AgentResponse(content=chunk.text)
        except asyncio.CancelledError:
            # Handle cancellation gracefully
            logger.info("Generation cancelled due to user interruption")
            # Perform any final cleanup
            raise  # Re-raise to complete cancellation


def interrupt_aware(session: SessionInfo) -> Bridge:
    node = InterruptAwareNode()
    bridge = _with_history(node)
    # fmt: off
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(
            UserStartedSpeaking, handler=node.on_interrupt_generate
        )
        .stream(node.generate)
        .broadcast()
    )
    # fmt: on
    return bridge


# --- Only allow interruption after agent has spoken for a minimum time ---------------------------


def can_interrupt(message):
    return time.time() - generation_start_time > MIN_SPEAK_TIME


def condition(session: SessionInfo) -> Bridge:
    node = ReasoningNode()
    bridge = _with_history(node)
    bridge.on(UserStoppedSpeaking).map(_track_generation_start)
    # fmt: off
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(UserStartedSpeaking, condition=can_interrupt)
        .stream(node.generate)
        .broadcast()
    )
    # fmt: on
    return bridge


# --- Interrupt on multiple event types ------------------------------------------------------------


def multiple_events(session: SessionInfo) -> Bridge:
    node = ReasoningNode()
    bridge = _with_history(node)
    # fmt: off
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on([UserStartedSpeaking, EmergencyStop, AgentHandoff])
        .stream(node.generate)
        .broadcast()
    )
    # fmt: on
    return bridge


# --- StatefulInterruptNode ------------------------------------------------------------------------


class StatefulInterruptNode(ReasoningNode):
    def __init__(self):
        super().__init__()
        self.generation_state = None

    def on_interrupt_generate(self, message):
        # Save state for potential recovery
        self.generation_state = {
            "interrupted_at": time.time(),
            "partial_response": self.current_response,
            "context_snapshot": self.context.copy(),
        }
        logger.info("Saved generation state for recovery")

    async def process_context(self, context):
        try:
            # Check if resuming from interruption
            if self.generation_state:
                logger.info("Resuming from previous interruption")
                # Potentially use saved state
                self.generation_state = None
            # Normal generation flow
            async for chunk in self.generate_response(context):
                yield AgentResponse(content=chunk)
        except asyncio.CancelledError:
            logger.info("Generation cancelled")
            raise


def stateful(session: SessionInfo) -> Bridge:
    node = StatefulInterruptNode()
    bridge = _with_history(node)
    # fmt: off
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(
            UserStartedSpeaking, handler=node.on_interrupt_generate
        )
        .stream(node.generate)
        .broadcast()
    )
    # fmt: on
    return bridge
