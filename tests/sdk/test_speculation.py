"""Speculative turns in the runtime: started on the caller's words so far (``SpeculativeTurn``),
held until the caller's turn ends with the same words, dropped without trace otherwise."""

from __future__ import annotations

import asyncio

import pytest

from bargein import (
    AgentGenerationComplete,
    AgentResponse,
    AgentSpeechSent,
    Bridge,
    FalseInterruption,
    ReasoningNode,
    SessionInfo,
    SpeechDelivered,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.events import SpeculationDropped, SpeculativeTurn, TurnInterrupted
from bargein.agent.llm import ScriptedLLM
from bargein.testing import LocalSession
from bargein.transport.memory import MemoryTransport
from bargein.wire.envelope import Envelope, Source
from bargein.wire.names import IN, TIER_REASONING, Direction

from ..agents import interruptible_agent
from .helpers import ask, history, reply_text, take_chunks, wait_for
from .test_interrupts import WORDS, recorder_agent

REPLY = WORDS  # what Recorder's model says, every turn


def session(log: list[str]) -> LocalSession:
    """A session whose node logs its generations: started, cancelled (the LLM request given up:
    "unwound"), done ("completed"), and its interrupt handler."""
    return LocalSession(recorder_agent(log))


async def held(s: LocalSession, n: int) -> None:
    """Wait until the speculative turn holds ``n`` outputs."""
    await wait_for(lambda: s.runtime.speculation is not None and len(s.runtime.speculation.held) >= n)


async def saved_state(s: LocalSession) -> bytes | None:
    return await s.store.load_state(TIER_REASONING, s.session_id)


async def test_a_dropped_speculative_turn_leaves_no_trace() -> None:
    log: list[str] = []
    async with session(log) as s:
        await ask(s, "first")
        await s.collect_turn()
        before = history(s)
        await s.emit(SpeculativeTurn(transcript="my account number is"))
        await held(s, 1)
        state = await saved_state(s)
        await held(s, 3)  # it answers, and holds the answer
        assert await saved_state(s) == state and state is not None  # nothing of it is durable
        assert b"my account number is" not in state
        await s.emit(SpeculationDropped())
        assert await s.quiet(0.3) == []  # nothing reached the caller: no chunk, no notice, no clear
        assert log == ["start", "completed", "start", "unwound"]  # the LLM request was given up
        assert "handler-start" not in log  # no interrupt: it never happened
        assert history(s) == before
        assert s.runtime.speculation is None
        counters = s.runtime.counters
        assert (counters["speculations"], counters["speculations_dropped"]) == (1, 1)
        # and the session goes on as before: the next turn is an ordinary one
        await ask(s, "second")
        assert reply_text(await s.collect_turn()) == REPLY
        assert s.runtime.last_turn == 2  # numbered as if the dropped one had never been
        assert [m for m in history(s) if m[0] == "user"] == [("user", "first"), ("user", "second")]


def line_style_agent(session_info: SessionInfo) -> Bridge:
    """Keeps what the caller was sent as Line's examples do: ``AgentSpeechSent`` in its history."""
    node = ReasoningNode(llm_client=ScriptedLLM([REPLY], first_token_delay=0.005, tokens_per_second=200))
    bridge = Bridge(node)
    bridge.on(UserTranscriptionReceived).map(node.add_event)
    bridge.on(AgentSpeechSent).map(node.add_event)
    bridge.on(UserStoppedSpeaking).stream(node.generate).broadcast()
    return bridge


def told(s: LocalSession) -> list[str]:
    node = s.nodes[0]
    assert isinstance(node, ReasoningNode)
    return [e.content for e in node.conversation_events if isinstance(e, AgentSpeechSent)]


async def test_a_dropped_speculative_turn_keeps_what_the_caller_was_told_before_it() -> None:
    """The caller reports what it got as it speaks on, so the report of the last answer comes just
    before the speculative turn. Its ``AgentSpeechSent`` was added to the history just after the
    turn saved the nodes, and the drop, putting them back, undid it: the answer the caller heard
    was gone from the history. Now the turn saves the nodes once earlier work is done."""
    async with LocalSession(line_style_agent) as s:
        s.report_interval_s = 3600  # the caller reports what it got when it speaks next
        await ask(s, "first")
        assert reply_text(await s.collect_turn()) == REPLY
        await s.emit(SpeculativeTurn(transcript="my account number is"))  # the report first
        await held(s, 1)
        await s.emit(SpeculationDropped())
        await s.runtime.inline_routes_idle()
        assert told(s) == [REPLY]


async def test_a_report_during_a_dropped_speculative_turn_is_told_again() -> None:
    """A delivery report that arrives while a speculative turn runs tells the bridges what the
    caller heard; the drop undoes that with the rest of the turn's work, so it is told again."""
    async with LocalSession(line_style_agent, report_delivery=False) as s:  # it reports below
        await ask(s, "first")
        assert reply_text(await s.collect_turn()) == REPLY
        speculative = SpeculativeTurn(transcript="my account number is")
        await s.transport.publish(Envelope.wrap(s.session_id, speculative, source=Source.SPEECH), IN)
        await held(s, 1)
        report = SpeechDelivered(turn=1, seq=s.runtime.ledger.last_sent(1))  # the first answer, heard
        await s.transport.publish(Envelope.wrap(s.session_id, report, source=Source.EDGE), IN)
        await s.settle()
        assert s.runtime.speculation is not None and s.runtime.speculation.reports
        await s.emit(SpeculationDropped())
        await s.runtime.inline_routes_idle()
        assert told(s) == [REPLY]


async def test_a_confirmed_speculative_turn_is_released_at_once() -> None:
    log: list[str] = []
    async with session(log) as s:
        await s.emit(SpeculativeTurn(transcript="I want a refund"))
        await wait_for(lambda: "completed" in log)  # the whole answer, held
        assert await s.quiet(0.1) == []
        await ask(s, "I want a refund")  # the turn's usual end, the same words: confirmed
        events = await s.collect_turn(timeout=1.0)
        assert reply_text(events) == REPLY
        assert log == ["start", "completed"]  # one generation: the confirmation started none
        assert history(s) == [("user", "I want a refund"), ("assistant", REPLY)]
        assert s.runtime.counters["speculations_confirmed"] == 1
        assert await saved_state(s) is not None


async def test_a_speculative_turn_still_running_when_confirmed_streams_on() -> None:
    log: list[str] = []
    slow = interruptible_agent(tokens_per_second=40, replies=(REPLY,))
    async with LocalSession(slow) as s:
        await s.emit(SpeculativeTurn(transcript="hello"))
        await held(s, 2)
        await ask(s, "hello")
        events = await s.collect_turn()
        assert reply_text(events) == REPLY
        assert [type(e) for e in events].count(AgentGenerationComplete) == 1
        assert log == []


async def test_other_words_start_the_turn_again() -> None:
    log: list[str] = []
    async with session(log) as s:
        await s.emit(SpeculativeTurn(transcript="I would like to book a table for"))
        await held(s, 2)
        await ask(s, "I would like to book a table for two")
        events = await s.collect_turn()
        assert reply_text(events) == REPLY
        assert log[:2] == ["start", "unwound"] and log[2:] == ["start", "completed"]
        assert history(s) == [("user", "I would like to book a table for two"), ("assistant", REPLY)]
        assert s.runtime.counters["speculations_dropped"] == 1


async def test_a_barge_in_during_a_speculative_turn_drops_it_silently() -> None:
    """The stop button in the caller's own pause: the answer nobody heard is dropped, no notice."""
    log: list[str] = []
    async with session(log) as s:
        await s.emit(SpeculativeTurn(transcript="hello"))
        await held(s, 2)
        await s.emit(UserStartedSpeaking())
        received = await s.quiet(0.3)
        assert not [e for e in received if isinstance(e, AgentResponse | TurnInterrupted)]
        assert "handler-start" not in log and history(s) == []


async def test_a_speculative_turn_on_an_owner_that_dies_is_run_by_the_adopter() -> None:
    log: list[str] = []
    async with session(log) as s:
        await ask(s, "first")
        await s.collect_turn()
        await s.emit(SpeculativeTurn(transcript="second"))
        await held(s, 3)
        await s.crash()  # nothing of the speculation was durable; the adopter never heard of it
        await s.emit(UserTranscriptionReceived(content="second"))
        await s.emit(UserStoppedSpeaking())
        events = await s.collect_turn()
        assert reply_text(events) == REPLY  # once, whole
        assert [m for m in history(s) if m[0] == "user"] == [("user", "first"), ("user", "second")]


async def test_a_graceful_stop_during_a_speculative_turn_hands_over_the_session_as_it_was() -> None:
    log: list[str] = []
    async with session(log) as s:
        await s.emit(SpeculativeTurn(transcript="hello"))
        await held(s, 2)
        await s.restart()  # drain: the speculation is dropped, the checkpoint is the real state
        assert history(s) == []
        await ask(s, "hello")
        assert reply_text(await s.collect_turn()) == REPLY
        assert history(s) == [("user", "hello"), ("assistant", REPLY)]


async def test_a_dropped_speculative_turn_leaves_the_cut_off_answer_to_resume() -> None:
    """A cough after a barge-in resumes the answer it cut off: a speculative turn dropped between the
    two (the caller paused, then went on) must not have taken its place."""
    first, second = (" ".join(f"{c}{i}" for i in range(30)) for c in "ab")
    agent = interruptible_agent(replies=(first, second), resume=True)
    async with LocalSession(agent) as s:
        await ask(s, "q1")
        heard = "".join(await take_chunks(s, 4))
        await s.emit(UserStartedSpeaking())  # cut off...
        await s.emit(SpeculativeTurn(transcript="hmm"))
        await held(s, 2)
        await s.emit(SpeculationDropped())  # ... the caller paused and went on, briefly
        await s.emit(FalseInterruption(duration_ms=300))  # it was only a cough after all
        rest = await s.collect_turn()
        assert heard + reply_text(rest) == first  # the cut-off answer, resumed where it was cut
        assert history(s) == [("user", "q1"), ("assistant", first)]


async def test_what_a_confirmed_turn_says_while_its_held_output_goes_out_comes_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker takes a moment to confirm each publish (RabbitMQ does; the in-memory one did not):
    the answer went on streaming while the held part of it was going out, and its newer chunks
    overtook the held ones. Through the services a caller's answer then never played (bench e2e
    stalled on the phone after "speculative turn confirmed (29 held)")."""
    publish = MemoryTransport.publish

    async def confirmed_later(self: MemoryTransport, envelope: Envelope, direction: Direction) -> None:
        await asyncio.sleep(0.002)  # the broker's confirm, as a round trip
        await publish(self, envelope, direction)

    monkeypatch.setattr(MemoryTransport, "publish", confirmed_later)
    fast = interruptible_agent(tokens_per_second=400, replies=(REPLY,))
    async with LocalSession(fast) as s:
        await s.emit(SpeculativeTurn(transcript="hello"))
        await held(s, 4)
        await ask(s, "hello")  # confirmed while the answer still streams
        events = await s.collect_turn()
        assert reply_text(events) == REPLY
        assert [type(e) for e in events].count(AgentGenerationComplete) == 1
        assert isinstance(events[-1], AgentGenerationComplete), events[-3:]
