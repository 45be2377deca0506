"""The route DSL: wrong declarations fail when declared (RouteError, a TypeError), every accepted form
of handler/condition/stream works, and map/filter/stream/broadcast behave as documented when run by a
real session (LocalSession on the in-memory transport)."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from bargein.agent.events import (
    AgentError,
    AgentHandoff,
    AgentResponse,
    EmergencyStop,
    Event,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.message import Message
from bargein.agent.nodes import Node
from bargein.agent.routes import Bridge, Route
from bargein.errors import RouteError
from bargein.testing import LocalSession
from bargein.wire.envelope import Envelope
from bargein.wire.session_info import SessionInfo

pytestmark = pytest.mark.timeout(60)

T = 5.0  # generous wait for each output; the happy path takes milliseconds


class DslTestPing(Event):
    n: int = 0


class DslTestPong(Event):
    n: int = 0


def new_route(event: Any = UserStoppedSpeaking) -> Route:
    return Bridge(Node()).on(event)


def says(text: str) -> UserTranscriptionReceived:
    return UserTranscriptionReceived(content=text)


def reply(text: str) -> AgentResponse:
    return AgentResponse(content=text)


def agent_of(build: Callable[[Bridge], Any]) -> Callable[[SessionInfo], Bridge]:
    """An agent whose single bridge is configured by ``build``."""

    def agent(session: SessionInfo) -> Bridge:
        bridge = Bridge(Node())
        build(bridge)
        return bridge

    return agent


async def assert_nothing_more(s: LocalSession) -> None:
    assert await s.quiet(0.05) == []


# --------------------------------------------------------------------------------------------------
# declaration errors


def test_route_error_is_a_type_error() -> None:
    assert issubclass(RouteError, TypeError)


def _plain(message: Message) -> list[AgentResponse]:
    return [reply("x")]


async def _async_returning_list(message: Message) -> list[AgentResponse]:
    return [reply("x")]


async def _coroutine(message: Message) -> None:
    return None


@pytest.mark.parametrize(
    "fn",
    [
        _plain,
        _async_returning_list,
        _coroutine,
        lambda m: iter([reply("x")]),
        lambda m: (reply(t) for t in "ab"),
        functools.partial(_plain),
        "not callable",
        None,
        42,
        [reply("x")],
        AgentResponse,
    ],
    ids=[
        "plain-function",
        "async-returning-list",
        "coroutine",
        "lambda-returning-iterator",
        "lambda-returning-genexp",
        "partial-of-plain",
        "str",
        "None",
        "int",
        "list",
        "event-class",
    ],
)
def test_stream_of_a_non_generator_fails_at_declaration(fn: Any) -> None:
    route = new_route()
    with pytest.raises(RouteError, match=r"\.stream\(\) needs a generator function"):
        route.stream(fn)
    assert route.steps == []  # nothing was half-recorded


def test_stream_of_a_generator_with_two_required_args_fails() -> None:
    async def gen(a: Any, b: Any) -> AsyncIterator[Event]:
        yield reply("x")

    with pytest.raises(RouteError, match="stream"):
        new_route().stream(gen)


def _two_args(a: Any, b: Any) -> None:
    return None


async def _async_two_args(a: Any, b: Any) -> None:
    return None


@pytest.mark.parametrize("fn", [_two_args, _async_two_args, lambda a, b: None, lambda *, kw: None])
@pytest.mark.parametrize("method", ["interrupt_on", "suspend_on", "resume_on"])
def test_handler_with_two_required_args_fails_at_declaration(fn: Any, method: str) -> None:
    route = new_route()
    with pytest.raises(RouteError, match=r"handler .*must take one argument \(the message\) or none"):
        getattr(route, method)(UserStartedSpeaking, handler=fn)
    assert (route.interrupts, route.suspends, route.resumes) == ([], [], [])


@pytest.mark.parametrize("kw", ["condition", "filter_fn"])
@pytest.mark.parametrize("fn", [_two_args, _async_two_args, lambda a, b: True])
def test_condition_with_two_required_args_fails_at_declaration(fn: Any, kw: str) -> None:
    with pytest.raises(RouteError, match=r"interrupt condition .*must take"):
        new_route().interrupt_on(UserStartedSpeaking, **{kw: fn})


@pytest.mark.parametrize("what", ["handler", "condition"])
def test_non_callable_handler_or_condition_fails(what: str) -> None:
    with pytest.raises(RouteError, match="must be callable"):
        new_route().interrupt_on(UserStartedSpeaking, **{what: "nope"})


@pytest.mark.parametrize(
    "spec",
    [
        str,
        int,
        object,
        Message,
        AgentResponse(content="an instance, not a type"),
        "UserStartedSpeaking",
        [UserStartedSpeaking, str],
        [UserStartedSpeaking, "EmergencyStop"],
        (EmergencyStop, None),
        [],
        (),
        set(),
        None,
    ],
    ids=repr,
)
def test_interrupt_on_rejects_non_event_types(spec: Any) -> None:
    route = new_route()
    with pytest.raises(RouteError, match="interrupt_on"):
        route.interrupt_on(spec)
    assert route.interrupts == []


def test_interrupt_on_empty_list_message_says_what_is_needed() -> None:
    with pytest.raises(RouteError, match="needs at least one event type"):
        new_route().interrupt_on([])


@pytest.mark.parametrize("spec", [str, dict, "AgentResponse", [AgentResponse, int], [], None, 3])
def test_bridge_on_rejects_non_event_types(spec: Any) -> None:
    bridge = Bridge(Node())
    with pytest.raises(RouteError, match=r"Bridge\.on"):
        bridge.on(spec)
    assert bridge.routes == []


@pytest.mark.parametrize("method", ["suspend_on", "resume_on"])
def test_suspend_and_resume_reject_non_event_types(method: str) -> None:
    with pytest.raises(RouteError, match=method):
        getattr(new_route(), method)(str)


@pytest.mark.parametrize(
    "spec", [str, AgentResponse(content="x"), "AgentResponse", [AgentResponse], (AgentResponse,)], ids=repr
)
def test_broadcast_rejects_anything_but_one_event_type(spec: Any) -> None:
    """``broadcast(event_type=...)`` wraps values in *one* event type; a list cannot be used to wrap, so
    it must fail when declared, not with a TypeError from isinstance() when the route first runs."""
    route = new_route()
    with pytest.raises(RouteError, match="broadcast"):
        route.broadcast(spec)
    assert route.steps == []


@pytest.mark.parametrize("method", ["map", "filter"])
@pytest.mark.parametrize("fn", ["text", None, 3, [len]])
def test_map_and_filter_reject_non_callables(method: str, fn: Any) -> None:
    route = new_route()
    with pytest.raises(RouteError, match=f"{method} must be callable"):
        getattr(route, method)(fn)
    assert route.steps == []


@pytest.mark.parametrize("method", ["map", "filter"])
@pytest.mark.parametrize("fn", [_two_args, lambda: None])
def test_map_and_filter_need_exactly_one_argument(method: str, fn: Any) -> None:
    with pytest.raises(RouteError, match="must take one argument"):
        getattr(new_route(), method)(fn)


def test_bridge_on_filter_with_wrong_arity_fails() -> None:
    with pytest.raises(RouteError, match="filter"):
        Bridge(Node()).on(UserStoppedSpeaking, filter=_two_args)
    with pytest.raises(RouteError, match="filter must be callable"):
        Bridge(Node()).on(UserStoppedSpeaking, filter_fn="yes")


def test_condition_and_filter_fn_together_fail() -> None:
    route = new_route()
    with pytest.raises(RouteError, match="condition= or filter_fn=, not both"):
        route.interrupt_on(UserStartedSpeaking, condition=lambda m: True, filter_fn=lambda m: True)
    assert route.interrupts == []


def test_filter_and_filter_fn_together_fail() -> None:
    bridge = Bridge(Node())
    with pytest.raises(RouteError, match="filter= or filter_fn=, not both"):
        bridge.on(UserStoppedSpeaking, filter=lambda m: True, filter_fn=lambda m: True)
    with pytest.raises(RouteError, match="not both"):
        bridge.on(UserStoppedSpeaking, lambda m: True, filter_fn=lambda m: True)
    assert bridge.routes == []


# --------------------------------------------------------------------------------------------------
# accepted forms


def _sync0() -> None:
    return None


def _sync1(message: Message) -> None:
    return None


async def _async0() -> None:
    return None


async def _async1(message: Message) -> None:
    return None


def _optional_second(message: Message, extra: int = 0) -> None:
    return None


def _varargs(*args: Any) -> None:
    return None


class Handlers:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def sync0(self) -> None:
        self.calls.append("sync0")

    def sync1(self, message: Message) -> None:
        self.calls.append(f"sync1:{type(message.event).__name__}")

    async def async0(self) -> None:
        self.calls.append("async0")

    async def async1(self, message: Message) -> None:
        self.calls.append(f"async1:{type(message.event).__name__}")

    async def agen(self, message: Message) -> AsyncIterator[Event]:
        yield reply("bound method")

    def __call__(self, message: Message) -> None:
        self.calls.append("call")


HANDLER_FORMS: list[Any] = [
    _sync0,
    _sync1,
    _async0,
    _async1,
    _optional_second,
    _varargs,
    lambda: None,
    lambda m: None,
    Handlers().sync0,
    Handlers().async1,
    Handlers(),
    functools.partial(_two_args, 1),
    print,
]


@pytest.mark.parametrize("fn", HANDLER_FORMS, ids=repr)
def test_handler_and_condition_forms_are_accepted(fn: Any) -> None:
    route = new_route().interrupt_on(UserStartedSpeaking, handler=fn, condition=fn)
    route.suspend_on(EmergencyStop, fn).resume_on(AgentHandoff, fn)
    assert route.interrupts[0].handler is fn and route.interrupts[0].condition is fn
    assert route.suspends[0].handler is fn and route.resumes[0].handler is fn


def test_interrupt_on_may_be_called_several_times_and_with_lists() -> None:
    route = (
        new_route()
        .interrupt_on(UserStartedSpeaking)
        .interrupt_on([EmergencyStop, AgentHandoff], handler=_sync0)
        .interrupt_on((DslTestPing,), filter_fn=_async1)
    )
    assert [c.types for c in route.interrupts] == [
        (UserStartedSpeaking,),
        (EmergencyStop, AgentHandoff),
        (DslTestPing,),
    ]
    assert route.interrupts[2].condition is _async1


async def _agen(message: Message) -> AsyncIterator[Event]:
    yield reply("agen")


def _sgen(message: Message) -> Iterator[Event]:
    yield reply("sgen")


async def _agen_prefixed(prefix: str, message: Message) -> AsyncIterator[Event]:
    yield reply(f"{prefix}: {type(message.event).__name__}")


class AsyncGenCallable:
    def __init__(self, text: str) -> None:
        self.text = text

    async def __call__(self, message: Message) -> AsyncIterator[Event]:
        yield reply(self.text)


class SyncGenCallable:
    def __call__(self, message: Message) -> Iterator[Event]:
        yield reply("sync callable")


STREAM_FORMS: list[tuple[str, Any, str]] = [
    ("async-generator-function", _agen, "agen"),
    ("sync-generator-function", _sgen, "sgen"),
    (
        "partial-of-async-generator",
        functools.partial(_agen_prefixed, "partial"),
        "partial: UserStoppedSpeaking",
    ),
    ("nested-partial", functools.partial(functools.partial(_agen_prefixed), "nested"), "nested: "),
    ("bound-async-generator-method", Handlers().agen, "bound method"),
    ("callable-object-async-generator", AsyncGenCallable("callable object"), "callable object"),
    ("callable-object-sync-generator", SyncGenCallable(), "sync callable"),
]


@pytest.mark.parametrize(
    ("fn", "expected"), [(f, e) for _, f, e in STREAM_FORMS], ids=[n for n, _, _ in STREAM_FORMS]
)
async def test_stream_forms_are_accepted_and_run(fn: Any, expected: str) -> None:
    new_route().stream(fn)  # declaration alone is fine
    agent = agent_of(lambda b: b.on(UserStoppedSpeaking).stream(fn).broadcast())
    async with LocalSession(agent) as s:
        await s.emit(UserStoppedSpeaking())
        event = await s.next(timeout=T)
        assert isinstance(event, AgentResponse)
        assert event.content.startswith(expected)
        await assert_nothing_more(s)


async def test_handlers_of_every_form_are_called_with_or_without_the_message() -> None:
    h = Handlers()

    def build(bridge: Bridge) -> None:
        (
            bridge.on(DslTestPing)
            .suspend_on(EmergencyStop, h.sync0)
            .resume_on(AgentHandoff, h.async1)
            .map(lambda m: reply(f"ping {m.event.n}"))
            .broadcast()
        )
        bridge.on(DslTestPong).suspend_on(EmergencyStop, h.async0).resume_on(AgentHandoff, h.sync1)
        bridge.on(DslTestPong).suspend_on(EmergencyStop, h).resume_on(AgentHandoff, h)

    async with LocalSession(agent_of(build)) as s:
        await s.emit(EmergencyStop())
        await s.emit(DslTestPing(n=1))  # suspended: dropped
        await s.emit(AgentHandoff())
        await s.emit(DslTestPing(n=2))
        assert await s.next(timeout=T) == reply("ping 2")
        await assert_nothing_more(s)
        assert sorted(h.calls) == sorted(
            ["sync0", "async0", "call", "async1:AgentHandoff", "sync1:AgentHandoff", "call"]
        )
        assert s.runtime.counters["triggers_while_suspended"] == 1
        assert not any(k.endswith("_errors") for k in s.runtime.counters), s.runtime.counters


# --------------------------------------------------------------------------------------------------
# behaviour in a running session


async def test_map_sync_and_async_then_broadcast() -> None:
    async def shout(text: str) -> str:
        return text.upper() + "!"

    agent = agent_of(
        lambda b: (
            b.on(UserTranscriptionReceived)
            .map(lambda m: m.event.content)
            .map(shout)
            .map(lambda text: reply(text))
            .broadcast()
        )
    )
    async with LocalSession(agent) as s:
        await s.emit(says("hello"))
        await s.emit(says("again"))
        assert await s.next(timeout=T) == reply("HELLO!")
        assert await s.next(timeout=T) == reply("AGAIN!")
        await assert_nothing_more(s)


async def test_filter_step_drops_events() -> None:
    async def not_secret(text: str) -> bool:
        return "secret" not in text

    agent = agent_of(
        lambda b: (
            b.on(UserTranscriptionReceived)
            .filter(lambda m: m.event.content != "drop")
            .map(lambda m: m.event.content)
            .filter(not_secret)
            .map(reply)
            .broadcast()
        )
    )
    async with LocalSession(agent) as s:
        for text in ("one", "drop", "my secret", "two"):
            await s.emit(says(text))
        assert await s.next(timeout=T) == reply("one")
        assert await s.next(timeout=T) == reply("two")
        await assert_nothing_more(s)


async def test_map_returning_none_stops_the_route() -> None:
    later: list[Any] = []

    def record(value: Any) -> AgentResponse:
        later.append(value)
        return reply(str(value))

    agent = agent_of(
        lambda b: (
            b.on(UserTranscriptionReceived)
            .map(lambda m: None if m.event.content == "stop" else m.event.content)
            .map(record)
            .broadcast()
        )
    )
    async with LocalSession(agent) as s:
        await s.emit(says("stop"))
        await s.emit(says("go"))
        assert await s.next(timeout=T) == reply("go")
        await assert_nothing_more(s)
    assert later == ["go"]


async def test_stream_of_a_sync_generator_broadcasts_each_item_in_order() -> None:
    def words(message: Message) -> Iterator[AgentResponse]:
        for word in message.event.content.split():  # type: ignore[attr-defined]
            yield reply(word)

    agent = agent_of(lambda b: b.on(UserTranscriptionReceived).stream(words).broadcast())
    async with LocalSession(agent) as s:
        await s.emit(says("alpha beta gamma delta"))
        got = [await s.next(timeout=T) for _ in range(4)]
        assert got == [reply(w) for w in ("alpha", "beta", "gamma", "delta")]
        await assert_nothing_more(s)


async def test_stream_of_an_async_generator_broadcasts_each_item_in_order() -> None:
    async def count(message: Message) -> AsyncIterator[Event]:
        for i in range(5):
            yield reply(f"chunk {i}")
        yield DslTestPong(n=5)

    agent = agent_of(lambda b: b.on(UserStoppedSpeaking).stream(count).broadcast())
    async with LocalSession(agent) as s:
        await s.emit(UserStoppedSpeaking())
        got = [await s.next(timeout=T) for _ in range(6)]
        assert got == [*(reply(f"chunk {i}") for i in range(5)), DslTestPong(n=5)]
        await assert_nothing_more(s)


async def test_stream_then_map_and_filter_apply_per_item() -> None:
    async def numbers(message: Message) -> AsyncIterator[int]:
        for i in range(6):
            yield i

    agent = agent_of(
        lambda b: (
            b.on(UserStoppedSpeaking)
            .stream(numbers)
            .filter(lambda i: i % 2 == 0)
            .map(lambda i: DslTestPong(n=i * 10))
            .broadcast()
        )
    )
    async with LocalSession(agent) as s:
        await s.emit(UserStoppedSpeaking())
        got = [await s.next(timeout=T) for _ in range(3)]
        assert got == [DslTestPong(n=0), DslTestPong(n=20), DslTestPong(n=40)]
        await assert_nothing_more(s)


async def test_broadcast_event_type_wraps_strings_and_dicts() -> None:
    def values(message: Message) -> Iterator[Any]:
        yield "plain text"
        yield {"content": "from a dict", "chunk_type": "ssml"}
        yield reply("already an event")

    agent = agent_of(lambda b: b.on(UserStoppedSpeaking).stream(values).broadcast(event_type=AgentResponse))
    async with LocalSession(agent) as s:
        await s.emit(UserStoppedSpeaking())
        first, second, third = [await s.next(timeout=T) for _ in range(3)]
        assert first == AgentResponse(content="plain text")
        assert second == AgentResponse(content="from a dict", chunk_type="ssml")
        assert third == reply("already an event")
        await assert_nothing_more(s)


async def test_broadcast_of_a_plain_value_without_event_type_is_a_counted_error() -> None:
    agent = agent_of(
        lambda b: (
            b.on(UserTranscriptionReceived)
            .map(lambda m: m.event.content if m.event.content == "bad" else reply(m.event.content))
            .broadcast()
        )
    )
    async with LocalSession(agent) as s:
        await s.emit(says("bad"))
        await s.emit(says("good"))
        assert await s.next(timeout=T) == reply("good")
        assert s.runtime.counters["route_errors"] == 1
        await assert_nothing_more(s)


@pytest.mark.parametrize(
    "expected", ["yes", lambda content: content.startswith("y")], ids=["literal", "predicate"]
)
async def test_property_filter_with_literal_and_predicate(expected: Any) -> None:
    agent = agent_of(
        lambda b: (
            b.on(UserTranscriptionReceived, content=expected)
            .map(lambda m: reply("matched " + m.event.content))
            .broadcast()
        )
    )
    async with LocalSession(agent) as s:
        await s.emit(says("no"))
        await s.emit(says("nope yes"))
        await s.emit(says("yes"))
        assert await s.next(timeout=T) == reply("matched yes")
        await assert_nothing_more(s)


async def test_property_filters_combine_with_and() -> None:
    agent = agent_of(
        lambda b: (
            b.on(AgentHandoff, target_agent="billing", reason=lambda r: "urgent" in r)
            .map(lambda m: reply(m.event.reason))
            .broadcast()
        )
    )
    async with LocalSession(agent) as s:
        await s.emit(AgentHandoff(target_agent="billing", reason="routine"))
        await s.emit(AgentHandoff(target_agent="support", reason="urgent"))
        await s.emit(AgentHandoff(target_agent="billing", reason="urgent call"))
        assert await s.next(timeout=T) == reply("urgent call")
        await assert_nothing_more(s)


@pytest.mark.parametrize("kw", ["filter", "filter_fn", "positional"])
async def test_on_filter_receives_the_bus_message(kw: str) -> None:
    seen: list[Message] = []

    async def keep(message: Message) -> bool:
        seen.append(message)
        return message.event.content != "skip"  # type: ignore[attr-defined, no-any-return]

    def build(bridge: Bridge) -> None:
        route = (
            bridge.on(UserTranscriptionReceived, keep)
            if kw == "positional"
            else bridge.on(UserTranscriptionReceived, **{kw: keep})
        )
        route.map(lambda m: reply(m.event.content)).broadcast()

    async with LocalSession(agent_of(build)) as s:
        before = time.time()
        await s.emit(says("skip"))
        await s.emit(says("keep"))
        assert await s.next(timeout=T) == reply("keep")
        await assert_nothing_more(s)

        # an envelope published by hand, so every field the message mirrors is known
        envelope = Envelope.wrap(
            s.session_id, says("exact"), id="id-0123456789", ts=1234.5, source="user", turn=0, seq=99
        )
        await s.transport.publish(envelope, "in")
        await s.broker.settle()
        assert await s.next(timeout=T) == reply("exact")

    assert [m.event for m in seen] == [says("skip"), says("keep"), says("exact")]
    for message in seen:
        assert isinstance(message, Message)
        assert message.session == s.session_id
        assert message.source == "user"
        assert isinstance(message.id, str) and message.id
    assert seen[0].id != seen[1].id
    assert before - 1 <= seen[0].timestamp <= time.time() + 1
    assert (seen[2].id, seen[2].timestamp, seen[2].seq) == ("id-0123456789", 1234.5, 99)


async def test_route_filter_step_receives_the_message_too() -> None:
    seen: list[Any] = []

    def keep(message: Any) -> bool:
        seen.append(message)
        return True

    agent = agent_of(lambda b: b.on(UserStoppedSpeaking).filter(keep).map(lambda m: reply("ok")).broadcast())
    async with LocalSession(agent) as s:
        await s.emit(UserStoppedSpeaking())
        assert await s.next(timeout=T) == reply("ok")
    assert len(seen) == 1 and isinstance(seen[0], Message)
    assert seen[0].event == UserStoppedSpeaking() and seen[0].session == s.session_id


async def test_on_a_list_triggers_on_each_type() -> None:
    agent = agent_of(
        lambda b: b.on([DslTestPing, DslTestPong]).map(lambda m: reply(type(m.event).__name__)).broadcast()
    )
    async with LocalSession(agent) as s:
        await s.emit(DslTestPing())
        await s.emit(UserStoppedSpeaking())  # not in the list
        await s.emit(DslTestPong())
        assert await s.next(timeout=T) == reply("DslTestPing")
        assert await s.next(timeout=T) == reply("DslTestPong")
        await assert_nothing_more(s)


async def test_route_on_chains_a_second_route_on_the_same_bridge() -> None:
    def build(bridge: Bridge) -> None:
        first = bridge.on(DslTestPing).map(lambda m: reply("ping")).broadcast()
        first.on(DslTestPong).map(lambda m: reply("pong")).broadcast()

    async with LocalSession(agent_of(build)) as s:
        assert len(s.runtime.bridges[0].routes) == 2
        await s.emit(DslTestPong())
        await s.emit(DslTestPing())
        assert await s.next(timeout=T) == reply("pong")
        assert await s.next(timeout=T) == reply("ping")


async def test_a_map_that_raises_is_counted_and_the_session_goes_on() -> None:
    def explode(message: Message) -> AgentResponse:
        content = message.event.content  # type: ignore[attr-defined]
        if content == "boom":
            raise RuntimeError("map failed")
        return reply(content)

    agent = agent_of(lambda b: b.on(UserTranscriptionReceived).map(explode).broadcast())
    async with LocalSession(agent) as s:
        await s.emit(says("boom"))
        errors = {k: v for k, v in s.runtime.counters.items() if k.endswith("_errors")}
        assert sum(errors.values()) == 1, s.runtime.counters
        await s.emit(says("fine"))
        assert await s.next(timeout=T) == reply("fine")
        await assert_nothing_more(s)
        errors = {k: v for k, v in s.runtime.counters.items() if k.endswith("_errors")}
        assert sum(errors.values()) == 1, s.runtime.counters


async def test_a_stream_that_raises_is_counted_and_the_next_turn_runs() -> None:
    async def gen(message: Message) -> AsyncIterator[Event]:
        content = message.event.content  # type: ignore[attr-defined]
        yield reply(f"{content} 1")
        if content == "boom":
            raise RuntimeError("stream failed")
        yield reply(f"{content} 2")

    agent = agent_of(lambda b: b.on(UserTranscriptionReceived).stream(gen).broadcast())
    async with LocalSession(agent) as s:
        await s.emit(says("boom"))
        first_env, first = await s.next_envelope(timeout=T)
        assert first == reply("boom 1")
        # the failed turn tells the caller instead of leaving them in silence, within that turn
        error_env, error = await s.next_envelope(timeout=T)
        assert isinstance(error, AgentError), error
        assert error.code == "turn_failed" and "stream failed" in error.message
        assert (error_env.turn, error_env.seq) == (first_env.turn, 1)
        await s.emit(says("fine"))
        fine_env, fine = await s.next_envelope(timeout=T)
        assert fine == reply("fine 1")
        assert fine_env.turn > first_env.turn
        assert await s.next(timeout=T) == reply("fine 2")
        await assert_nothing_more(s)
        errors = {k: v for k, v in s.runtime.counters.items() if k.endswith("_errors")}
        assert sum(errors.values()) == 1, s.runtime.counters


async def test_outputs_carry_turn_seq_and_epoch() -> None:
    async def three(message: Message) -> AsyncIterator[Event]:
        for i in range(3):
            yield reply(f"{message.event.content}-{i}")  # type: ignore[attr-defined]

    agent = agent_of(lambda b: b.on(UserTranscriptionReceived).stream(three).broadcast())
    async with LocalSession(agent) as s:
        await s.emit(says("a"))
        first = [await s.next_envelope(timeout=T) for _ in range(3)]
        await s.emit(says("b"))
        second = [await s.next_envelope(timeout=T) for _ in range(3)]

    for batch, prefix in ((first, "a"), (second, "b")):
        assert [event for _, event in batch] == [reply(f"{prefix}-{i}") for i in range(3)]
        assert [env.seq for env, _ in batch] == [0, 1, 2]
        assert len({env.turn for env, _ in batch}) == 1
        assert all(env.epoch == 1 for env, _ in batch)
        assert all(env.session == s.session_id for env, _ in batch)
        assert all(env.source == "Node" for env, _ in batch)
    assert first[0][0].turn >= 1
    assert second[0][0].turn > first[0][0].turn


async def test_inline_route_outputs_get_their_own_turn_and_seq() -> None:
    agent = agent_of(
        lambda b: (
            b.on(UserTranscriptionReceived).map(lambda m: reply(m.event.content)).broadcast().broadcast()
        )
    )
    async with LocalSession(agent) as s:
        await s.emit(says("x"))
        await s.emit(says("y"))
        got = [await s.next_envelope(timeout=T) for _ in range(4)]
    assert [e for _, e in got] == [reply("x"), reply("x"), reply("y"), reply("y")]
    assert [env.seq for env, _ in got] == [0, 1, 0, 1]
    turns = [env.turn for env, _ in got]
    assert turns[0] == turns[1] and turns[2] == turns[3] and turns[2] > turns[0] >= 1
    assert all(env.epoch == 1 for env, _ in got)


async def test_a_callable_is_called_with_what_it_takes_each_time_it_is_remembered() -> None:
    # call_flexible remembers, per function, whether it takes the message: a bound method by its
    # function, so two instances share the answer, and a function that takes none is never given one
    from bargein.agent.calling import accepts, call_flexible

    class Node:
        def __init__(self, name: str) -> None:
            self.name = name

        def takes(self, message: object) -> str:
            return f"{self.name}:{message}"

        def bare(self) -> str:
            return self.name

    a, b = Node("a"), Node("b")
    for _ in range(2):  # asked, then remembered
        assert await call_flexible(a.takes, 1) == "a:1" and await call_flexible(b.takes, 2) == "b:2"
        assert await call_flexible(a.bare, 1) == "a" and await call_flexible(b.bare, 1) == "b"
        assert await call_flexible(lambda: "none", 1) == "none"
        assert await call_flexible(len, "four") == 4  # a builtin: no signature to remember
    assert accepts(a.takes, 1) and not accepts(a.takes, 0) and accepts(Node.takes, 2)
