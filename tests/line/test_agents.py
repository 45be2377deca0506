"""The four Line-style example agents (``services/reasoning/agents/line_*.py``), each through a
whole conversation on the in-process runtime."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bargein.agent.llm import DEFAULT_REPLIES
from bargein.examples import line_background, line_counter, line_echo, line_storyteller
from bargein.line import ConversationContext
from bargein.line.events import (
    AgentGenerationComplete,
    AgentResponse,
    DTMFInputEvent,
    EndCall,
    UserStartedSpeaking,
    UserTranscriptionReceived,
)
from bargein.testing import LocalSession

from . import ask, chunks, text_of, wait_for

AGENTS_DIR = Path(line_echo.__file__).parent


@pytest.fixture(autouse=True)
def scripted_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The storyteller's model is the scripted one, at 100 words/s: quick, and slow enough to
    interrupt after a couple of chunks."""
    monkeypatch.delenv("BARGEIN_LLM_BASE_URL", raising=False)
    monkeypatch.setenv("BARGEIN_SCRIPTED_FIRST_TOKEN_MS", "5")
    monkeypatch.setenv("BARGEIN_SCRIPTED_TOKENS_PER_S", "100")


@pytest.mark.parametrize("name", ["line_echo", "line_counter", "line_storyteller", "line_background"])
def test_agents_import_only_from_bargein_line(name: str) -> None:
    tree = ast.parse((AGENTS_DIR / f"{name}.py").read_text())
    modules = [
        node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0
    ] + [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    ours = [m for m in modules if m.split(".")[0] in ("bargein", "services", "line")]
    assert ours and all(m == "bargein.line" or m.startswith("bargein.line.") for m in ours), ours


# --- echo -----------------------------------------------------------------------------------------


async def test_echo_repeats_the_latest_transcript() -> None:
    async with LocalSession(line_echo.handle_new_call) as s:
        await ask(s, "hello")
        assert await s.collect_turn() == [AgentResponse(content="You said: hello"), AgentGenerationComplete()]
        await ask(s, "how are you")
        assert text_of(await s.collect_turn()) == "You said: how are you"
        assert {env.source for env, _ in s.received} == {"echo"}
        node = s.nodes[0]
        assert isinstance(node, line_echo.EchoNode)
        assert node.conversation_events[-1] == AgentResponse(content="You said: how are you")


async def test_echo_interrupted_before_it_speaks_says_nothing_stale() -> None:
    async with LocalSession(line_echo.handle_new_call, options={"sleep_ms": 300}) as s:
        await ask(s, "first")
        await s.emit(UserStartedSpeaking())  # the caller talks again before the echo
        assert s.interrupted_turns == [1]
        await ask(s, "second")
        assert text_of(await s.collect_turn()) == "You said: second"
        assert text_of([e for _, e in s.received]) == "You said: second"  # nothing of turn 1, ever
        node = s.nodes[0]
        assert isinstance(node, line_echo.EchoNode)
        committed = ConversationContext(node.conversation_events, node.system_prompt).get_committed_events()
        assert committed == [  # the cut-off echo was never heard, so it is not in the history
            UserTranscriptionReceived(content="first"),
            UserTranscriptionReceived(content="second"),
            AgentResponse(content="You said: second"),
        ]


# --- counter --------------------------------------------------------------------------------------


async def test_counter_greets_counts_and_ends_the_call_after_its_last_chunk() -> None:
    async with LocalSession(line_counter.handle_new_call, options={"turns": 3}) as s:
        assert text_of(await s.collect_turn()) == line_counter.greeting(3)
        node = s.nodes[0]
        assert isinstance(node, line_counter.CounterNode)
        for n in (1, 2):
            await ask(s, f"turn {n} please")
            assert text_of(await s.collect_turn()) == f"That was turn {n}."
        await ask(s, "and the last one")
        last = await s.collect_turn()
        assert last == [
            AgentResponse(content="That "),
            AgentResponse(content="was "),
            AgentResponse(content="turn "),
            AgentResponse(content="3."),
            AgentResponse(content=" Goodbye!"),
            EndCall(),
            AgentGenerationComplete(),
        ]
        assert node.turns == 3


# --- storyteller ----------------------------------------------------------------------------------


async def test_storyteller_stops_on_speech_and_on_the_stop_button_but_not_on_other_buttons() -> None:
    async with LocalSession(line_storyteller.handle_new_call) as s:
        assert text_of(await s.collect_turn()) == line_storyteller.GREETING
        node = s.nodes[0]
        assert isinstance(node, line_storyteller.StoryNode)

        # a choice button is recorded, the stop button cuts the story off
        await ask(s, "a story about a lighthouse")
        heard = await chunks(s, 2)
        await s.emit(DTMFInputEvent(button="1"))
        assert s.interrupted_turns == [] and node.choices == ["1"]
        heard += await chunks(s, 1)
        await s.emit(DTMFInputEvent(button=line_storyteller.STOP_BUTTON))
        assert s.interrupted_turns == [2]
        await wait_for(lambda: node.interruptions == ["button #"])
        assert await s.quiet(0.2) == []
        assert DEFAULT_REPLIES[1].startswith(heard)
        assert node.conversation_events[-1] == AgentResponse(content=heard)  # only what was heard

        # speech cuts it off too
        await ask(s, "another one")
        heard = await chunks(s, 2)
        await s.emit(UserStartedSpeaking())
        assert s.interrupted_turns == [2, 3]
        await wait_for(lambda: node.interruptions == ["button #", "UserStartedSpeaking"])
        assert await s.quiet(0.2) == []
        assert DEFAULT_REPLIES[2].startswith(heard)

        # any other button leaves the story alone
        await ask(s, "go on")
        await chunks(s, 2)
        await s.emit(DTMFInputEvent(button="5"))
        rest = await s.collect_turn()
        assert isinstance(rest[-1], AgentGenerationComplete) and s.interrupted_turns == [2, 3]
        assert node.interruptions == ["button #", "UserStartedSpeaking"] and node.choices == ["1"]


# --- background node ------------------------------------------------------------------------------


async def test_background_tags_reach_the_speaking_node_and_never_the_caller() -> None:
    async with LocalSession(line_background.handle_new_call) as s:
        await ask(s, "will it rain tomorrow")
        assert text_of(await s.collect_turn()) == "Sounds like weather. So far: weather."
        await ask(s, "pizza for dinner")
        assert text_of(await s.collect_turn()) == "Sounds like food. So far: weather, food."
        assert await s.quiet(0.2) == []
        assert {env.source for env, _ in s.received} == {"chat"}
        assert not any(isinstance(e, line_background.TopicTagged) for _, e in s.received)
        chat = next(n for n in s.nodes if isinstance(n, line_background.ChatNode))
        tags = [e for e in chat.conversation_events if isinstance(e, line_background.TopicTagged)]
        assert [(t.topic, t.words) for t in tags] == [("weather", 4), ("food", 3)]


async def test_background_agents_speaking_node_is_interruptible() -> None:
    async with LocalSession(line_background.handle_new_call, options={"word_delay": 0.03}) as s:
        await ask(s, "any travel tips")
        heard = await chunks(s, 2)
        await s.emit(UserStartedSpeaking())
        assert s.interrupted_turns and heard == "Sounds like "
        assert await s.quiet(0.3) == []
        await ask(s, "what about food")
        assert text_of(await s.collect_turn()).startswith("Sounds like food.")
