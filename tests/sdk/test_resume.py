"""Picking a cut-off answer up again when the barge-in was only a cough (``ReasoningNode.resume``)."""

from __future__ import annotations

from bargein import (
    AgentGenerationComplete,
    FalseInterruption,
    ReasoningNode,
    UserStartedSpeaking,
)
from bargein.agent.llm import ScriptedLLM
from bargein.testing import LocalSession

from ..agents import interruptible_agent
from .helpers import ask, history, reply_text, take_chunks, wait_for

FIRST = " ".join(f"a{i}" for i in range(30))
SECOND = " ".join(f"b{i}" for i in range(30))


agent = interruptible_agent(replies=(FIRST, SECOND), resume=True)


async def test_a_cough_resumes_the_answer_where_the_caller_stopped_hearing_it() -> None:
    async with LocalSession(agent) as s:
        await ask(s, "q1")
        heard = "".join(await take_chunks(s, 4))
        await s.emit(UserStartedSpeaking())  # a cough...
        await s.emit(FalseInterruption(duration_ms=180))  # ...that speech detection saw through
        rest = await s.collect_turn()
        assert isinstance(rest[-1], AgentGenerationComplete)
        assert heard + reply_text(rest) == FIRST  # nothing repeated, nothing missing
        assert history(s) == [("user", "q1"), ("assistant", FIRST)]  # one whole answer
        await ask(s, "q2")  # and the conversation goes on with the next reply
        assert reply_text(await s.collect_turn()) == SECOND


async def test_a_resumed_answer_cut_off_again_keeps_both_parts_heard() -> None:
    async with LocalSession(agent) as s:
        await ask(s, "q1")
        first = "".join(await take_chunks(s, 3))
        await s.emit(UserStartedSpeaking())
        await s.emit(FalseInterruption())
        second = "".join(await take_chunks(s, 2))
        await s.emit(UserStartedSpeaking())  # a real barge-in this time
        await wait_for(lambda: len(s.interrupted_turns) == 2)
        assert history(s) == [("user", "q1"), ("assistant", first + second)]
        assert FIRST.startswith(first + second)


async def test_nothing_to_resume_says_nothing() -> None:
    async with LocalSession(agent) as s:
        await s.emit(FalseInterruption())  # before any answer
        await ask(s, "q1")
        await s.collect_turn()
        await s.emit(FalseInterruption())  # after a complete answer
        assert await s.quiet(0.2) == []
        assert history(s) == [("user", "q1"), ("assistant", FIRST)]


async def test_a_new_question_makes_the_cut_off_answer_history() -> None:
    async with LocalSession(agent) as s:
        await ask(s, "q1")
        heard = "".join(await take_chunks(s, 3))
        await s.emit(UserStartedSpeaking())
        await ask(s, "q2")  # the caller really did take the turn
        await s.collect_turn()
        await s.emit(FalseInterruption())  # a late cough: the first answer is not resumed now
        assert await s.quiet(0.2) == []
        assert history(s) == [("user", "q1"), ("assistant", heard), ("user", "q2"), ("assistant", SECOND)]


async def test_the_default_agent_resumes_after_a_cough() -> None:
    from bargein.examples import default

    async with LocalSession(default.agent) as s:
        node = s.nodes[0]
        assert isinstance(node, ReasoningNode)
        node.llm_client = ScriptedLLM([FIRST], first_token_delay=0.005, tokens_per_second=100)
        await ask(s, "hello")
        heard = "".join(await take_chunks(s, 5))
        await s.emit(UserStartedSpeaking())
        await s.emit(FalseInterruption(duration_ms=150))
        assert heard + reply_text(await s.collect_turn()) == FIRST
