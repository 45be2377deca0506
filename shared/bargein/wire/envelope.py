"""The envelope every event travels in, and its msgpack codec.

Every message on the bus carries where it belongs (session), where in the conversation it sits
(turn, seq), who may have produced it (owner epoch, the fencing token), when, and the trace context.
:func:`decode` is the single entry point for bytes from outside: it checks size first, unpacks with
msgpack (which builds only plain data; nothing is ever unpickled or imported), validates the shape,
and resolves the event type through the registry. Every failure is a typed
:class:`~bargein.errors.EnvelopeError` whose ``reason`` the services count and attach to the
dead-lettered message.

The envelope is a ``msgspec`` struct because every chunk of every answer is wrapped, encoded,
decoded and checked once on its way: msgspec does the packing and the checking of the envelope's
fields in C, in about a tenth of what the same work cost as a pydantic model and msgpack (21 µs
a message here, more than the rest of a chunk's way through the transport). A message that fails
the fast decoding is decoded again the careful way, step by step, so that its error names what is
wrong with it (:func:`_decode_carefully`); well-formed messages never take that path.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import random
import re
import time
import uuid
from typing import Annotated, Any, Final, Literal

import msgpack
import msgspec
from pydantic import ValidationError

from bargein.agent.events import Event, event_type, is_control, lane_of, payload_of
from bargein.agent.message import Message, Source
from bargein.errors import (
    InvalidEnvelope,
    InvalidSessionId,
    MessageTooLarge,
    UndecodableMessage,
)
from bargein.tracing import current_carrier

WIRE_VERSION: Final = 1
DEFAULT_MAX_BYTES = 256 * 1024

# Session ids become part of routing keys and Redis keys: no dots, no braces, bounded length.
SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")


def validate_session_id(session: str) -> str:
    if type(session) is not str or not _valid_session_id(session):
        raise InvalidSessionId(f"invalid session id {session!r}: use 1-64 of [A-Za-z0-9_-]")
    return session


@functools.lru_cache(maxsize=4096)  # asked twice a message, of the few sessions a process serves
def _valid_session_id(session: str) -> bool:
    return SESSION_ID_PATTERN.fullmatch(session) is not None


def new_session_id() -> str:
    return uuid.uuid4().hex


def new_message_id() -> str:
    """128 random bits in hex, as a uuid4's. An id needs to be unique, not unguessable, and one is
    made for every message: from the ``random`` module (reseeded in a forked child), not from the
    operating system (a system call each)."""
    return random.randbytes(16).hex()


NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class Envelope(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One event on the bus. ``payload`` holds the event's fields as plain data.

    The field constraints are checked when bytes are decoded (:func:`decode`), not when an envelope
    is built: the process building one is the one that chose its values (:meth:`wrap`)."""

    v: Literal[1]  # WIRE_VERSION; required, so that a message without it is refused
    type: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
    session: str
    turn: NonNegative = 0
    seq: NonNegative = 0
    epoch: NonNegative = 0
    ts: float = msgspec.field(default_factory=time.time)
    id: Annotated[str, msgspec.Meta(max_length=64)] = msgspec.field(default_factory=new_message_id)
    source: Annotated[str, msgspec.Meta(max_length=128)] = ""
    trace: dict[str, str] = msgspec.field(default_factory=dict)
    payload: dict[str, Any] = msgspec.field(default_factory=dict)

    @classmethod
    def wrap(cls, session: str, event: Event, **fields: Any) -> Envelope:
        """An envelope for ``event``; unless told otherwise it carries the current trace context."""
        validate_session_id(session)
        if "trace" not in fields:
            fields["trace"] = current_carrier()
        return cls(
            v=WIRE_VERSION, type=type(event).__name__, session=session, payload=payload_of(event), **fields
        )

    @property
    def control(self) -> bool:
        return _routing(self.type)[0]

    @property
    def lane(self) -> str:
        return _routing(self.type)[1]

    def event(self) -> Event:
        """The typed event; :class:`InvalidEnvelope` if the payload does not fit the type."""
        cls = event_type(self.type)
        try:
            return cls.model_validate(self.payload)
        except ValidationError as exc:
            raise InvalidEnvelope(f"{self.type} payload does not validate: {exc.errors()[:3]}") from None

    def as_dict(self) -> dict[str, Any]:
        """Every field, as the wire carries it (a map of plain data)."""
        return msgspec.structs.asdict(self)


@functools.lru_cache(maxsize=1024)  # asked for every message sent; known type names only
def _routing(type_name: str) -> tuple[bool, str]:
    """Whether a type of event overtakes data, and its lane (:class:`UnknownEventType` if none)."""
    cls = event_type(type_name)
    return is_control(cls), lane_of(cls)


_ENCODER = msgspec.msgpack.Encoder()


def _refuse_extension(code: int, data: memoryview) -> Any:
    raise InvalidEnvelope(f"message carries msgpack extension type {code}, which is not plain data")


_DECODER = msgspec.msgpack.Decoder(Envelope, ext_hook=_refuse_extension)


def encode(envelope: Envelope) -> bytes:
    return _ENCODER.encode(envelope)


_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})  # msgpack builds exactly these


def _require_plain(obj: Any, depth: int = 0) -> None:
    """Only plain msgpack data may cross the wire: no extension types (msgpack's timestamps
    included), and no absurd nesting. (By exact type: msgpack builds no subclasses; one loop per
    container, since this runs for every message.)"""
    if depth > 32:
        raise InvalidEnvelope("message nests too deeply")
    values = [*obj.keys(), *obj.values()] if type(obj) is dict else obj
    for value in values:
        kind = type(value)
        if kind in _PLAIN:
            continue
        if kind is dict or kind is list:
            _require_plain(value, depth + 1)
        else:
            raise InvalidEnvelope(f"message carries a {kind.__name__}, which is not plain data")


def decode(raw: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[Envelope, Event]:
    """Bytes from the bus → (envelope, event). Raises a typed EnvelopeError and nothing else."""
    if len(raw) > max_bytes:
        raise MessageTooLarge(f"message of {len(raw)} bytes exceeds the {max_bytes}-byte limit")
    try:  # the fast way: msgspec checks the envelope's fields; then what it cannot check
        envelope = _DECODER.decode(raw)
        if not _valid_session_id(envelope.session):
            raise InvalidSessionId(envelope.session)
        _require_plain(envelope.payload)
        return envelope, event_type(envelope.type).model_validate(envelope.payload)
    except Exception:  # whatever went wrong, the careful way names it
        return _decode_carefully(raw)


def _decode_carefully(raw: bytes) -> tuple[Envelope, Event]:
    """Decode step by step, raising the error that names the first thing wrong with ``raw``."""
    try:
        data = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for malformed input
        raise UndecodableMessage(f"not a msgpack message: {type(exc).__name__}: {exc}") from None
    if type(data) is not dict:
        raise InvalidEnvelope(f"envelope must be a map, got {type(data).__name__}")
    _require_plain(data)
    version = data.get("v")
    if type(version) is not int or version != WIRE_VERSION:
        raise InvalidEnvelope(f"unsupported envelope version {version!r}")
    session = data.get("session")
    validate_session_id(session)  # type: ignore[arg-type]  # validated at runtime
    if isinstance(data.get("type"), str):
        event_type(data["type"])  # unknown types fail as UnknownEventType, before shape errors
    try:
        envelope = msgspec.convert(data, Envelope)
    except msgspec.ValidationError as exc:
        raise InvalidEnvelope(f"malformed envelope: {exc}") from None
    return envelope, envelope.event()


# --- bundles: several sessions' envelopes in one broker message ---------------------------------------
#
# A worker publishes the output of many sessions to the one queue of the edge process that serves
# their callers; one broker message for all that is ready at once costs the worker, the broker and
# the edge what one chunk did (transport/amqp.py says when). Each entry names its session, so a
# consumer takes the entries of the sessions it serves without decoding the others.

BundleEntry = tuple[str, bytes]  # (session, an encoded envelope)
_BUNDLE_DECODER = msgspec.msgpack.Decoder(list[tuple[str, bytes]], ext_hook=_refuse_extension)


def encode_bundle(entries: list[BundleEntry]) -> bytes:
    return _ENCODER.encode(entries)


def decode_bundle(raw: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES) -> list[BundleEntry]:
    """Bytes from the bus → the bundle's (session, envelope bytes) entries, each still to be read
    with :func:`decode`. A typed EnvelopeError and nothing else, as :func:`decode`."""
    if len(raw) > max_bytes:
        raise MessageTooLarge(f"bundle of {len(raw)} bytes exceeds the {max_bytes}-byte limit")
    try:
        return _BUNDLE_DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        raise InvalidEnvelope(f"malformed bundle: {exc}") from None
    except Exception as exc:  # malformed msgpack, an extension type, absurd nesting
        raise UndecodableMessage(f"not a bundle: {type(exc).__name__}: {exc}") from None


# --- the bus message routes receive, from and to the wire -------------------------------------------


def message_of(envelope: Envelope, event: Event) -> Message:
    """The :class:`~bargein.agent.message.Message` routes and handlers see for a received envelope."""
    return Message(
        event=event,
        source=envelope.source or Source.USER,
        id=envelope.id,
        timestamp=envelope.ts,
        session=envelope.session,
        turn=envelope.turn,
        seq=envelope.seq,
        epoch=envelope.epoch,
        trace=dict(envelope.trace),
    )


# Messages encoded lately, by identity: a turn's trigger is in every checkpoint the turn takes (a
# message is frozen; its event, a value, is not changed in place by bargein).
_ENCODED: collections.OrderedDict[int, tuple[Message, bytes]] = collections.OrderedDict()
ENCODED_KEPT = 4096


def encode_message(message: Message) -> bytes:
    """A message as bytes, for checkpoints (a trigger an adopter must run again)."""
    known = _ENCODED.get(id(message))
    if known is not None and known[0] is message:
        return known[1]
    raw = _encode_message(message)
    _ENCODED[id(message)] = (message, raw)
    if len(_ENCODED) > ENCODED_KEPT:
        with contextlib.suppress(KeyError):  # another thread's loop evicted it first
            _ENCODED.popitem(last=False)
    return raw


def _encode_message(message: Message) -> bytes:
    return encode(
        Envelope(
            v=WIRE_VERSION,
            type=type(message.event).__name__,
            session=message.session,
            turn=message.turn,
            seq=message.seq,
            epoch=message.epoch,
            ts=message.timestamp,
            id=message.id,
            source=message.source,
            trace=dict(message.trace),
            payload=payload_of(message.event),
        )
    )


def decode_message(raw: bytes) -> Message:
    """The inverse of :func:`encode_message`, through the same checks as any bytes from outside."""
    return message_of(*decode(raw, max_bytes=len(raw)))
