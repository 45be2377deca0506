"""``bargein.examples.line_gemini_chat``, an agent in the shape of Line's own Gemini examples, run on
the in-process runtime against a Gemini stand-in on loopback (``tests/gemini.py``) through the real
``google-genai`` client: what it sends Gemini (the committed history, built from ``AgentSpeechSent``
as Line's examples build it), barge-in mid-stream, the ``end_call`` tool, per-call configuration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bargein.examples import line_gemini_chat
from bargein.line.events import AgentResponse, EndCall, UserStartedSpeaking
from bargein.testing import LocalSession
from tests.gemini import GeminiStandIn, contents

from . import ask, chunks, text_of, wait_for


@pytest.fixture
def gemini(monkeypatch: pytest.MonkeyPatch) -> Iterator[GeminiStandIn]:
    with GeminiStandIn() as stand_in:
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", stand_in.url)
        monkeypatch.setenv("GEMINI_API_KEY", "test-key")
        yield stand_in


async def test_it_greets_answers_and_sends_gemini_what_the_caller_heard(gemini: GeminiStandIn) -> None:
    async with LocalSession(line_gemini_chat.handle_new_call) as s:
        assert text_of(await s.collect_turn()) == line_gemini_chat.GREETING
        await ask(s, "hello")
        assert text_of(await s.collect_turn()) == "You said hello."
        await ask(s, "again")
        assert text_of(await s.collect_turn()) == "You said again."
    assert contents(gemini.requests[-1]) == [
        ("model", line_gemini_chat.GREETING),
        ("user", "hello"),
        ("model", "You said hello."),
        ("user", "again"),
    ]
    assert gemini.requests[-1].body["systemInstruction"]["parts"][0]["text"] == line_gemini_chat.SYSTEM_PROMPT


async def test_a_barge_in_cuts_the_stream_and_the_next_request_has_only_what_was_heard(
    gemini: GeminiStandIn,
) -> None:
    async with LocalSession(line_gemini_chat.handle_new_call) as s:
        await s.collect_turn()
        await ask(s, "tell me everything you know [slow]")
        heard = await chunks(s, 1)
        await s.emit(UserStartedSpeaking())
        assert s.interrupted_turns == [2]
        assert await s.quiet(0.8) == []  # nothing more of the cut answer, though Gemini streams on
        await ask(s, "stop")
        assert text_of(await s.collect_turn()) == "You said stop."
    sent = contents(gemini.requests[-1])
    assert sent[-3:] == [
        ("user", "tell me everything you know [slow]"),
        ("model", heard.rstrip()),
        ("user", "stop"),
    ]


async def test_the_end_call_tool_says_goodbye_and_hangs_up(gemini: GeminiStandIn) -> None:
    async with LocalSession(line_gemini_chat.handle_new_call) as s:
        await s.collect_turn()
        await ask(s, "that is all [bye]")
        # the goodbye, then the hang-up; the session ends with it (the turn's end may not get out)
        turn = [await s.next(timeout=10), await s.next(timeout=10)]
    assert [type(e) for e in turn] == [AgentResponse, EndCall]
    assert text_of(turn) == "Goodbye!"
    declared = gemini.requests[-1].body["tools"][0]["functionDeclarations"][0]
    assert declared["name"] == "end_call" and "goodbye_message" in str(declared)


async def test_the_call_request_configures_the_prompt_and_the_greeting(gemini: GeminiStandIn) -> None:
    options = {"agent": {"system_prompt": "You are a pirate.", "introduction": ""}}
    async with LocalSession(line_gemini_chat.handle_new_call, options=options) as s:
        await ask(s, "ahoy")  # no greeting: the first turn is the caller's
        assert text_of(await s.collect_turn()) == "You said ahoy."
    await wait_for(lambda: bool(gemini.requests))
    assert gemini.requests[0].body["systemInstruction"]["parts"][0]["text"] == "You are a pirate."
    assert contents(gemini.requests[0]) == [("user", "ahoy")]
