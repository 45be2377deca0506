"""``bargein.line.evals``: Line 0.1's conversation tests (``ConversationRunner``, turns, similarity)
run against bargein's reasoning nodes.

What needs no model (wildcards, exact matches, tool calls, telephony events, the conversation's
shape) is tested offline. What asks Gemini is tested against a Gemini stand-in: a real HTTP server
on 127.0.0.1 that answers ``generateContent`` in the API's JSON shape, which the real
``google-genai`` client reaches through ``GOOGLE_GEMINI_BASE_URL``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bargein import messages
from bargein.agent.llm import ScriptedLLM
from bargein.line import ConversationContext, ReasoningNode
from bargein.line.evals import AgentTurn, ConversationRunner, Turn, UserTurn
from bargein.line.evals.similarity_utils import (
    SIMILARITY_MODEL,
    SimilarityResult,
    extract_statement,
    is_similar_dict,
    is_similar_str,
    is_similar_text,
    is_similar_via_statement_pattern,
    is_statement_pattern,
)
from bargein.line.evals.turn import ToolCall, load_conversation_json, make_turn
from bargein.line.events import (
    AgentResponse,
    DTMFOutputEvent,
    EndCall,
    Event,
    ToolResult,
    TransferCall,
    UserTranscriptionReceived,
)
from bargein.line.events import ToolCall as ToolCallEvent
from tests.gemini import GeminiStandIn, Reply, Request

# --- a Gemini stand-in -----------------------------------------------------------------------------


class Judge:
    """The Gemini the similarity checks ask (``tests/gemini.py`` on loopback): it answers each
    prompt with ``answer(prompt)``."""

    def __init__(self) -> None:
        self.answer: Callable[[str], str] = lambda prompt: "YES"
        self.server = GeminiStandIn(lambda body: Reply(pieces=[self.answer(_prompt(body))]))

    @property
    def requests(self) -> list[Request]:
        return self.server.requests

    @property
    def prompts(self) -> list[str]:
        return [_prompt(r.body) for r in self.requests]


def _prompt(body: dict[str, Any]) -> str:
    text: str = body["contents"][0]["parts"][0]["text"]
    return text


@pytest.fixture
def gemini(monkeypatch: pytest.MonkeyPatch) -> Iterator[Judge]:
    judge = Judge()
    with judge.server:
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", judge.server.url)
        monkeypatch.setenv("GEMINI_API_KEY", "test-key")
        for name in ("GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_CLOUD_PROJECT"):
            monkeypatch.delenv(name, raising=False)
        yield judge


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Gemini reachable: a check that asks the model fails loudly instead of passing."""
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", "http://127.0.0.1:9")  # the discard port: refused
    monkeypatch.setenv("GEMINI_API_KEY", "unused")
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)


# --- similarity without a model --------------------------------------------------------------------


def test_wildcards_and_equal_texts_match_without_a_model(offline: None) -> None:
    assert is_similar_str("*", "anything at all") == SimilarityResult(is_success=True, error=None)
    assert is_similar_str("Whatever", "*").is_success
    assert is_similar_str("  Hello there ", "hello THERE").is_success
    assert is_similar_text(["*", "no"], "whatever").is_success  # tried in order: the first decides
    assert is_similar_text("Goodbye!", ["goodbye!", "hi"]).is_success


def test_statement_patterns() -> None:
    assert is_statement_pattern(" <asks for a name> ") and not is_statement_pattern("<half")
    assert extract_statement(" <asks for a name> ") == "asks for a name"
    assert is_similar_via_statement_pattern("plain", "text") == SimilarityResult(is_success=None, error=None)
    assert is_similar_str("<*>", "<greets>").is_success  # two statements are compared as texts


def test_is_similar_text_with_empty_lists() -> None:
    with pytest.raises(RuntimeError):
        is_similar_text([], [])
    result = is_similar_text([], "hi")
    assert result.is_success is False and result.error and "empty" in result.error


def test_is_similar_dict(offline: None) -> None:
    expected = {"account": "A1", "options": {"when": "*", "limit": 3}, "note": None}
    assert is_similar_dict(
        {"account": "a1", "options": {"when": "now", "limit": 3}, "note": 7}, expected
    ).is_success
    keys = is_similar_dict({"account": "a1", "extra": 1}, {"account": "a1", "missing": 2})
    assert (
        keys.is_success is False
        and keys.error == "Key mismatch - missing keys: ['missing'], extra keys: ['extra']"
    )
    value = is_similar_dict({"n": 2}, {"n": 3})
    assert value.error == "Value mismatch for key 'n': expected 3, got 2"
    nested = is_similar_dict({"o": {"n": 2}}, {"o": {"n": 3}})
    assert nested.error == "Nested dict mismatch for key 'o': Value mismatch for key 'n': expected 3, got 2"


# --- turns -----------------------------------------------------------------------------------------


def test_turns_become_the_events_a_node_would_have_in_its_history() -> None:
    assert UserTurn(text="hi").to_events() == [UserTranscriptionReceived(content="hi")]
    assert UserTurn(text=["only one"]).to_events() == [UserTranscriptionReceived(content="only one")]
    with pytest.raises(RuntimeError):
        UserTurn(text=["one", "two"]).to_events()
    agent = AgentTurn(
        text=["Your balance is 12.", "*"],
        tool_calls=[ToolCall(name="balance", arguments={"a": 1}, result=12), ToolCall(name="log")],
        telephony_events=[EndCall()],
    )
    assert agent.to_events() == [
        ToolCallEvent(tool_name="balance", tool_args={"a": 1}),
        ToolResult(tool_name="balance", tool_args={"a": 1}, result=12),
        ToolCallEvent(tool_name="log"),
        AgentResponse(content="Your balance is 12."),
    ]
    assert (agent.is_agent, agent.is_user, UserTurn().is_user) == (True, False, True)


def test_what_a_node_yields_folds_into_a_turn() -> None:
    turn = Turn.from_events(
        [
            AgentResponse(content=" Transferring "),
            ToolCallEvent(tool_name="lookup", tool_args={"q": 1}),
            AgentResponse(content="you now. "),
            ToolResult(tool_name="lookup", result="found"),
            ToolResult(tool_name="orphan", tool_args={"x": 2}, result=3),
            DTMFOutputEvent(button="1"),
            TransferCall(target_phone_number="+15550100"),
        ]
    )
    assert turn.role == "assistant" and turn.text == "Transferring you now."
    assert turn.tool_calls == [
        ToolCall(name="lookup", arguments={"q": 1}, result="found"),
        ToolCall(name="orphan", arguments={"x": 2}, result=3),
    ]
    assert turn.telephony_events == [
        DTMFOutputEvent(button="1"),
        TransferCall(target_phone_number="+15550100"),
    ]
    assert Turn.from_events([UserTranscriptionReceived(content="hello")]).role == "user"
    assert Turn.from_events([]).role == "assistant"


def test_is_similar_compares_role_text_tools_and_telephony(offline: None) -> None:
    expected = AgentTurn(text="*", tool_calls=[ToolCall(name="transfer", arguments={"to": None})])
    actual = Turn.from_events([ToolCallEvent(tool_name="transfer", tool_args={"to": "+15550100"})])
    assert expected.is_similar(actual) is None  # an expected None accepts any value
    assert expected.is_similar(UserTurn(text="hi")) == "Role mismatch: expected 'assistant', got 'user'"
    assert expected.is_similar(AgentTurn(text="x")) == "Tool call count mismatch: expected 1, got 0"
    other_tool = AgentTurn(tool_calls=[ToolCall(name="hangup", arguments={"to": 1})])
    assert expected.is_similar(other_tool) == "Tool name mismatch: expected 'transfer', got 'hangup'"
    with_result = AgentTurn(tool_calls=[ToolCall(name="t", result=1)])
    assert with_result.is_similar(AgentTurn(tool_calls=[ToolCall(name="t", result=2)])) == (
        "Tool 't' result mismatch: expected 1, got 2"
    )
    hang_up = AgentTurn(text="Bye.", telephony_events=[EndCall()])
    assert hang_up.is_similar(AgentTurn(text="bye.", telephony_events=[EndCall()])) is None
    assert (
        hang_up.is_similar(AgentTurn(text="bye."))
        == "telephony_events mismatch: expected [EndCall(reason='')], got []"
    )


def test_turns_load_from_json_with_their_telephony_events(tmp_path: Path) -> None:
    path = tmp_path / "conversation.json"
    path.write_text(
        json.dumps(
            [
                {"role": "user", "text": "Press one for me"},
                {
                    "role": "assistant",
                    "text": ["Pressing one.", "*"],
                    "tool_calls": [{"name": "log", "arguments": {"n": 1}}],
                    "telephony_events": [{"button": "1"}, {"target_phone_number": "+15550100"}, {}],
                },
            ]
        )
    )
    user, agent = load_conversation_json(path)
    assert isinstance(user, UserTurn) and isinstance(agent, AgentTurn)
    assert agent.telephony_events == [
        DTMFOutputEvent(button="1"),
        TransferCall(target_phone_number="+15550100"),
        EndCall(),
    ]
    assert make_turn(agent.model_dump()) == agent  # and back
    with pytest.raises(ValueError, match="invalid role"):
        make_turn({"role": "system"})


# --- ConversationRunner ----------------------------------------------------------------------------


class Concierge(ReasoningNode):
    """Answers from a table; remembers the histories it was given."""

    ANSWERS = {"hi": "Hello! How can I help?", "hours?": "We open at nine.", "bye": "Goodbye!"}

    def __init__(self) -> None:
        super().__init__(system_prompt="You are a concierge.")
        self.seen: list[list[Event]] = []
        self.seen_messages: list[list[dict[str, str]]] = []

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        self.seen.append(list(context.events))
        self.seen_messages.append(list(messages))
        assert self.context is context
        question = context.get_latest_user_transcript_message() or ""
        if question == "bye":
            yield AgentResponse(content="Goodbye!")
            yield EndCall()
            return
        if question == "balance?":
            yield ToolCallEvent(tool_name="balance", tool_args={"account": "a1"})
            yield ToolResult(tool_name="balance", result=12)
        yield AgentResponse(content=self.ANSWERS.get(question, "Your balance is 12."))


async def test_a_matching_conversation_passes_and_each_call_sees_the_history_so_far(offline: None) -> None:
    node = Concierge()
    await ConversationRunner(
        node,
        [
            AgentTurn(text="Welcome to the hotel."),
            UserTurn(text="hi"),
            AgentTurn(text="hello! how can i help?"),
            UserTurn(text="balance?"),
            AgentTurn(
                text="*", tool_calls=[ToolCall(name="balance", arguments={"account": "a1"}, result=12)]
            ),
            UserTurn(text="bye"),
            AgentTurn(text="Goodbye!", telephony_events=[EndCall()]),
        ],
    ).run()
    assert len(node.seen) == 3
    assert node.seen[1] == [
        AgentResponse(content="Welcome to the hotel."),  # the opening turn, as written
        UserTranscriptionReceived(content="hi"),
        AgentResponse(content="Hello! How can I help?"),  # the node's own answer, not the expected text
        UserTranscriptionReceived(content="balance?"),
    ]
    assert node.seen_messages[0] == [
        {"role": "system", "content": "You are a concierge."},
        {"role": "assistant", "content": "Welcome to the hotel."},
        {"role": "user", "content": "hi"},
    ]


async def test_a_wrong_answer_fails_with_the_reason_and_the_note(offline: None) -> None:
    runner = ConversationRunner(
        Concierge(),
        [UserTurn(text="hi"), AgentTurn(text="*", tool_calls=[ToolCall(name="book")])],
        test_note="booking flow",
    )
    with pytest.raises(AssertionError) as caught:
        await runner.run()
    text = str(caught.value)
    assert "Agent turn doesn't match expected." in text and "User message: hi" in text
    assert "Tool call count mismatch: expected 1, got 0" in text and text.endswith("Test notes: booking flow")


@pytest.mark.parametrize(
    "turns, message",
    [
        ([UserTurn(text="hi")], "Conversation must end with agent turn."),
        (
            [UserTurn(text="a"), UserTurn(text="b"), AgentTurn(text="*")],
            "Invalid conversation pattern at position 1",
        ),
        ([AgentTurn(text="a"), AgentTurn(text="b")], "two consecutive 'assistant' turns"),
    ],
)
async def test_a_conversation_must_alternate_and_end_with_the_agent(turns: list[Turn], message: str) -> None:
    node = Concierge()
    with pytest.raises(ValueError, match=message):
        await ConversationRunner(node, turns).run()
    assert node.seen == []  # checked before the node is asked anything


async def test_the_initial_agent_message_must_match_the_opening_turn(offline: None) -> None:
    turns = [AgentTurn(text="Welcome!"), UserTurn(text="hi"), AgentTurn(text="*")]
    await ConversationRunner(Concierge(), turns, initial_agent_message="Welcome!").run()
    await ConversationRunner(Concierge(), turns, initial_agent_message="welcome! ").run()
    await ConversationRunner(Concierge(), [UserTurn(text="hi"), AgentTurn(text="*")], "ignored").run()
    await ConversationRunner(Concierge(), [], "nothing to check").run()


async def test_a_default_reasoning_node_on_the_scripted_model_runs_too(offline: None) -> None:
    node = ReasoningNode(
        system_prompt="Be brief.",
        llm_client=ScriptedLLM(["Hi there.", "Sure thing."], first_token_delay=0, tokens_per_second=1000),
    )
    await ConversationRunner(
        node,
        [
            UserTurn(text="hello"),
            AgentTurn(text="hi there."),
            UserTurn(text="help?"),
            AgentTurn(text="Sure thing."),
        ],
    ).run()


# --- with the Gemini stand-in ----------------------------------------------------------------------


def test_different_texts_are_judged_by_gemini(gemini: Judge) -> None:
    gemini.answer = lambda prompt: "YES"
    assert is_similar_str("What's your name?", "Who am I speaking with?") == SimilarityResult(True, None)
    gemini.answer = lambda prompt: "NO: one asks for a name, the other for an age"
    result = is_similar_str("What's your name?", "How old are you?")
    assert result == SimilarityResult(is_success=False, error="one asks for a name, the other for an age")
    gemini.answer = lambda prompt: "Maybe?"
    unclear = is_similar_str("a", "b")
    assert unclear.is_success is False and unclear.error and "Maybe?" in unclear.error

    first = gemini.requests[0]
    assert first.path.endswith(f"models/{SIMILARITY_MODEL}:generateContent")
    assert first.headers.get("x-goog-api-key") == "test-key"
    assert first.body["generationConfig"]["temperature"] == pytest.approx(0.1)
    assert "What's your name?" in gemini.prompts[0] and "Who am I speaking with?" in gemini.prompts[0]


def test_a_statement_is_checked_against_the_text_by_gemini(gemini: Judge) -> None:
    gemini.answer = lambda prompt: "YES" if "Who is calling" in prompt else "NO: it does not ask"
    assert is_similar_str("<asks for the caller's name>", "Who is calling, please?").is_success
    refused = is_similar_str("Please hold.", "<asks for the caller's name>")
    assert refused == SimilarityResult(is_success=False, error="it does not ask")
    assert all(
        "asks for the caller's name" in p and "<" not in p.split("Requirement:")[1][:3]
        for p in gemini.prompts
    )


def test_gemini_is_not_asked_when_the_rules_decide(gemini: Judge) -> None:
    is_similar_str("*", "x")
    is_similar_str("Same", "same")
    is_similar_dict({"a": "A"}, {"a": "a"})
    assert gemini.requests == []


async def test_the_runner_fails_a_turn_gemini_says_differs(gemini: Judge) -> None:
    gemini.answer = lambda prompt: "NO: it talks about hours, not prices" if "nine" in prompt else "YES"
    ok = [UserTurn(text="hi"), AgentTurn(text="Hi, what can I do for you?")]
    await ConversationRunner(Concierge(), ok).run()
    wrong = [UserTurn(text="hours?"), AgentTurn(text="<gives the room prices>")]
    reason = r"Text mismatch: \['<gives the room prices>'\] != \['We open at nine.'\] \(it talks about hours"
    with pytest.raises(AssertionError, match=reason):
        await ConversationRunner(Concierge(), wrong).run()
    assert len(gemini.requests) == 2


async def test_an_initial_agent_message_that_gemini_rejects_fails_the_run(gemini: Judge) -> None:
    gemini.answer = lambda prompt: "NO: a different greeting"
    runner = ConversationRunner(
        Concierge(),
        [AgentTurn(text="Welcome!"), UserTurn(text="hi"), AgentTurn(text="*")],
        "Go away.",
        "greeting",
    )
    with pytest.raises(AssertionError, match="Initial agent message doesn't match") as caught:
        await runner.run()
    assert "Similarity error: ['Go away.'] != ['Welcome!'] (a different greeting)" in str(caught.value)
    assert str(caught.value).endswith("Test notes: greeting")


async def test_the_initial_agent_message_may_match_any_text_the_opening_turn_lists(
    gemini: Judge,
) -> None:
    gemini.answer = lambda prompt: "NO: a different greeting"
    turns = [AgentTurn(text=["Welcome!", "Hello!"]), UserTurn(text="hi"), AgentTurn(text="*")]
    await ConversationRunner(Concierge(), turns, initial_agent_message="hello!").run()
    assert len(gemini.requests) == 1  # "Welcome!" was asked about; "Hello!" matched as written
