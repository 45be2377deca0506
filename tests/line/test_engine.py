"""Line's in-process engine (``Bus``, ``Bridge.handle_event``, ``RouteHandler``, event aliases) and
the Line semantics a route keeps when bargein's runtime runs it.

Line's own test suite runs against these classes in the peer tier (``tests/peers``); these are our
cases: each behaviour an agent depends on, and the places where bargein fixes Line on purpose.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from bargein.line import Bridge, Bus, ConversationContext, Message, Node, ReasoningNode, VoiceAgentSystem
from bargein.line.events import (
    AgentResponse,
    AgentSpeechSent,
    DTMFInputEvent,
    EventsRegistry,
    LogMetric,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.line.routes import RouteState
from bargein.testing import LocalSession
from bargein.voice.espeak import EspeakSynthesizer
from bargein.voice.speaker import Voice

from . import Speaker, ask, chunks, line_agent, text_of, wait_for


class Ping(BaseModel):  # a plain pydantic model, as Line's events were
    n: int = 0


class Pong(BaseModel):
    n: int = 0


@pytest.fixture
def aliases() -> Iterator[None]:
    yield
    EventsRegistry.events.clear()


async def test_a_bus_hands_each_message_to_every_bridge_whose_routes_take_it() -> None:
    seen: dict[str, list[int]] = {"a": [], "b": []}
    a, b = Bridge("a"), Bridge("b")
    a.on(Ping).map(lambda m: seen["a"].append(m.event.n))
    b.on(Pong).map(lambda m: seen["b"].append(m.event.n))
    bus = Bus()
    bus.register_bridge("a", a)
    bus.register_bridge("b", b)
    await bus.start()
    try:
        await bus.broadcast(Message(source="test", event=Ping(n=1)))
        await bus.broadcast(Message(source="test", event=Pong(n=2)))
        await wait_for(lambda: seen == {"a": [1], "b": [2]})
    finally:
        await bus.cleanup()
    assert a.bus is bus and not bus.running


async def test_a_route_broadcasts_through_the_bus_to_another_bridge() -> None:
    got: list[int] = []
    first, second = Bridge("first"), Bridge("second")
    first.on(Ping).map(lambda m: Pong(n=m.event.n + 1)).broadcast()
    second.on(Pong, source="first").map(lambda m: got.append(m.event.n))
    bus = Bus()
    for name, bridge in (("first", first), ("second", second)):
        bus.register_bridge(name, bridge)
    await bus.start()
    try:
        await bus.broadcast(Message(source="test", event=Ping(n=41)))
        await wait_for(lambda: got == [42])
    finally:
        await bus.cleanup()


async def test_string_patterns_match_aliases_of_the_exact_class(aliases: None) -> None:
    class SubPing(Ping):
        pass

    EventsRegistry.register("game.ping", Ping)
    with pytest.raises(ValueError):
        EventsRegistry.register("again", Ping)
    bridge = Bridge("n")
    hits: list[str] = []
    bridge.on("game.*").map(lambda m: hits.append("glob"))
    bridge.on("*").map(lambda m: hits.append("any"))
    await bridge.handle_event(Message(source="t", event=Ping()))
    assert sorted(hits) == ["any", "glob"]
    hits.clear()
    await bridge.handle_event(Message(source="t", event=SubPing()))  # its own class has no alias
    assert hits == ["any"]


async def test_an_interrupt_cancels_the_running_task_then_awaits_an_async_handler() -> None:
    # Line called an async handler and dropped its coroutine; bargein awaits it
    bridge = Bridge("n")
    events: list[str] = []
    started = asyncio.Event()

    async def slow(message: Message) -> None:
        started.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise

    async def handler(message: Message) -> None:
        await asyncio.sleep(0)
        events.append(f"handled {type(message.event).__name__}")

    bridge.on(Ping).interrupt_on([UserStartedSpeaking, Pong], handler=handler).map(slow)
    run = asyncio.create_task(bridge.handle_event(Message(source="t", event=Ping())))
    await started.wait()
    await bridge.handle_event(Message(source="t", event=Pong()))  # a list of interrupts (Line: TypeError)
    await run
    cut = bridge.routes[Ping][0]  # the interrupted route's handler holds the interrupt's unwinding
    assert cut._task_cancel_all_tasks is not None
    await cut._task_cancel_all_tasks  # the handler runs once the task has unwound
    assert events == ["cancelled", "handled Pong"]


async def test_suspend_stops_new_runs_until_resume() -> None:
    bridge = Bridge("n")
    ran: list[int] = []
    route = (
        bridge.on(Ping).suspend_on(UserStartedSpeaking).resume_on(Pong).map(lambda m: ran.append(m.event.n))
    )
    await bridge.handle_event(Message(source="t", event=Ping(n=1)))
    await bridge.handle_event(Message(source="t", event=UserStartedSpeaking()))
    assert route.route_config.state is RouteState.SUSPENDED
    await bridge.handle_event(Message(source="t", event=Ping(n=2)))
    await bridge.handle_event(Message(source="t", event=Pong()))
    await bridge.handle_event(Message(source="t", event=Ping(n=3)))
    assert ran == [1, 3]


async def test_message_filters_id_and_timestamp_are_applied() -> None:
    # Line stored id= and timestamp= and never looked at them
    bridge = Bridge("n")
    hits: list[str] = []
    bridge.on(Ping, id=lambda i: i.startswith("keep")).map(lambda m: hits.append(m.id))
    bridge.on(Ping, timestamp=lambda t: t > 100).map(lambda m: hits.append("late"))
    await bridge.handle_event(Message(source="t", event=Ping(), id="keep-1", timestamp=1))
    await bridge.handle_event(Message(source="t", event=Ping(), id="drop-2", timestamp=200))
    assert sorted(hits) == ["keep-1", "late"]


# --- the same routes on bargein's runtime -------------------------------------------------------


async def test_on_the_runtime_a_map_that_returns_none_passes_it_on() -> None:
    # Line passed None on (a broadcast then says nothing); a route after a side-effect map must run
    seen: list[Any] = []

    def build(system: VoiceAgentSystem) -> None:
        node = Node(node_id="n")
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived).map(lambda m: seen.append(m.event.content)).map(
            lambda value: seen.append(value)
        ).broadcast()
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as session:
        await session.emit(UserTranscriptionReceived(content="hello"))
        await wait_for(lambda: len(seen) == 2)
        assert await session.quiet(0.1) == []  # the None at the end was not broadcast (nor an error)
    assert seen == ["hello", None]


async def test_on_the_runtime_stream_takes_a_function_that_returns_a_list() -> None:
    def build(system: VoiceAgentSystem) -> None:
        node = Node(node_id="n")
        bridge = Bridge(node)
        bridge.on(DTMFInputEvent).stream(
            lambda m: [AgentResponse(content=f"you pressed {m.event.button}"), AgentResponse(content=".")]
        ).broadcast()
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as session:
        await session.emit(DTMFInputEvent(button="5"))
        first, second = await session.next(), await session.next()
    assert [first.content, second.content] == ["you pressed 5", "."]  # type: ignore[attr-defined]


async def test_line_control_routes_are_not_run_by_the_runtime() -> None:
    bridge = Bridge("n")
    bridge.on(Ping).interrupt_on(UserStartedSpeaking).map(lambda m: m)
    assert len(bridge.routes[UserStartedSpeaking]) == 1  # Line's control route, for Line's engine
    assert [r.interrupts[0].types for r in bridge.routes_to_run()] == [(UserStartedSpeaking,)]


class Leads(BaseModel):  # a Line agent's own event: a plain model one bridge broadcasts to another
    name: str
    score: int = 0


async def test_a_plain_pydantic_event_goes_from_one_bridge_to_another_and_survives_a_checkpoint() -> None:
    # sales_with_leads: leads_bridge broadcasts LeadsAnalysis, conversation_bridge.on(LeadsAnalysis)
    # .map(chat_node.add_event); on Line these were plain BaseModels, and bridge.on refused them here
    nodes: dict[str, Any] = {}

    def build(system: VoiceAgentSystem) -> None:
        chat = ReasoningNode(node_id="chat")
        leads = Node(node_id="leads")
        chat_bridge, leads_bridge = Bridge(chat), Bridge(leads)
        leads_bridge.on(UserTranscriptionReceived).map(
            lambda m: Leads(name=m.event.content, score=7)
        ).broadcast()
        chat_bridge.on(Leads).map(chat.add_event)
        system.with_speaking_node(chat, chat_bridge)
        system.with_node(leads, leads_bridge)
        nodes["chat"] = chat

    async with LocalSession(line_agent(build)) as session:
        await session.emit(UserTranscriptionReceived(content="Ada"))
        await wait_for(lambda: Leads(name="Ada", score=7) in nodes["chat"].conversation_events)
        assert await session.quiet(0.1) == []  # the caller is not sent the agents' own events
        await session.restart()  # a fresh owner, built again, state from the checkpoint
        restored = next(n for n in session.nodes if n.id == "chat")
        assert Leads(name="Ada", score=7) in restored.conversation_events  # type: ignore[attr-defined]


async def test_a_route_on_a_list_of_events_runs_once_per_event_in_process_and_on_the_runtime() -> None:
    class SubPing(Ping):
        pass

    ran: list[str] = []
    bridge = Bridge("n")
    bridge.on([Ping, SubPing]).map(lambda m: ran.append(type(m.event).__name__))
    await bridge.handle_event(Message(source="t", event=SubPing()))  # matches both: one run
    assert ran == ["SubPing"]

    seen: list[str] = []

    def build(system: VoiceAgentSystem) -> None:
        node = Node(node_id="n")
        line_bridge = Bridge(node)
        line_bridge.on([DTMFInputEvent, UserTranscriptionReceived]).map(
            lambda m: seen.append(type(m.event).__name__)
        )
        system.with_speaking_node(node, line_bridge)

    async with LocalSession(line_agent(build)) as session:
        await session.emit(DTMFInputEvent(button="1"))
        await session.emit(UserTranscriptionReceived(content="x"))
        await wait_for(lambda: len(seen) == 2)
    assert seen == ["DTMFInputEvent", "UserTranscriptionReceived"]


def committing_agent(nodes: list[Speaker], words: str, *, delay: float) -> Callable[[VoiceAgentSystem], None]:
    """A Line agent as every Line example is: AgentSpeechSent into its history (what it commits to),
    an interruptible answer of ``words``; each node built is appended to ``nodes``."""

    def build(system: VoiceAgentSystem) -> None:
        node = Speaker(words=words, delay=delay)
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived).map(node.add_event)
        bridge.on(AgentSpeechSent).map(node.add_event)
        (
            bridge.on(UserStoppedSpeaking)
            .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate)
            .stream(node.generate)
            .broadcast()
        )
        system.with_speaking_node(node, bridge)
        nodes.append(node)

    return build


async def test_agent_speech_sent_tells_a_line_agent_what_the_caller_was_sent() -> None:
    # every Line example routes AgentSpeechSent into its history and builds its prompt from
    # get_committed_events(); bargein's edge reports delivery, and the runtime turns it into this
    nodes: list[Speaker] = []
    build = committing_agent(nodes, "alpha beta gamma delta epsilon zeta", delay=0.03)

    async with LocalSession(line_agent(build)) as session:
        await ask(session, "first")
        assert text_of(await session.collect_turn()) == "alpha beta gamma delta epsilon zeta"
        await ask(session, "second")
        heard = await chunks(session, 2)
        await session.emit(UserStartedSpeaking())
        await wait_for(lambda: nodes[0].cancelled == 1)
        node = nodes[0]

        def spoken() -> list[str]:
            return [e.content for e in node.conversation_events if isinstance(e, AgentSpeechSent)]

        await wait_for(lambda: "".join(spoken()).endswith(heard))
        committed = ConversationContext(node.conversation_events, "").get_committed_events()
    assert [type(e).__name__ for e in committed] == [
        "UserTranscriptionReceived",
        "AgentResponse",
        "UserTranscriptionReceived",
        "AgentResponse",
    ]
    assert committed[1].content == "alpha beta gamma delta epsilon zeta"  # type: ignore[attr-defined]
    assert committed[3].content == heard.rstrip()  # type: ignore[attr-defined]  # Line commits to the last word


async def test_with_the_agents_voice_agent_speech_sent_is_what_was_played_to_the_word() -> None:
    """A caller who hears the agent (the in-process edge with a voice): the answer's text is complete
    at once, its voice takes seconds; cut off a second in, the agent is told exactly the words played."""
    nodes: list[Speaker] = []
    said = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
    build = committing_agent(nodes, said, delay=0.001)
    voice = Voice(EspeakSynthesizer())
    async with LocalSession(line_agent(build), voice=voice) as session:
        await ask(session, "first")
        assert text_of(await session.collect_turn()) == said  # all of the text: the voice has just begun
        await wait_for(lambda: voice.player.played >= 1.2 * 16_000, timeout=10)
        await session.emit(UserStartedSpeaking())
        await session.barge_in()  # the caller talks over the voice of a finished answer
        node = nodes[0]

        def spoken() -> str:
            return "".join(e.content for e in node.conversation_events if isinstance(e, AgentSpeechSent))

        await wait_for(lambda: bool(spoken()))
        await asyncio.sleep(0.3)
        heard = spoken()
        committed = ConversationContext(node.conversation_events, "").get_committed_events()
    words = heard.split()
    assert 1 <= len(words) < len(said.split()) and heard.strip() == " ".join(said.split()[: len(words)])
    assert committed[-1].content == heard.strip()  # type: ignore[attr-defined]


async def test_a_debouncing_map_sees_the_next_key_press_while_it_waits() -> None:
    # dtmf_storyteller: on(DTMFInputEvent).map(on_dtmf_event) sleeps, then answers only if no newer
    # key came meanwhile; Line ran each message as a task of its own, so two quick presses gave one
    # answer (here they were taken one after the other, and gave two)
    class KeysDone(BaseModel):
        buttons: str

    answers: list[str] = []

    def build(system: VoiceAgentSystem) -> None:
        node = Node(node_id="keys")
        bridge = Bridge(node)
        state: dict[str, Any] = {"latest": None, "buttons": ""}

        async def debounce(message: Message) -> KeysDone | None:
            state["latest"] = message.id
            state["buttons"] += message.event.button
            await asyncio.sleep(0.3)
            if state["latest"] != message.id:
                return None  # another key came: that one answers
            done, state["buttons"] = KeysDone(buttons=state["buttons"]), ""
            return done

        bridge.on(DTMFInputEvent).map(debounce).broadcast()
        bridge.on(KeysDone).map(lambda m: answers.append(m.event.buttons))
        system.with_speaking_node(node, bridge)

    async def press_later(session: LocalSession, button: str, delay: float) -> None:
        await asyncio.sleep(delay)
        await session.emit(DTMFInputEvent(button=button))

    async with LocalSession(line_agent(build)) as session:
        await asyncio.gather(press_later(session, "1", 0), press_later(session, "2", 0.05))
        await asyncio.sleep(0.5)
    assert answers == ["12"]


async def test_clearing_the_history_mid_answer_keeps_only_what_comes_after() -> None:
    # form-filling yields a LogMetric, clears its context, then asks the next question: on Line the
    # history then held the question only
    nodes: list[ReasoningNode] = []

    class Form(ReasoningNode):
        async def process_context(self, context: ConversationContext) -> Any:
            yield LogMetric(name="answered", value=1)
            self.clear_context()
            yield AgentResponse(content="Next question?")

    def build(system: VoiceAgentSystem) -> None:
        node = Form(node_id="form")
        bridge = Bridge(node)
        bridge.on(UserTranscriptionReceived).map(node.add_event)
        bridge.on(UserStoppedSpeaking).stream(node.generate).broadcast()
        system.with_speaking_node(node, bridge)
        nodes.append(node)

    async with LocalSession(line_agent(build)) as session:
        await ask(session, "my answer")
        await session.collect_turn()
    assert nodes[0].conversation_events == [AgentResponse(content="Next question?")]


async def test_a_node_that_keeps_its_own_object_in_self_context_keeps_it() -> None:
    # personal_banking_handoffs: self.context = BankContext() in the node's __init__, read in
    # process_context; bargein overwrote it with the generation's ConversationContext every turn
    class Bank(BaseModel):
        verified: bool = False

    seen: list[Any] = []

    class Teller(ReasoningNode):
        def __init__(self) -> None:
            super().__init__(node_id="teller")
            self.context = Bank()  # type: ignore[assignment]

        async def process_context(self, context: ConversationContext) -> Any:
            seen.append(self.context)
            self.context.verified = True  # type: ignore[attr-defined]
            yield AgentResponse(content="ok")

    def build(system: VoiceAgentSystem) -> None:
        node = Teller()
        bridge = Bridge(node)
        bridge.on(UserStoppedSpeaking).stream(node.generate).broadcast()
        system.with_speaking_node(node, bridge)

    async with LocalSession(line_agent(build)) as session:
        for _ in range(2):
            await ask(session, "balance")
            await session.collect_turn()
    assert [type(c).__name__ for c in seen] == ["Bank", "Bank"] and seen[1].verified


async def test_what_a_test_drains_with_quiet_counts_as_heard() -> None:
    nodes: list[Speaker] = []

    def build(system: VoiceAgentSystem) -> None:
        node = Speaker(words=" ".join(f"w{i}" for i in range(40)), delay=0.02)
        bridge = Bridge(node)
        bridge.on(UserStoppedSpeaking).interrupt_on(UserStartedSpeaking).stream(node.generate).broadcast()
        system.with_speaking_node(node, bridge)
        nodes.append(node)

    async with LocalSession(line_agent(build)) as session:
        await ask(session, "go")
        drained = text_of(await session.quiet(0.2))
        await session.emit(UserStartedSpeaking())
        await wait_for(lambda: nodes[0].cancelled == 1)
        await session.quiet(0.1)
    assert drained and text_of(nodes[0].conversation_events) == drained
