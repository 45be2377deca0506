"""Every form of the seed (interruption-handling.txt) runs as written, in process.

Each test drives one of the runnable seed agents in ``bargein.examples.seed`` through a
turn, a barge-in and the next turn, and asserts what Line 0.1 documented but did not do: async
handlers are awaited, ``condition=`` is honoured both ways, lists interrupt on each of their
events, and nothing of a cancelled turn reaches the caller.
"""

from __future__ import annotations

import logging

import pytest

from bargein import (
    AgentGenerationComplete,
    AgentHandoff,
    AgentResponse,
    ConversationContext,
    EmergencyStop,
    Event,
    UserStartedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.llm import ScriptedLLM
from bargein.examples import seed
from bargein.testing import LocalSession

from .helpers import ask, reply_text, take_chunks

pytestmark = pytest.mark.usefixtures("scripted_llm_env")


async def _interrupt_after(session: LocalSession, chunks: int, event: Event | None = None) -> str:
    """Ask, hear ``chunks`` chunks, barge in; return the text heard."""
    await ask(session, "tell me something")
    heard = "".join(await take_chunks(session, chunks))
    await session.emit(event or UserStartedSpeaking())
    return heard


async def _assert_interrupted_cleanly(session: LocalSession, turn: int = 1) -> None:
    assert session.interrupted_turns == [turn]
    leaked = await session.quiet(0.3)
    assert leaked == [], f"chunks of the interrupted turn reached the caller: {leaked}"


async def test_basic_form_cancels_and_next_turn_runs() -> None:
    async with LocalSession(seed.basic) as s:
        heard = await _interrupt_after(s, 2)
        await _assert_interrupted_cleanly(s)
        await ask(s, "go on")
        events = await s.collect_turn()
        assert isinstance(events[-1], AgentGenerationComplete)
        assert len(reply_text(events).split()) >= 20  # the next turn is whole
        node = s.nodes[0]
        assistant = [e for e in node.conversation_events if isinstance(e, AgentResponse)]
        assert assistant[0].content == heard  # the cut-off answer is exactly what was heard


async def test_async_custom_handler_is_awaited_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent.seed")
    before = seed.cleanups
    async with LocalSession(seed.custom_handler) as s:
        await _interrupt_after(s, 2)
        await _assert_interrupted_cleanly(s)
        assert seed.cleanups == before + 1  # the async handler ran to its end (awaited cleanup)
        assert "User interrupted, stopping generation" in caplog.messages


async def test_interrupt_aware_node_sees_cancelled_error_then_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="agent.seed")
    seen_messages: list[list[dict[str, str]]] = []

    def reply(messages: object) -> str:
        seen_messages.append([dict(m) for m in messages])  # type: ignore[attr-defined]
        return " ".join(f"word{i}" for i in range(40))

    async with LocalSession(seed.interrupt_aware) as s:
        s.nodes[0].llm_client = ScriptedLLM(reply, first_token_delay=0.005, tokens_per_second=100)  # type: ignore[attr-defined]
        await _interrupt_after(s, 2)
        await _assert_interrupted_cleanly(s)
    logs = caplog.messages
    cancelled = logs.index("Generation cancelled due to user interruption")
    handled = logs.index("Generation interrupted by user")
    assert cancelled < handled, "the handler must run after the generator has seen CancelledError"
    # the seed's free name `messages` resolved to the running generation's context
    assert {"role": "user", "content": "tell me something"} in seen_messages[0]


@pytest.mark.parametrize("min_speak_time, interrupts", [(0.0, True), (60.0, False)])
async def test_condition_is_honoured(
    monkeypatch: pytest.MonkeyPatch, min_speak_time: float, interrupts: bool
) -> None:
    monkeypatch.setattr(seed, "MIN_SPEAK_TIME", min_speak_time)
    async with LocalSession(seed.condition) as s:
        await _interrupt_after(s, 2)
        if interrupts:
            await _assert_interrupted_cleanly(s)
        else:
            events = await s.collect_turn()  # the turn goes on to the end
            assert isinstance(events[-1], AgentGenerationComplete)
            assert s.interrupted_turns == []
            assert s.runtime.counters["interrupts_declined"] == 1


@pytest.mark.parametrize(
    "interrupt", [UserStartedSpeaking(), EmergencyStop(), AgentHandoff(target_agent="billing", reason="x")]
)
async def test_list_of_events_interrupts_on_each(interrupt: Event) -> None:
    async with LocalSession(seed.multiple_events) as s:
        await _interrupt_after(s, 2, interrupt)
        await _assert_interrupted_cleanly(s)


async def test_event_not_in_list_does_not_interrupt() -> None:
    async with LocalSession(seed.multiple_events) as s:
        await _interrupt_after(s, 2, UserTranscriptionReceived(content="uh-huh"))
        events = await s.collect_turn()
        assert isinstance(events[-1], AgentGenerationComplete)
        assert s.interrupted_turns == []


async def test_stateful_node_saved_state_is_seen_by_next_turn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agent.seed")
    async with LocalSession(seed.stateful) as s:
        await _interrupt_after(s, 3)
        await _assert_interrupted_cleanly(s)
        node = s.nodes[0]
        state = node.generation_state  # type: ignore[attr-defined]
        assert state is not None
        assert state["partial_response"] and len(state["partial_response"].split()) >= 3
        assert isinstance(state["context_snapshot"], ConversationContext)
        assert state["context_snapshot"].get_latest_user_transcript_message() == "tell me something"
        await ask(s, "again")
        await s.collect_turn()
        assert "Resuming from previous interruption" in caplog.messages
        assert node.generation_state is None  # type: ignore[attr-defined]


async def test_stateful_node_state_survives_a_new_owner(caplog: pytest.LogCaptureFixture) -> None:
    """The handler's saved state is checkpointed; a fresh node in a new owner picks it up."""
    caplog.set_level(logging.INFO, logger="agent.seed")
    async with LocalSession(seed.stateful) as s:
        await _interrupt_after(s, 3)
        await _assert_interrupted_cleanly(s)
        first = s.nodes[0]
        partial = first.generation_state["partial_response"]  # type: ignore[attr-defined]
        await s.restart()
        second = s.nodes[0]
        assert second is not first
        restored = second.generation_state  # type: ignore[attr-defined]
        assert restored["partial_response"] == partial
        assert isinstance(restored["context_snapshot"], ConversationContext)
        caplog.clear()
        await ask(s, "again")
        events = await s.collect_turn()
        assert "Resuming from previous interruption" in caplog.messages
        assert second.generation_state is None  # type: ignore[attr-defined]
        # the new owner continues the turn numbering rather than reusing turn 1
        assert s.received[-1][0].turn == 2
        assert isinstance(events[-1], AgentGenerationComplete)
