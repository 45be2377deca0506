"""``bargein.line.utils``: Line 0.1's helper modules on bargein's events: the DTMF look-ahead, the
E.164 check, task groups, the Gemini and OpenAI conversions and the timing logs."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from google.genai import types
from openai.types.responses import Response

from bargein.line import Bridge, ConversationContext, ReasoningNode, VoiceAgentSystem
from bargein.line.events import (
    AgentGenerationComplete,
    AgentResponse,
    AgentSpeechSent,
    CustomReceived,
    DTMFInputEvent,
    DTMFOutputEvent,
    Event,
    ToolCall,
    ToolResult,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.line.utils.aio import await_tasks_safe, cancel_tasks_safe
from bargein.line.utils.dtmf_lookahead_buffer import (
    DTMF_EXPRESSION,
    DTMFLookAheadCharacterBuffer,
    DTMFLookAheadStringBuffer,
    split_dtmf_output,
)
from bargein.line.utils.gemini_utils import (
    convert_messages_to_gemini,
    log_gemini_messages,
    message_to_str,
    serialize_part,
)
from bargein.line.utils.log_aiter import context_log, log_afunc, log_aiter_func
from bargein.line.utils.openai_utils import (
    convert_messages_to_openai,
    extract_text_from_response,
    extract_tool_calls_from_response,
    has_tool_calls,
)
from bargein.line.utils.str import is_e164_phone_number
from bargein.testing import LocalSession

from . import line_agent

# --- the DTMF look-ahead ---------------------------------------------------------------------------


def _stream(chunks: list[str]) -> list[AgentResponse | DTMFOutputEvent]:
    buffer = DTMFLookAheadStringBuffer()
    out = [item for chunk in chunks for item in buffer.feed(chunk)]
    return out + list(buffer.flush())


def test_text_without_a_marker_is_held_until_flush_and_comes_out_whole() -> None:
    buffer = DTMFLookAheadStringBuffer()
    assert list(buffer.feed("Thanks for ")) == []
    assert list(buffer.feed("calling")) == []
    assert list(buffer.flush()) == [AgentResponse(content="Thanks for calling")]
    assert list(buffer.flush()) == []  # nothing left


def test_a_marker_split_across_chunks_becomes_one_press_per_button() -> None:
    assert _stream(["Press dt", "mf=", "40", "# now"]) == [
        AgentResponse(content="Press "),
        DTMFOutputEvent(button="4"),
        DTMFOutputEvent(button="0"),
        AgentResponse(content="# now"),  # '#' is not a word character: it ends the marker
    ]


def test_a_marker_at_the_end_of_the_stream_is_released_by_flush() -> None:
    assert _stream(["option ", "dtmf=7"]) == [AgentResponse(content="option "), DTMFOutputEvent(button="7")]


def test_words_with_a_d_are_held_only_until_they_end() -> None:
    """A word starting at any 'd' might be a marker, so text is released where such a word ends."""
    assert _stream(["I found it, and done."]) == [
        AgentResponse(content="I found"),
        AgentResponse(content=" it, and"),
        AgentResponse(content=" done"),
        AgentResponse(content="."),
    ]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("DTMF=1 ", [AgentResponse(content="DTMF=1 ")]),  # case matters
        # A candidate starts at any 'd', even inside a word, as in Line.
        ("xdtmf=1 ", [AgentResponse(content="x"), DTMFOutputEvent(button="1"), AgentResponse(content=" ")]),
        ("ddtmf=1 ", [AgentResponse(content="ddtmf=1"), AgentResponse(content=" ")]),
        ("dtmf=1,2", [DTMFOutputEvent(button="1"), AgentResponse(content=",2")]),
        ("dtmf=? ok", [AgentResponse(content="? ok")]),  # a marker with no buttons presses nothing
    ],
)
def test_marker_edge_cases(text: str, expected: list[Event]) -> None:
    assert _stream([text]) == expected


def test_the_character_buffer_keeps_a_markers_buttons_together() -> None:
    buffer = DTMFLookAheadCharacterBuffer()
    out = [item for c in "go dtmf=123 then" for item in buffer.feed(c)] + list(buffer.flush())
    assert out == [
        AgentResponse(content="go "),
        DTMFOutputEvent(button="123"),
        AgentResponse(content=" then"),
    ]
    assert (buffer.non_dtmf_buffer, buffer.dtmf_buffer) == ("", "")


def test_feeding_the_character_buffer_a_string_is_feeding_its_characters() -> None:
    whole, single = DTMFLookAheadCharacterBuffer(), DTMFLookAheadCharacterBuffer()
    text = "dial dtmf=9 and dtmf=0"
    by_string = list(whole.feed(text)) + list(whole.flush())
    by_char = [item for c in text for item in single.feed(c)] + list(single.flush())
    assert by_string == by_char


def test_split_dtmf_output() -> None:
    assert DTMF_EXPRESSION == "dtmf="
    assert list(split_dtmf_output(DTMFOutputEvent(button="*9"))) == [
        DTMFOutputEvent(button="*"),
        DTMFOutputEvent(button="9"),
    ]


class MenuNode(ReasoningNode):
    """Streams a reply that presses keys inline, through the look-ahead, as a Line node would."""

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        buffer = DTMFLookAheadStringBuffer()
        for chunk in ["Selecting billing: dt", "mf=2", "1. One moment."]:
            for item in buffer.feed(chunk):
                yield item
        for item in buffer.flush():
            yield item


async def test_key_presses_from_the_look_ahead_reach_the_caller_in_order() -> None:
    def build(system: VoiceAgentSystem) -> None:
        node = MenuNode(system_prompt="", node_id="menu")
        bridge = Bridge(node)
        system.with_speaking_node(node, bridge)
        bridge.on(UserTranscriptionReceived).map(node.add_event)
        bridge.on(UserStoppedSpeaking).stream(node.generate).broadcast()

    async with LocalSession(line_agent(build)) as s:
        await s.emit(UserTranscriptionReceived(content="billing please"))
        await s.emit(UserStoppedSpeaking())
        assert await s.collect_turn() == [
            AgentResponse(content="Selecting billing: "),
            DTMFOutputEvent(button="2"),
            DTMFOutputEvent(button="1"),
            AgentResponse(content=". One moment."),
            AgentGenerationComplete(),
        ]


# --- E.164 -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("number", ["+15550100123", "+442071838750", "+50012", "+123456789012345"])
def test_e164_numbers_pass(number: str) -> None:
    assert is_e164_phone_number(number)


@pytest.mark.parametrize(
    "number",
    [
        "15550100123",  # no '+'
        "+1 555 010 0123",
        "+1-555-0100",
        "+(44)2071838750",
        "+1234",  # too short
        "+1234567890123456",  # too long
        "+",
        "",
        "+15550100123\n",
        "+١٢٣٤٥٦٧",  # digits, but not ASCII ones
    ],
)
def test_other_strings_do_not(number: str) -> None:
    assert not is_e164_phone_number(number)


# --- task groups -----------------------------------------------------------------------------------


async def test_cancel_tasks_safe_cancels_and_waits_without_raising_for_cancellation() -> None:
    finished = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            finished.set()

    task = asyncio.create_task(forever())
    await asyncio.sleep(0)
    await cancel_tasks_safe(task)  # a single task is accepted too
    assert task.cancelled() and finished.is_set()


async def test_cancel_tasks_safe_raises_the_errors_tasks_raise_while_unwinding() -> None:
    async def fails_on_cancel() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    async def quiet() -> None:
        await asyncio.sleep(3600)

    tasks = [asyncio.create_task(fails_on_cancel()), asyncio.create_task(quiet())]
    await asyncio.sleep(0)
    with pytest.raises(ExceptionGroup) as caught:
        await cancel_tasks_safe(tasks)
    assert [str(e) for e in caught.value.exceptions] == ["cleanup failed"]
    assert all(t.done() for t in tasks)


async def test_await_tasks_safe_waits_and_collects_real_errors_only() -> None:
    async def ok() -> int:
        await asyncio.sleep(0.01)
        return 1

    async def boom() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("boom")

    async def cancelled_soon() -> None:
        await asyncio.sleep(3600)

    good, bad, gone = (asyncio.create_task(c) for c in (ok(), boom(), cancelled_soon()))
    asyncio.get_running_loop().call_later(0.005, gone.cancel)
    with pytest.raises(ExceptionGroup) as caught:
        await await_tasks_safe([good, bad, gone, None])
    assert [type(e) for e in caught.value.exceptions] == [ValueError]
    assert good.result() == 1 and gone.cancelled()

    await await_tasks_safe([good, gone])  # already finished tasks are skipped
    await await_tasks_safe([])


# --- Gemini ----------------------------------------------------------------------------------------

HISTORY: list[Event] = [
    UserTranscriptionReceived(content="What's my balance?"),
    ToolCall(tool_name="balance", tool_args={"account": "a1"}, tool_call_id="c1"),
    ToolResult(tool_name="balance", result={"eur": 12}, tool_call_id="c1"),
    AgentResponse(content="You have 12 euros."),
    DTMFInputEvent(button="5"),
    DTMFOutputEvent(button="#"),
    AgentSpeechSent(content="You have 12 euros."),
]


def test_convert_messages_to_gemini_maps_the_conversation_as_line_did() -> None:
    contents = convert_messages_to_gemini(HISTORY)
    assert [type(c) for c in contents] == [
        types.UserContent,
        types.ModelContent,  # the tool result; the call itself, and AgentSpeechSent, are left out
        types.ModelContent,
        types.UserContent,
        types.ModelContent,
    ]
    first, result, answer, dtmf_in, dtmf_out = contents
    assert isinstance(first, types.Content) and first.parts and first.parts[0].text == "What's my balance?"
    assert isinstance(result, types.Content) and result.parts
    response = result.parts[0].function_response
    assert (
        response is not None and response.name == "balance" and response.response == {"output": {"eur": 12}}
    )
    assert isinstance(answer, types.Content) and answer.parts and answer.parts[0].text == "You have 12 euros."
    assert isinstance(dtmf_in, types.Content) and dtmf_in.parts and dtmf_in.parts[0].text == "5"
    assert isinstance(dtmf_out, types.Content) and dtmf_out.parts and dtmf_out.parts[0].text == "#"


def test_a_tool_result_cannot_open_the_contents_and_a_nameless_one_gets_a_placeholder() -> None:
    contents = convert_messages_to_gemini(
        [
            ToolResult(tool_name="early", result=1),
            AgentResponse(content="hi"),
            ToolResult(tool_name="", result=2),
        ]
    )
    assert len(contents) == 2
    last = contents[1]
    assert isinstance(last, types.Content) and last.parts
    assert last.parts[0].function_response is not None
    assert last.parts[0].function_response.name == "unknown_tool"


def test_handlers_convert_their_exact_type_and_text_events_only_filters_first() -> None:
    def custom(event: Event) -> dict[str, Any]:
        assert isinstance(event, CustomReceived)
        return {"role": "user", "parts": [{"text": json.dumps(event.metadata)}]}

    def shout(event: Event) -> types.Content:
        assert isinstance(event, AgentResponse)
        return types.ModelContent(parts=[types.Part.from_text(text=event.content.upper())])

    events: list[Event] = [CustomReceived(metadata={"plan": "gold"}), AgentResponse(content="ok")]
    contents = convert_messages_to_gemini(events, {CustomReceived: custom, AgentResponse: shout})
    assert contents[0] == {"role": "user", "parts": [{"text": '{"plan": "gold"}'}]}
    shouted = contents[1]
    assert isinstance(shouted, types.Content) and shouted.parts and shouted.parts[0].text == "OK"

    only_text = convert_messages_to_gemini(HISTORY + events, {CustomReceived: custom}, text_events_only=True)
    assert len(only_text) == 3  # the user's question, the answer, "ok"; the custom event is skipped


def test_message_to_str_renders_roles_parts_and_exchanges() -> None:
    contents: list[types.Content] = [
        types.ModelContent(parts=[types.Part.from_text(text="Hello!")]),
        types.UserContent(parts=[types.Part.from_text(text="Hi.")]),
        types.ModelContent(
            parts=[
                types.Part.from_function_call(name="lookup", args={"q": "x"}),
                types.Part.from_text(text=" "),
            ]
        ),
        types.Content(role="user", parts=[types.Part.from_text(text="thanks")]),
    ]
    rendered = message_to_str(contents)
    lines = rendered.split("\n")
    assert lines[:3] == ["model: Hello!", "user: Hi.", ""]  # a blank line after a user line that answers
    parts = json.loads(rendered.split("model: ", 2)[2].split("\nuser: ")[0])
    assert parts[0].startswith("[function call] lookup(") and '"q": "x"' in parts[0]
    assert parts[1].startswith("[unsupported part type]")  # a blank text part
    assert rendered.endswith("user: thanks\n\n")


def test_serialize_part() -> None:
    assert serialize_part(types.Part.from_text(text="plain")) == "plain"
    assert serialize_part(types.Part.from_function_call(name="f", args={})) == "[function call] f({})"
    reply = serialize_part(types.Part.from_function_response(name="f", response={"output": 3}))
    assert reply == '[function response] f: {\n  "output": 3\n}'


def test_log_gemini_messages_logs_one_block(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bargein.line.utils.gemini_utils")
    log_gemini_messages("REQUEST", [types.UserContent(parts=[types.Part.from_text(text="hi")])], {"n": 1})
    (record,) = [r for r in caplog.records if r.name == "bargein.line.utils.gemini_utils"]
    text = record.getMessage()
    assert "BEGIN REQUEST" in text and "user: hi" in text and "[Statistics: {'n': 1}]" in text
    assert "END REQUEST" in text


def test_without_google_genai_the_modules_import_and_the_gemini_helpers_say_what_to_install() -> None:
    """Run in a fresh interpreter in which ``google.genai`` cannot be imported."""
    program = """
import sys
sys.modules["google.genai"] = None
import bargein.line.utils.gemini_utils as g
import bargein.line.evals
from bargein.line.events import AgentResponse
from bargein.line.evals.similarity_utils import is_similar_str
from bargein.line.tools import EndCallTool
assert is_similar_str("*", "anything").is_success
assert is_similar_str("Yes ", "yes").is_success
for call in (lambda: g.convert_messages_to_gemini([AgentResponse(content="x")]),
             lambda: is_similar_str("a", "b"), EndCallTool.to_gemini_tool):
    try:
        call()
    except ImportError as exc:
        assert "google-genai" in str(exc), exc
    else:
        raise AssertionError("no ImportError")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# --- OpenAI ----------------------------------------------------------------------------------------


def _response(output: list[dict[str, Any]]) -> Response:
    return Response.model_validate(
        {
            "id": "resp_1",
            "created_at": 0,
            "model": "gpt-test",
            "object": "response",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
        }
    )


MIXED = [
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": "Let me check. ", "annotations": []},
            {"type": "refusal", "refusal": "I can't share that."},
        ],
    },
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "lookup", "arguments": '{"q": 2}'},
]


def test_text_and_tool_calls_come_out_of_a_response() -> None:
    response = _response(MIXED)
    assert extract_text_from_response(response) == "Let me check. I can't share that."
    assert has_tool_calls(response) and not has_tool_calls(_response(MIXED[:1]))
    (call,) = extract_tool_calls_from_response(response)
    assert isinstance(call, ToolCall)
    assert (call.tool_name, call.tool_args, call.tool_call_id) == ("lookup", {"q": 2}, "fc_1")
    assert call.raw_response == MIXED[1]  # what the model sent, ready to be sent back


def test_convert_messages_to_openai() -> None:
    (call,) = extract_tool_calls_from_response(_response(MIXED))
    events: list[Event] = [
        UserTranscriptionReceived(content="look it up"),
        call,
        ToolResult(tool_name="lookup", result={"found": True}, tool_call_id="call_1"),
        ToolCall(tool_name="no_raw"),  # nothing to replay
        ToolResult(tool_name="no_id", result=1),  # nothing to pair it with
        AgentResponse(content="Found it."),
        CustomReceived(metadata={"x": 1}),
    ]
    assert convert_messages_to_openai(events) == [
        {"role": "user", "content": "look it up"},
        MIXED[1],
        {"type": "function_call_output", "call_id": "call_1", "output": '{"found": true}'},
        {"role": "assistant", "content": "Found it."},
    ]
    custom = convert_messages_to_openai(events[-1:], {CustomReceived: lambda e: {"role": "developer"}})
    assert custom == [{"role": "developer"}]


# --- timing logs -----------------------------------------------------------------------------------


def _logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "bargein.line.utils.log_aiter"]


async def test_log_afunc(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bargein.line.utils.log_aiter")

    @log_afunc(log_result=True, message="lookup")
    async def lookup(x: int) -> int:
        return x * 2

    assert await lookup(21) == 42
    assert lookup.__name__ == "lookup"
    start, end, result = _logged(caplog)
    assert start == "[START FUNC] lookup"
    assert end.startswith("[END FUNC] lookup. elapsed_time=") and result == "[RESULT FUNC] lookup. result=42"


async def test_log_aiter_func_logs_first_item_and_a_summary_however_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="bargein.line.utils.log_aiter")

    @log_aiter_func(show_each=True)
    async def words(n: int) -> AsyncIterator[str]:
        for i in range(n):
            yield str(i)

    assert [w async for w in words(3)] == ["0", "1", "2"]
    start, first, end = _logged(caplog)
    assert start == "[START ITER] words" and first.startswith("[FIRST_ITEM ITER] words. time_to_first_item=")
    assert "items_yielded_count=3" in end and "iter_timings=[0.0, 0.0, 0.0]" in end

    caplog.clear()

    @log_aiter_func(message="failing")
    async def failing() -> AsyncIterator[int]:
        yield 1
        raise RuntimeError("model went away")

    with pytest.raises(RuntimeError):
        async for _ in failing():
            pass
    logged = _logged(caplog)
    assert any(m.startswith("[ERROR] failing. model went away") for m in logged)
    assert "items_yielded_count=1" in logged[-1] and "iter_timings=[]" in logged[-1]


def test_context_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bargein.line.utils.log_aiter")
    with context_log("warm up"):
        pass
    with pytest.raises(KeyError), context_log("lookup"):
        raise KeyError("x")
    logged = _logged(caplog)
    assert logged[0] == "[START] warm up" and logged[1].startswith("[EXIT] warm up. duration=")
    assert logged[2] == "[START] lookup" and logged[3].startswith("[ERROR] lookup. duration=")
    assert logged[4].startswith("[EXIT] lookup.")


def test_an_answer_that_said_nothing_is_not_sent_to_the_model() -> None:
    # bargein keeps an empty AgentResponse where a turn produced nothing; Line stored nothing there
    events = [
        UserTranscriptionReceived(content="hi"),
        AgentResponse(content=""),
        UserTranscriptionReceived(content="?"),
    ]
    assert [c.role for c in convert_messages_to_gemini(events)] == ["user", "user"]
    assert [m["role"] for m in convert_messages_to_openai(events)] == ["user", "user"]
