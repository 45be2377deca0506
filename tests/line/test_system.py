"""Line's call wiring on bargein: ``handle_new_call(system, call_request)``, the speaking node and
background nodes, ``send_initial_message`` (once per session, across owners), ``EndCall`` from the
agent, and ``VoiceAgentApp``."""

from __future__ import annotations

import asyncio
import io
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bargein.errors import BargeinError
from bargein.examples import line_counter, line_echo
from bargein.line import (
    Bridge,
    CallRequest,
    Node,
    PreCallResult,
    VoiceAgentApp,
    VoiceAgentSystem,
)
from bargein.line.events import (
    AgentGenerationComplete,
    AgentResponse,
    CustomReceived,
    EndCall,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.testing import LocalSession

from . import Speaker, ask, line_agent, text_of, wait_for


async def test_handle_new_call_gets_the_session_id_and_the_start_options() -> None:
    requests: list[CallRequest] = []
    systems: list[VoiceAgentSystem] = []

    async def handle_new_call(system: VoiceAgentSystem, call_request: CallRequest) -> None:
        requests.append(call_request)
        systems.append(system)
        node = Node(node_id="n")
        system.with_speaking_node(node, Bridge(node))
        await system.start()
        await system.wait_for_shutdown()

    async with LocalSession(handle_new_call, options={"voice": "calm", "turns": 2}) as s:
        await wait_for(lambda: len(requests) == 1)
        request = requests[0]
        assert request.call_id == s.session_id == request.session_id
        assert request.options == {"voice": "calm", "turns": 2}
        assert isinstance(systems[0], VoiceAgentSystem)


async def test_call_request_has_lines_fields_taken_from_the_start_options() -> None:
    """Line's ``CallRequest`` carried ``from_``, ``to``, ``agent_call_id``, ``agent.system_prompt``,
    ``agent.introduction`` and ``metadata`` (Line's configurable example reads ``call_request.agent``);
    a session start carries them as options under the request body's keys."""
    requests: list[CallRequest] = []

    async def handle_new_call(system: VoiceAgentSystem, call_request: CallRequest) -> None:
        requests.append(call_request)
        await line_echo.handle_new_call(system, call_request)

    options = {
        "from": "+15550100",
        "to": "+15550199",
        "agent_call_id": "ac-1",
        "agent": {"system_prompt": "Be a pirate.", "introduction": "Ahoy!"},
        "metadata": {"crm_id": 7},
    }
    async with LocalSession(handle_new_call, options=options):
        await wait_for(lambda: len(requests) == 1)
    request: Any = requests[0]
    assert (request.from_, request.to, request.agent_call_id) == ("+15550100", "+15550199", "ac-1")
    assert (request.agent.system_prompt, request.agent.introduction) == ("Be a pirate.", "Ahoy!")
    assert request.metadata == {"crm_id": 7}


async def test_code_after_wait_for_shutdown_runs_when_the_session_ends() -> None:
    after: list[str] = []

    async def handle_new_call(system: VoiceAgentSystem, call_request: CallRequest) -> None:
        node = Node(node_id="n")
        system.with_speaking_node(node, Bridge(node))
        await system.start()
        try:
            await system.wait_for_shutdown()
        finally:
            after.append("cleaned up")  # Line's examples clean up here

    async with LocalSession(handle_new_call):
        await wait_for(lambda: True)
        assert after == []
    assert after == ["cleaned up"]


async def test_only_the_speaking_node_reaches_the_caller_and_background_broadcasts_reach_bridges() -> None:
    speaker = Speaker("answer for you", delay=0.001, node_id="speaker")
    insights: list[tuple[str, dict[str, Any]]] = []

    def build(system: VoiceAgentSystem) -> None:
        bridge = Bridge(speaker)
        bridge.on(UserTranscriptionReceived).map(speaker.add_event)
        bridge.on(CustomReceived).map(lambda m: insights.append((m.source, m.event.metadata)))
        bridge.on(UserStoppedSpeaking).stream(speaker.generate).broadcast()
        system.with_speaking_node(speaker, bridge)

        background = Speaker("background words never heard", delay=0.001, node_id="background")
        background_bridge = Bridge(background)
        background_bridge.on(UserTranscriptionReceived).map(background.add_event)
        background_bridge.on(UserStoppedSpeaking).stream(background.generate).broadcast()
        background_bridge.on(UserTranscriptionReceived).map(
            lambda m: CustomReceived(metadata={"length": len(m.event.content)})
        ).broadcast()
        system.with_node(background, background_bridge)

    async with LocalSession(line_agent(build)) as s:
        await ask(s, "hello")
        assert text_of(await s.collect_turn()) == "answer for you"
        await wait_for(lambda: len(insights) == 1)
        assert await s.quiet(0.2) == []
        assert {env.source for env, _ in s.received} == {"speaker"}
    assert insights == [("background", {"length": 5})]


class Noting(Speaker):
    """Between its words, broadcasts an event of its own, which only the session's bridges hear."""

    async def process_context(self, context: Any) -> AsyncIterator[Any]:
        for word in ("one ", "two ", "three"):
            yield AgentResponse(content=word)
            yield CustomReceived(metadata={"after": word})


async def test_what_the_caller_gets_of_a_turn_is_numbered_without_gaps() -> None:
    """The edge takes a missing number for a lost message and asks for it again: an event the
    speaking node broadcasts to the bridges only must not use up a number the caller never sees."""
    noting = Noting(node_id="speaker")

    def build(system: VoiceAgentSystem) -> None:
        bridge = Bridge(noting)
        bridge.on(UserStoppedSpeaking).stream(noting.generate).broadcast()
        system.with_speaking_node(noting, bridge)

    async with LocalSession(line_agent(build)) as s:
        await ask(s, "hello")
        assert text_of(await s.collect_turn()) == "one two three"
        turn = s.received[-1][0].turn
        assert [e.seq for e, _ in s.received if e.turn == turn] == [0, 1, 2, 3]


async def test_the_initial_message_is_sent_once_even_when_another_owner_runs_handle_new_call() -> None:
    starts: list[str] = []

    async def handle_new_call(system: VoiceAgentSystem, call_request: CallRequest) -> None:
        starts.append(call_request.call_id)
        await line_counter.handle_new_call(system, call_request)

    async with LocalSession(handle_new_call, options={"turns": 5}) as s:
        greeting = await s.collect_turn()
        assert greeting == [AgentResponse(content=line_counter.greeting(5)), AgentGenerationComplete()]
        await ask(s, "one")
        assert text_of(await s.collect_turn()) == "That was turn 1."
        await s.restart()  # a graceful hand-over: a new owner runs handle_new_call again
        await s.crash()  # and one that takes over from a dead owner
        assert await s.quiet(0.3) == []  # no second greeting
        assert len(starts) == 3
        await ask(s, "two")
        assert text_of(await s.collect_turn()) == "That was turn 2."  # the count survived too
        node = s.nodes[0]
        assert isinstance(node, line_counter.CounterNode)
        greetings = [
            e for e in node.conversation_events if e == AgentResponse(content=line_counter.greeting(5))
        ]
        assert greetings == [AgentResponse(content=line_counter.greeting(5))]  # in the history, once


async def test_end_call_from_the_agent_comes_after_its_last_chunk() -> None:
    async with LocalSession(line_counter.handle_new_call, options={"turns": 1, "word_delay": 0.005}) as s:
        await s.collect_turn()  # the greeting
        await ask(s, "only turn")
        events = [await s.next() for _ in range(7)]
        assert text_of(events) == "That was turn 1. Goodbye!"
        end = next(i for i, e in enumerate(events) if isinstance(e, EndCall))
        last_chunk = max(i for i, e in enumerate(events) if isinstance(e, AgentResponse))
        assert end == last_chunk + 1
        order = [(env.turn, env.seq) for env, _ in s.received]
        assert order == sorted(order)  # one ordered stream: the edge cannot see EndCall first


async def test_end_call_from_the_agent_ends_the_session_once_delivered() -> None:
    """The edge ends the session after it has handed out the agent's EndCall (and so every chunk
    before it): the owner closes the session and forgets it."""
    async with LocalSession(line_counter.handle_new_call, options={"turns": 1}) as s:
        await s.collect_turn()
        await ask(s, "bye")
        while not isinstance(await s.next(), EndCall):
            pass
        await wait_for(lambda: s.host is not None and s.session_id not in s.host.sessions, timeout=5)


# --- VoiceAgentApp --------------------------------------------------------------------------------


async def test_voice_agent_app_is_itself_a_runnable_agent() -> None:
    async with LocalSession(line_echo.app) as s:
        await ask(s, "app mode")
        assert text_of(await s.collect_turn()) == "You said: app mode"


async def test_pre_call_handler_metadata_reaches_handle_new_call() -> None:
    seen: list[dict[str, Any]] = []

    async def pre_call(request: CallRequest) -> PreCallResult:
        return PreCallResult(metadata={"tier": "gold"}, config={"voice": "x"})

    async def handle_new_call(system: VoiceAgentSystem, call_request: CallRequest) -> None:
        seen.append(dict(call_request.metadata))
        await line_echo.handle_new_call(system, call_request)

    async with LocalSession(VoiceAgentApp(handle_new_call, pre_call_handler=pre_call)) as s:
        await ask(s, "hi")
        assert text_of(await s.collect_turn()) == "You said: hi"
    assert seen == [{"tier": "gold"}]


async def test_pre_call_handler_returning_none_rejects_the_call() -> None:
    async def reject(request: CallRequest) -> None:
        return None

    with pytest.raises(BargeinError, match="rejected"):
        async with LocalSession(VoiceAgentApp(line_echo.handle_new_call, pre_call_handler=reject)):
            pass


async def test_chat_runs_a_text_conversation_until_the_agent_ends_the_call() -> None:
    out = io.StringIO()

    async def lines() -> AsyncIterator[str]:
        yield "first\n"
        await wait_for(lambda: "turn 1." in out.getvalue())
        yield "\n"  # a blank line is no turn
        yield "second\n"
        await asyncio.Event().wait()  # the caller stays on the line: the agent hangs up

    await VoiceAgentApp(line_counter.handle_new_call).chat(lines(), out, options={"turns": 2})
    assert out.getvalue() == (
        line_counter.greeting(2)
        + "\nThat was turn 1.\nThat was turn 2. Goodbye!\n[the agent ended the call]\n"
    )


async def test_chat_hangs_up_once_the_input_ends_and_the_agent_is_quiet() -> None:
    out = io.StringIO()

    async def lines() -> AsyncIterator[str]:
        for text in ("one", "two"):  # piped input: every line at once
            yield text

    await VoiceAgentApp(line_echo.handle_new_call).chat(lines(), out, quiet_s=0.2)
    last = out.getvalue().splitlines()[-1]
    assert last.startswith("You said: ") and last.endswith("two")  # answered before hanging up


def test_run_talks_over_stdin_and_stdout(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello there\n"))
    line_echo.app.run()
    captured = capsys.readouterr()
    assert captured.out == "You said: hello there\n"
    assert "serves no HTTP" in captured.err and "BARGEIN_AGENT=" in captured.err
