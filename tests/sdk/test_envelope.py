"""The msgpack envelope codec, its typed errors, and how the in-memory transport and the session
runtime tolerate bad messages (dead-lettered with a reason, never taking delivery down)."""

from __future__ import annotations

import random
import sys
from typing import Any

import msgpack
import pytest

from bargein.agent.events import (
    AgentGenerationComplete,
    AgentHandoff,
    AgentResponse,
    CustomReceived,
    EmergencyStop,
    Event,
    ToolCall,
    TurnInterrupted,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
    event_type,
    registered_event_types,
)
from bargein.errors import (
    EnvelopeError,
    InvalidEnvelope,
    InvalidSessionId,
    MessageTooLarge,
    UndecodableMessage,
    UnknownEventType,
)
from bargein.testing import LocalSession
from bargein.transport.memory import MemoryBroker, MemoryTransport
from bargein.wire.envelope import (
    DEFAULT_MAX_BYTES,
    WIRE_VERSION,
    Envelope,
    decode,
    decode_bundle,
    encode,
    encode_bundle,
    validate_session_id,
)

from ..agents import interruptible_agent

pytestmark = pytest.mark.timeout(60)

SESSION = "sess_01-A"


class EnvelopeTestStop(Event, control=True):
    """A user-defined control event (the class name is its wire name, so it is unique to this file)."""

    reason: str = ""
    level: int = 0


class EnvelopeTestLoudStop(EmergencyStop):
    """Inherits ``control`` from EmergencyStop."""


class EnvelopeTestQuietStop(EmergencyStop, control=False):
    """Explicitly not control, though its base is."""


def wire_dict(event: Event | None = None, **overrides: Any) -> dict[str, Any]:
    """A valid envelope as the plain dict that goes on the wire, with some fields replaced."""
    env = Envelope.wrap(SESSION, event or AgentResponse(content="hi"), turn=1, seq=2, epoch=3)
    data = env.as_dict()
    data.update(overrides)
    return data


def pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def assert_rejected(raw: bytes, expected: type[EnvelopeError], reason: str, **kwargs: Any) -> EnvelopeError:
    with pytest.raises(EnvelopeError) as info:
        decode(raw, **kwargs)
    assert type(info.value) is expected, f"expected {expected.__name__}, got {info.value!r}"
    assert info.value.reason == reason
    assert isinstance(info.value, ValueError)
    return info.value


# --------------------------------------------------------------------------------------------------
# round trip


@pytest.mark.parametrize(
    "event",
    [
        AgentResponse(content="héllo, wörld ✓", chunk_type="text"),
        AgentHandoff(target_agent="billing", reason="caller asked for billing"),
        ToolCall(tool_name="lookup", tool_args={"city": "Oslo", "days": 3, "opts": {"units": ["C", "F"]}}),
        TurnInterrupted(turn=12),
        UserStartedSpeaking(),
        UserTranscriptionReceived(content=""),
        EnvelopeTestStop(reason="custom", level=2),
    ],
    ids=lambda e: type(e).__name__,
)
def test_round_trip_preserves_event_and_every_envelope_field(event: Event) -> None:
    original = Envelope.wrap(
        SESSION,
        event,
        turn=7,
        seq=4,
        epoch=9,
        ts=1712345678.125,
        id="0123456789abcdef0123456789abcdef",
        source="ReasoningNode-2",
        trace={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k": "v"},
    )
    raw = encode(original)
    assert isinstance(raw, bytes)

    envelope, decoded = decode(raw)

    assert envelope == original
    assert (envelope.session, envelope.turn, envelope.seq, envelope.epoch) == (SESSION, 7, 4, 9)
    assert envelope.ts == 1712345678.125
    assert envelope.id == "0123456789abcdef0123456789abcdef"
    assert envelope.source == "ReasoningNode-2"
    assert envelope.trace["k"] == "v"
    assert envelope.v == WIRE_VERSION
    assert envelope.type == type(event).__name__
    assert type(decoded) is type(event)
    assert decoded == event
    assert encode(envelope) == raw  # decoding and re-encoding is stable


_SAMPLES: dict[Any, Any] = {
    str: "héllo",
    int: 7,
    bool: True,
    bytes: b"\x00\x01",
    str | None: "x",
    int | None: 3,
    list[str]: ["a", "b"],
}


def _sample(cls: type[Event]) -> Event | None:
    """An instance of ``cls`` with every required field given a value (None if one is of a kind
    the samples lack)."""
    required = {name: field for name, field in cls.model_fields.items() if field.is_required()}
    if not all(field.annotation in _SAMPLES for field in required.values()):
        return None
    return cls(**{name: _SAMPLES[field.annotation] for name, field in required.items()})


@pytest.mark.parametrize(
    "name", [n for n, cls in sorted(registered_event_types().items()) if _sample(cls) is not None]
)
def test_an_events_payload_is_its_json_form_whichever_way_it_is_made(name: str) -> None:
    """Events whose fields are plain give their values as the payload without running pydantic's
    serialiser (every chunk's case); that is the same payload the serialiser makes."""
    event = _sample(event_type(name))
    assert event is not None
    expected = event.model_dump(mode="json")
    for field_name, field in type(event).model_fields.items():
        if field.annotation is bytes:
            expected[field_name] = getattr(event, field_name)  # bytes stay bytes on the wire
    assert event.to_payload() == expected
    assert decode(encode(Envelope.wrap(SESSION, event)))[1] == event


def test_round_trip_keeps_tool_args_structure() -> None:
    args = {"n": 1, "f": 2.5, "s": "x", "b": True, "none": None, "list": [1, "two", [3]], "map": {"k": {}}}
    _, decoded = decode(encode(Envelope.wrap(SESSION, ToolCall(tool_name="t", tool_args=args))))
    assert isinstance(decoded, ToolCall)
    assert decoded.tool_args == args


def test_wrap_fills_defaults_and_fresh_ids() -> None:
    a = Envelope.wrap(SESSION, UserStoppedSpeaking())
    b = Envelope.wrap(SESSION, UserStoppedSpeaking())
    assert (a.turn, a.seq, a.epoch, a.v) == (0, 0, 0, WIRE_VERSION)
    assert a.id != b.id
    assert a.ts > 0


# --------------------------------------------------------------------------------------------------
# every bad input raises its own typed error, and only an EnvelopeError


@pytest.mark.parametrize(
    "raw",
    [b"\xc1", b"\xc1garbage", b"\xc1\x00\x01\x02" * 8, b"\xd9"],
    ids=["never-used-byte", "never-used-then-text", "repeated-garbage", "truncated-str8-header"],
)
def test_garbage_bytes_are_undecodable(raw: bytes) -> None:
    assert_rejected(raw, UndecodableMessage, "undecodable")


def test_empty_bytes_are_undecodable() -> None:
    assert_rejected(b"", UndecodableMessage, "undecodable")


@pytest.mark.parametrize("cut", [1, 2, 10, 40])
def test_truncated_msgpack_is_undecodable(cut: int) -> None:
    raw = encode(Envelope.wrap(SESSION, AgentResponse(content="a reasonably long piece of content")))
    assert_rejected(raw[:-cut], UndecodableMessage, "undecodable")


def test_trailing_bytes_after_a_valid_message_are_undecodable() -> None:
    raw = encode(Envelope.wrap(SESSION, AgentResponse(content="x")))
    assert_rejected(raw + b"\x00", UndecodableMessage, "undecodable")


@pytest.mark.parametrize(
    "obj",
    [[1, 2, 3], [wire_dict()], 7, "a string", None, 1.5, True],
    ids=["list", "list-of-envelope", "int", "str", "nil", "float", "bool"],
)
def test_msgpack_that_is_not_a_map_is_an_invalid_envelope(obj: Any) -> None:
    err = assert_rejected(pack(obj), InvalidEnvelope, "bad_envelope")
    assert "map" in str(err)


@pytest.mark.parametrize("version", [0, 2, WIRE_VERSION + 1, -1, "1", None, 1.0, True])
def test_wrong_version_is_an_invalid_envelope(version: Any) -> None:
    assert_rejected(pack(wire_dict(v=version)), InvalidEnvelope, "bad_envelope")


def test_missing_version_is_an_invalid_envelope() -> None:
    data = wire_dict()
    del data["v"]
    assert_rejected(pack(data), InvalidEnvelope, "bad_envelope")


@pytest.mark.parametrize("name", ["NoSuchEvent", "agentresponse", "", "Event", "BaseModel", "x" * 200])
def test_unknown_type_name_is_unknown_event_type(name: str) -> None:
    assert_rejected(pack(wire_dict(type=name, payload={})), UnknownEventType, "unknown_type")


@pytest.mark.parametrize(
    "name",
    [
        "os.system",
        "builtins.eval",
        "builtins:eval",
        "subprocess.Popen",
        "this.s",
        "bargein.events.AgentResponse",
        "bargein.events:AgentResponse",
        "__import__",
    ],
)
def test_importable_python_path_is_never_resolved(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A type name is looked up in the event registry only: nothing is imported or executed."""
    with pytest.raises(UnknownEventType):  # warm up whatever the rejection path itself imports lazily
        decode(pack(wire_dict(type="NoSuchEventType", payload={})))
    modules_before = set(sys.modules)
    payload = {"cmd": "echo pwned", "source": "__import__('this')", "args": ["-c", "1"]}
    assert_rejected(pack(wire_dict(type=name, payload=payload)), UnknownEventType, "unknown_type")
    assert set(sys.modules) == modules_before, "decoding imported a module"
    assert "this" not in sys.modules
    assert capsys.readouterr().out == ""  # importing `this` prints the Zen; os.system prints too


def test_registry_holds_only_plain_event_class_names() -> None:
    names = registered_event_types()
    assert "AgentResponse" in names and "EnvelopeTestStop" in names
    assert "Event" not in names
    assert all(name.isidentifier() for name in names)
    with pytest.raises(UnknownEventType):
        event_type("os.system")


def test_oversized_message_is_too_large_and_checked_before_decoding() -> None:
    raw = encode(Envelope.wrap(SESSION, AgentResponse(content="z" * 200)))
    assert decode(raw, max_bytes=len(raw))[1] == AgentResponse(content="z" * 200)  # exactly at the limit
    err = assert_rejected(raw, MessageTooLarge, "too_large", max_bytes=len(raw) - 1)
    assert str(len(raw)) in str(err)
    # size is checked first: oversized garbage is too_large, not undecodable
    assert_rejected(b"\xc1" * 5000, MessageTooLarge, "too_large", max_bytes=4096)


def test_default_limit_rejects_a_huge_valid_message() -> None:
    raw = encode(Envelope.wrap(SESSION, AgentResponse(content="y" * (DEFAULT_MAX_BYTES + 10))))
    assert len(raw) > DEFAULT_MAX_BYTES
    assert_rejected(raw, MessageTooLarge, "too_large")


BAD_SESSION_IDS: list[Any] = [
    "",
    "a.b",
    "{sess}",
    "sess}",
    "a" * 65,
    "with space",
    "sess*",
    "sess#",
    "séance",
    "sess\n",  # `$` in a regex also matches before a trailing newline
    "a" * 64 + "\n",
    "\nsess",
    123,
    None,
    b"sess",
    ["sess"],
]


@pytest.mark.parametrize("session", BAD_SESSION_IDS, ids=repr)
def test_invalid_session_id_is_rejected_everywhere(session: Any) -> None:
    with pytest.raises(InvalidSessionId) as info:
        validate_session_id(session)
    assert info.value.reason == "bad_session"
    with pytest.raises(InvalidSessionId):
        Envelope.wrap(session, AgentResponse(content="x"))
    assert_rejected(pack(wire_dict(session=session)), InvalidSessionId, "bad_session")


def test_missing_session_is_invalid_session_id() -> None:
    data = wire_dict()
    del data["session"]
    assert_rejected(pack(data), InvalidSessionId, "bad_session")


@pytest.mark.parametrize("session", ["a", "a" * 64, "A-z_0-9", "0123456789abcdef0123456789abcdef"])
def test_valid_session_ids_are_accepted(session: str) -> None:
    assert validate_session_id(session) == session
    envelope, _ = decode(encode(Envelope.wrap(session, AgentResponse(content="x"))))
    assert envelope.session == session


@pytest.mark.parametrize(
    ("event", "payload"),
    [
        (AgentResponse(content="x"), {}),  # missing required field
        (AgentResponse(content="x"), {"content": "x", "extra": 1}),  # extra field
        (AgentHandoff(), {"target_agent": "a", "reason": "b", "evil": "__import__('os')"}),
        (AgentResponse(content="x"), {"content": 5}),  # wrong field type
        (TurnInterrupted(turn=1), {}),
        (ToolCall(tool_name="t"), {"tool_name": "t", "tool_args": [1, 2]}),
        (UserStartedSpeaking(), {"anything": True}),
    ],
    ids=["missing", "extra", "extra-on-control", "content-int", "turn-missing", "args-list", "x"],
)
def test_payload_not_fitting_the_event_schema_is_an_invalid_envelope(event: Event, payload: Any) -> None:
    err = assert_rejected(pack(wire_dict(event, payload=payload)), InvalidEnvelope, "bad_envelope")
    assert type(event).__name__ in str(err)


@pytest.mark.parametrize(
    "overrides",
    [
        {"turn": "3"},
        {"turn": 1.0},
        {"turn": True},
        {"turn": -1},
        {"seq": -1},
        {"seq": "0"},
        {"epoch": -5},
        {"epoch": None},
        {"ts": "yesterday"},
        {"id": 5},
        {"id": "x" * 65},
        {"source": ["user"]},
        {"trace": {"k": 1}},
        {"trace": ["k"]},
        {"payload": ["content", "x"]},
        {"payload": None},
        {"type": 5},
        {"type": None},
        {"unexpected": 1},
    ],
    ids=repr,
)
def test_wrong_envelope_field_types_are_invalid_envelope(overrides: dict[str, Any]) -> None:
    assert_rejected(pack(wire_dict(**overrides)), InvalidEnvelope, "bad_envelope")


def test_non_string_map_keys_are_rejected() -> None:
    data: dict[Any, Any] = wire_dict()
    data[b"bytes-key"] = 1
    assert_rejected(pack(data), InvalidEnvelope, "bad_envelope")
    with pytest.raises(EnvelopeError):
        decode(pack(wire_dict(payload={1: "x"})))


@pytest.mark.parametrize(
    ("where", "ext"),
    [
        ("field", msgpack.ExtType(5, b"\x00\x01")),
        ("field", msgpack.Timestamp(1, 0)),
        ("nested", msgpack.ExtType(42, b"payload")),
        ("nested", msgpack.Timestamp(1700000000, 5)),
        ("ts", msgpack.Timestamp(1700000000, 0)),
        ("trace", msgpack.ExtType(1, b"")),
    ],
    ids=["ext-as-field", "timestamp-as-field", "ext-in-tool-args", "timestamp-in-tool-args", "ts", "trace"],
)
def test_msgpack_ext_types_are_rejected(where: str, ext: Any) -> None:
    """Ext types are not plain data: an envelope carrying one anywhere is not accepted, even where the
    event's schema allows any value (``ToolCall.tool_args`` is ``dict[str, Any]``)."""
    if where == "field":
        data = wire_dict(AgentResponse(content="x"), payload={"content": ext})
    elif where == "nested":
        data = wire_dict(ToolCall(tool_name="t"), payload={"tool_name": "t", "tool_args": {"when": ext}})
    else:
        data = wire_dict(**{where: ext})
    with pytest.raises(EnvelopeError) as info:
        decode(pack(data))
    assert info.value.reason in ("undecodable", "bad_envelope")


# --------------------------------------------------------------------------------------------------
# bundles: several sessions' envelopes in one message


def test_a_bundle_round_trips_its_entries_in_order() -> None:
    entries = [(f"s{i}", encode(Envelope.wrap(f"s{i}", AgentResponse(content=str(i))))) for i in range(5)]
    assert decode_bundle(encode_bundle(entries)) == entries
    assert [decode(body)[1] for _, body in decode_bundle(encode_bundle(entries))] == [
        AgentResponse(content=str(i)) for i in range(5)
    ]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"\xc1", UndecodableMessage),
        (b"", UndecodableMessage),
        (pack([["s", b"x"]])[:-1], UndecodableMessage),
        (pack({"not": "a list"}), InvalidEnvelope),
        (pack([["s", "not bytes"]]), InvalidEnvelope),
        (pack([[1, b"x"]]), InvalidEnvelope),
        (pack([["s", b"x", "extra"]]), InvalidEnvelope),
        (pack([["s", msgpack.ExtType(5, b"x")]]), InvalidEnvelope),
    ],
    ids=["garbage", "empty", "truncated", "map", "str-body", "int-session", "three-items", "ext"],
)
def test_a_bad_bundle_is_a_typed_envelope_error(raw: bytes, expected: type[EnvelopeError]) -> None:
    with pytest.raises(EnvelopeError) as info:
        decode_bundle(raw)
    assert type(info.value) is expected, info.value


def test_an_oversized_bundle_is_too_large_before_it_is_read() -> None:
    with pytest.raises(MessageTooLarge):
        decode_bundle(b"\xc1" * 5000, max_bytes=4096)


# --------------------------------------------------------------------------------------------------
# fuzz: nothing but EnvelopeError, ever


def _mutate(rng: random.Random, raw: bytes) -> bytes:
    buf = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        pos = rng.randrange(len(buf)) if buf else 0
        if op < 0.5 and buf:
            buf[pos] = rng.getrandbits(8)
        elif op < 0.7:
            buf.insert(pos, rng.getrandbits(8))
        elif op < 0.85 and buf:
            del buf[pos]
        else:
            del buf[pos:]
    return bytes(buf)


def test_fuzz_random_and_mutated_bytes_raise_only_envelope_errors() -> None:
    rng = random.Random(20240611)
    seeds = [
        encode(Envelope.wrap(SESSION, event, turn=2, seq=1, epoch=4, trace={"t": "x"}, source="n"))
        for event in (
            AgentResponse(content="hello there"),
            ToolCall(tool_name="lookup", tool_args={"a": [1, {"b": 2.5}], "c": None}),
            AgentHandoff(target_agent="x", reason="y"),
            UserStartedSpeaking(),
            TurnInterrupted(turn=3),
            EnvelopeTestStop(reason="r", level=1),
        )
    ]
    outcomes: dict[str, int] = {}
    for i in range(1500):
        if i % 3 == 0:
            raw = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 80)))
        else:
            raw = _mutate(rng, rng.choice(seeds))
        try:
            envelope, event = decode(raw)
        except EnvelopeError as exc:
            assert exc.reason in {"undecodable", "too_large", "unknown_type", "bad_session", "bad_envelope"}
            outcomes[exc.reason] = outcomes.get(exc.reason, 0) + 1
        else:  # whatever decodes is a valid envelope with a registered, validated event
            assert isinstance(event, Event)
            assert event_type(envelope.type) is type(event)
            validate_session_id(envelope.session)
            outcomes["ok"] = outcomes.get("ok", 0) + 1
    # the corpus really exercised several rejection paths, not just the first check
    assert {"undecodable", "bad_envelope"} <= set(outcomes), outcomes


# --------------------------------------------------------------------------------------------------
# control flag


@pytest.mark.parametrize(
    ("event", "control"),
    [
        (UserStartedSpeaking(), True),
        (EmergencyStop(reason="x"), True),
        (AgentHandoff(target_agent="t"), True),
        (TurnInterrupted(turn=1), True),
        (EnvelopeTestStop(), True),
        (EnvelopeTestLoudStop(), True),
        (EnvelopeTestQuietStop(), False),
        (AgentResponse(content="x"), False),
        (UserStoppedSpeaking(), False),
        (UserTranscriptionReceived(content="x"), False),
        (ToolCall(tool_name="t"), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, Event) else str(v),
)
def test_control_flag_on_class_and_decoded_envelope(event: Event, control: bool) -> None:
    assert type(event).control is control
    envelope, decoded = decode(encode(Envelope.wrap(SESSION, event)))
    assert envelope.control is control
    assert decoded.control is control
    assert decoded == event


def test_control_flag_does_not_leak_to_the_base_class() -> None:
    assert Event.control is False
    assert AgentResponse.control is False


def test_user_control_event_round_trips_with_fields() -> None:
    envelope, decoded = decode(encode(Envelope.wrap(SESSION, EnvelopeTestStop(reason="now", level=3))))
    assert isinstance(decoded, EnvelopeTestStop)
    assert (decoded.reason, decoded.level) == ("now", 3)
    assert envelope.type == "EnvelopeTestStop"
    assert envelope.control is True


# --------------------------------------------------------------------------------------------------
# the in-memory transport: dead letters, and delivery that goes on


def _raw_with(**overrides: Any) -> bytes:
    return pack(wire_dict(**overrides))


async def test_memory_transport_dead_letters_bad_messages_and_keeps_order() -> None:
    broker = MemoryBroker(max_message_bytes=4096)
    transport = MemoryTransport(broker)
    seen: list[tuple[Envelope, Event]] = []

    async def handler(envelope: Envelope, event: Event) -> None:
        seen.append((envelope, event))

    sub = await transport.open_mailbox(SESSION, "reasoning", "in", handler)
    good = [  # all data: control would overtake them (tests/contract holds that)
        AgentResponse(content="one"),
        ToolCall(tool_name="lookup", tool_args={"q": "x"}),
        CustomReceived(metadata={"plan": "gold"}),
        UserTranscriptionReceived(content="custom"),
        AgentResponse(content="last"),
    ]
    bad: list[tuple[str, bytes]] = [
        ("undecodable", b"\xc1garbage"),
        ("bad_envelope", pack([1, 2, 3])),
        ("unknown_type", _raw_with(type="os.system", payload={"command": "true"})),
        ("bad_session", _raw_with(session="a.b")),
        ("too_large", encode(Envelope.wrap(SESSION, AgentResponse(content="x" * 5000)))),
        ("bad_envelope", _raw_with(payload={"content": "x", "extra": 1})),
    ]
    try:
        for i, event in enumerate(good):
            await transport.publish(Envelope.wrap(SESSION, event, seq=i), "in")
            if i < len(bad):
                await transport.publish_raw(SESSION, "in", "AgentResponse", bad[i][1])
        await transport.publish_raw(SESSION, "in", "AgentResponse", bad[-1][1])
        await broker.settle()
    finally:
        await sub.cancel()

    assert [event for _, event in seen] == good
    assert [envelope.seq for envelope, _ in seen] == list(range(len(good)))
    assert [d.reason for d in broker.dead] == [reason for reason, _ in bad]
    assert [d.body for d in broker.dead] == [body for _, body in bad]
    assert all(d.error for d in broker.dead)
    assert broker.counters["dead:undecodable"] == 1
    assert broker.counters["dead:bad_envelope"] == 2
    assert broker.counters["dead:unknown_type"] == 1
    assert broker.counters["dead:bad_session"] == 1
    assert broker.counters["dead:too_large"] == 1
    assert sum(v for k, v in broker.counters.items() if k.startswith("dead:")) == len(bad)


async def test_memory_transport_dead_letters_a_handler_failure_and_goes_on() -> None:
    broker = MemoryBroker()
    transport = MemoryTransport(broker)
    seen: list[str] = []

    async def handler(envelope: Envelope, event: Event) -> None:
        assert isinstance(event, AgentResponse)
        if event.content == "boom":
            raise ValueError("handler exploded")
        seen.append(event.content)

    sub = await transport.open_mailbox(SESSION, "reasoning", "in", handler)
    try:
        for content in ("a", "boom", "b", "c"):
            await transport.publish(Envelope.wrap(SESSION, AgentResponse(content=content)), "in")
        await broker.settle()
    finally:
        await sub.cancel()

    assert seen == ["a", "b", "c"]
    assert [d.reason for d in broker.dead] == ["handler_error"]
    assert "ValueError" in broker.dead[0].error and "handler exploded" in broker.dead[0].error
    _, event = decode(broker.dead[0].body)
    assert event == AgentResponse(content="boom")
    assert broker.counters["dead:handler_error"] == 1


async def test_memory_transport_only_delivers_its_own_session_and_direction() -> None:
    broker = MemoryBroker()
    transport = MemoryTransport(broker)
    seen: list[Event] = []

    async def handler(envelope: Envelope, event: Event) -> None:
        seen.append(event)

    sub = await transport.open_mailbox(SESSION, "reasoning", "in", handler)
    try:
        await transport.publish(Envelope.wrap("other", AgentResponse(content="other session")), "in")
        await transport.publish(Envelope.wrap(SESSION, AgentResponse(content="wrong direction")), "out")
        await transport.publish(Envelope.wrap(SESSION, AgentResponse(content="mine")), "in")
        await broker.settle()
    finally:
        await sub.cancel()
    assert seen == [AgentResponse(content="mine")]
    assert broker.dead == []


# --------------------------------------------------------------------------------------------------
# the session runtime survives bad messages


REPLY = "Sure thing, here it is."


async def test_session_keeps_working_after_bad_messages() -> None:
    async with LocalSession(interruptible_agent(replies=(REPLY,), tokens_per_second=500)) as s:
        sid = s.session_id
        bad: list[tuple[str, bytes]] = [
            ("undecodable", b"\xc1garbage"),
            ("bad_envelope", pack({"v": WIRE_VERSION, "session": sid})),
            ("unknown_type", pack(wire_dict(session=sid, type="builtins.eval", payload={"x": "1"}))),
            ("bad_session", pack(wire_dict(session="bad.session"))),
            ("too_large", b"\x00" * (DEFAULT_MAX_BYTES + 1)),
            ("bad_envelope", pack(wire_dict(UserStoppedSpeaking(), session=sid, turn="1"))),
        ]
        for _, body in bad:
            await s.transport.publish_raw(sid, "in", "AgentResponse", body)
        # a well-formed envelope of another session, routed to this one, is refused by the mailbox
        stray = Envelope.wrap("another_session", UserStoppedSpeaking())
        await s.transport.publish_raw(sid, "in", "UserStoppedSpeaking", encode(stray))
        bad.append(("bad_session", encode(stray)))
        await s.broker.settle()

        assert [d.reason for d in s.broker.dead] == [reason for reason, _ in bad]

        await s.emit(UserTranscriptionReceived(content="hello?"))
        await s.emit(UserStoppedSpeaking())
        events = await s.collect_turn(timeout=10)

        assert isinstance(events[-1], AgentGenerationComplete)
        assert "".join(e.content for e in events if isinstance(e, AgentResponse)) == REPLY
        assert len(s.broker.dead) == len(bad)  # nothing good was dead-lettered
        assert not any(k.endswith("_errors") for k in s.runtime.counters), s.runtime.counters
