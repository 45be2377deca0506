"""The events agents and services exchange.

Every event is a pydantic model so that a payload read off the bus is validated field by field and
never executed. Subclasses register themselves by class name; :func:`event_type` is the only way
the codec turns a type name from the wire into a class, so an unknown name is rejected instead of
imported.

``control=True`` marks events that must overtake data (interrupts and their kin): the transports
publish them at high priority.
"""

from __future__ import annotations

import functools
import json
from typing import Any, ClassVar, Final, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bargein.errors import UnknownEventType

__all__ = [
    "CALLER_EVENTS",
    "SAMPLE_RATE",
    "SAMPLE_WIDTH",
    "AgentError",
    "AgentGenerationComplete",
    "AgentHandoff",
    "AgentPlayback",
    "AgentResponse",
    "AgentSpeechSent",
    "AgentStartedSpeaking",
    "AgentStoppedSpeaking",
    "AudioFrame",
    "CustomReceived",
    "DTMFInputEvent",
    "DTMFOutputEvent",
    "DTMFStoppedEvent",
    "EmergencyStop",
    "EndCall",
    "Event",
    "FalseInterruption",
    "HeardRecord",
    "HeardTurn",
    "InterruptPolicy",
    "LogMetric",
    "SessionError",
    "SessionErrorCode",
    "SpeculationDropped",
    "SpeculativeTurn",
    "SpeechDelivered",
    "ToolCall",
    "ToolResult",
    "TransferCall",
    "TurnInterrupted",
    "UserBackchannel",
    "UserOnsetDismissed",
    "UserSpeechOnset",
    "UserStartedSpeaking",
    "UserStoppedSpeaking",
    "UserTranscriptionReceived",
    "UserUnknownInputReceived",
    "event_type",
    "is_control",
    "is_registered",
    "lane_of",
    "payload_of",
    "register_model",
    "registered_event_types",
]

_REGISTRY: dict[str, type[Event]] = {}


class Event(BaseModel):
    """Base of all events. Subclass it to define your own; the class name is its wire name."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    control: ClassVar[bool] = False
    # Which exchange carries it: "events", or "audio" for the high-rate, transient audio frames.
    lane: ClassVar[str] = "events"

    def __init_subclass__(cls, *, control: bool | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if control is not None:
            cls.control = control
        name = cls.__name__
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__module__ != cls.__module__:
            raise TypeError(
                f"event type name {name!r} is already defined in {existing.__module__}; "
                "event class names must be unique because they are the wire name"
            )
        _REGISTRY[name] = cls

    @classmethod
    def type_name(cls) -> str:
        return cls.__name__

    def to_payload(self) -> dict[str, Any]:
        """The fields as plain data for the wire: JSON-style values, except that ``bytes`` fields
        stay bytes (msgpack carries them natively; base64 would cost a third more)."""
        if _plain_fields(type(self)):  # the values are their own JSON form (every chunk's case)
            return dict(self.__dict__)
        raw = _bytes_fields(type(self))
        if not raw:
            return self.model_dump(mode="json")
        payload = self.model_dump(mode="json", exclude=set(raw))
        payload.update({name: getattr(self, name) for name in raw})
        return payload


_PLAIN_ANNOTATIONS = frozenset({str, int, bool, bytes, type(None), str | None, int | None, bool | None})


@functools.cache
def _plain_fields(cls: type[BaseModel]) -> bool:
    """Whether every field of ``cls`` holds a string, an integer, a boolean, bytes or None, and is
    serialised as it is: then its values are the payload, with no serialiser to run (asked for
    every event sent)."""
    decorators = cls.__pydantic_decorators__
    return (
        not cls.model_computed_fields
        and cls.model_config.get("extra") != "allow"
        and not decorators.field_serializers
        and not decorators.model_serializers
        and all(
            field.annotation in _PLAIN_ANNOTATIONS
            and not field.exclude
            and field.serialization_alias is None
            and field.alias is None
            for field in cls.model_fields.values()
        )
    )


@functools.cache
def _bytes_fields(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` that stay bytes on the wire (asked for every event sent)."""
    return frozenset(name for name, field in cls.model_fields.items() if field.annotation is bytes)


def register_model(cls: type[BaseModel]) -> None:
    """Let a plain pydantic model travel as an event, under its class name.

    Line's events were plain ``BaseModel`` s, and Line agents define their own that way
    (``class LeadsAnalysis(BaseModel)``, routed with ``bridge.on(LeadsAnalysis)``). bargein's Line
    layer registers such a class when a route names it, so the session's checkpoints and the bus
    can carry it; it is always data (never overtakes), on the events lane. :class:`Event`
    subclasses register themselves."""
    if issubclass(cls, Event):
        return
    name = cls.__name__
    existing = _REGISTRY.get(name)
    if existing is not None and existing.__module__ != cls.__module__:  # one module: a redefinition
        raise TypeError(
            f"event type name {name!r} is already defined in {existing.__module__}; "
            "event class names must be unique because they are the wire name"
        )
    _REGISTRY[name] = cast(type[Event], cls)  # behaves as one on the wire (see payload_of)


def is_registered(cls: type) -> bool:
    """Whether instances of ``cls`` can travel (an :class:`Event`, or a registered plain model)."""
    return _REGISTRY.get(cls.__name__) is cls


def payload_of(event: BaseModel) -> dict[str, Any]:
    """An event's fields for the wire (a registered plain model's too)."""
    return event.to_payload() if isinstance(event, Event) else event.model_dump(mode="json")


def is_control(cls: type[BaseModel]) -> bool:
    return issubclass(cls, Event) and cls.control


def lane_of(cls: type[BaseModel]) -> str:
    return cls.lane if issubclass(cls, Event) else "events"


def event_type(name: str) -> type[Event]:
    """The registered event class called ``name``; :class:`UnknownEventType` otherwise. (A plain
    model registered with :func:`register_model` is returned as one: read ``control`` and
    ``lane`` through :func:`is_control` and :func:`lane_of`.)"""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownEventType(f"unknown event type {name!r}") from None


def registered_event_types() -> dict[str, type[Event]]:
    return dict(_REGISTRY)


# --- the user's side of the conversation ---------------------------------------------------------


class UserStartedSpeaking(Event, control=True):
    """The caller began to speak: the usual barge-in.

    ``transcript`` is what the speech tier heard of the burst when it judged it a barge-in while
    the agent was speaking (``BARGEIN_INTERRUPT_WORDS``); None when it was judged by timing alone
    (no speech-to-text, the agent silent, the engine behind) or came from the stop button.
    :func:`bargein.words_at_least` reads it."""

    transcript: str | None = None


class UserStoppedSpeaking(Event):
    """The caller finished a turn: the usual trigger for a generation."""


class UserTranscriptionReceived(Event):
    content: str


class SpeculativeTurn(Event):
    """The caller paused in their turn and may have finished: the reasoning owner starts the turn
    now with the words so far (``transcript``), holding everything it would send (text and voice)
    until the turn is confirmed. The confirmation is the turn's usual end with the same words
    (:class:`UserTranscriptionReceived` then :class:`UserStoppedSpeaking`): the held output goes out
    at once. Anything else (:class:`SpeculationDropped`, other words, any other event) drops the
    speculative turn without trace: nothing reached anyone, and the session is as it was. Sent by
    the speech tier (``BARGEIN_SPECULATIVE_TURNS``); an owner that has not seen it (an adopter) runs
    the confirmation as an ordinary turn."""

    transcript: str


class SpeculationDropped(Event):
    """The caller went on speaking after a :class:`SpeculativeTurn`: drop it."""


class UserBackchannel(Event):
    """The caller said only "uh-huh", "okay" or the like (``BARGEIN_BACKCHANNELS``) while the agent
    was speaking: listening, not taking the floor. The agent was not cut off and no turn starts; the
    client sees it as a ``user_transcript`` frame with ``backchannel: true``, and a route may listen
    to it."""

    content: str


class UserSpeechOnset(Event, control=True):
    """Speech detection heard the first of a burst (``soft_pause_ms``) while the agent's voice was
    reaching the caller: the client edge pauses that voice at once (the soft barge-in). What the
    burst turns out to be follows: :class:`UserStartedSpeaking` (a barge-in: the audio is cleared),
    or :class:`UserOnsetDismissed` / :class:`UserBackchannel` (the audio resumes where it paused)."""


class UserOnsetDismissed(Event):
    """The burst that paused the agent (:class:`UserSpeechOnset`) ended without cutting it off: too
    short, no words (``outcome`` ``noise``). A backchannel ends as :class:`UserBackchannel`; the
    agent may go on before that, once it is quiet and its words are known (``outcome``
    ``backchannel``)."""

    outcome: str = "noise"


class AgentPlayback(Event):
    """The client edge says the agent's voice started (``speaking``) or stopped reaching this caller.
    It rides the audio lane, in order with the caller's audio, to the speech tier: a burst while the
    agent speaks is judged by its words before it cuts the agent off."""

    lane: ClassVar[str] = "audio"

    speaking: bool


# --- the agent's side -----------------------------------------------------------------------------


class AgentStartedSpeaking(Event):
    pass


class AgentStoppedSpeaking(Event):
    pass


class AgentResponse(Event):
    content: str
    chunk_type: str = "text"


class AgentSpeechSent(Event):
    """Text the client edge has actually delivered to the caller."""

    content: str


class AgentGenerationComplete(Event):
    pass


class AgentError(Event):
    """Something went wrong on the agent's side. ``error`` is Line's field, ``message`` bargein's;
    either may be given and both read the same."""

    message: str = ""
    error: str = ""
    code: str = "agent_error"

    @model_validator(mode="after")
    def _same_text(self) -> AgentError:
        if self.error and not self.message:
            self.message = self.error
        elif self.message and not self.error:
            self.error = self.message
        return self


class ToolCall(Event):
    tool_name: str
    tool_args: dict[str, Any] = Field(default_factory=dict)
    # None, not Line's random uuid: a resumed turn re-runs its generation and must produce the same
    tool_call_id: str | None = None
    raw_response: dict[str, Any] = Field(default_factory=dict)


class ToolResult(Event):
    tool_name: str = ""
    tool_args: dict[str, Any] = Field(default_factory=dict)
    result: Any = None
    error: str | None = None
    tool_call_id: str | None = None
    metadata: dict[str, Any] | None = None

    @property
    def result_str(self) -> str | None:
        if self.result is None:
            return None
        if isinstance(self.result, str):
            return self.result
        try:
            return json.dumps(self.result)
        except (TypeError, ValueError):
            return str(self.result)

    @property
    def success(self) -> bool:
        return self.error is None


class LogMetric(Event):
    name: str
    value: Any = None


class CustomReceived(Event):
    metadata: dict[str, Any] = Field(default_factory=dict)


class DTMFInputEvent(Event):
    button: str


class DTMFOutputEvent(Event):
    button: str


# --- audio and speech -----------------------------------------------------------------------------

SAMPLE_RATE: Final = 16_000  # every AudioFrame: 16 kHz, mono, 16-bit little-endian PCM
SAMPLE_WIDTH: Final = 2


class AudioFrame(Event):
    """Caller audio, 16 kHz mono PCM16 little-endian, any length (the speech tier re-chunks)."""

    lane: ClassVar[str] = "audio"

    data: bytes


class FalseInterruption(Event):
    """A burst of speech that ended quickly with no transcript (a cough, a 'hm'): the reasoning side
    may resume the answer it cut off."""

    duration_ms: float = 0.0
    transcript: str | None = None


class SessionError(Event):
    """Something the caller sent could not be used (a bad audio frame, say); the edge shows it to
    the client and the session carries on. ``code`` is one of :class:`SessionErrorCode`."""

    code: str
    message: str = ""


class SessionErrorCode:
    """What a :class:`SessionError` is about; the client protocol's error frames use the same codes."""

    BAD_AUDIO_FRAME: Final = "bad_audio_frame"  # not whole 16-bit samples
    FRAME_TOO_LARGE: Final = "frame_too_large"
    BAD_TURN_TAKING: Final = "bad_turn_taking"  # the session's turn_taking options were not usable
    STT_BEHIND: Final = "stt_behind"  # speech-to-text fell behind or timed out: turns go by timing alone


# --- control: these interrupt, stop or move the call ---------------------------------------------


class EmergencyStop(Event, control=True):
    reason: str = ""


class AgentHandoff(Event, control=True):
    target_agent: str = ""
    reason: str = ""


class EndCall(Event):
    """The call is over: the caller hung up, or the agent ended it. ``reason`` is free text, except
    :attr:`REJECTED`: the agent declined the session when it started (the edge tells clients so)."""

    REJECTED: ClassVar[str] = "rejected"

    reason: str = ""

    @property
    def content(self) -> str:
        """Line's: the event as text (its harness logged and showed it)."""
        return repr(self)


class TransferCall(Event):
    target_phone_number: str = ""
    reason: str = ""
    timeout_s: int | None = 30


class DTMFStoppedEvent(Event):
    """The agent finished sending DTMF tones."""


class UserUnknownInputReceived(Event):
    input_data: str = ""


# --- runtime control between the reasoning side and the client edge -------------------------------


class TurnInterrupted(Event, control=True):
    """Published by the session's owner the moment it cancels a turn: the edge must drop every chunk
    of ``turn`` and earlier and tell clients to stop playing it."""

    turn: int


class InterruptPolicy(Event, control=True):
    """Published by a session's owner when it starts: the caller-side events that cut off the
    agent's turn with no condition attached. On those the edge clears clients at once, without
    waiting for the owner's TurnInterrupted (which still follows, and covers conditional ones)."""

    events: list[str]


class SpeechDelivered(Event):
    """Published by the client edge: chunks ``seq <= seq`` of ``turn`` reached (or were played by) the
    caller; with ``chars``, of chunk ``seq`` only its first ``chars`` characters (the agent's voice
    was played to the end of a word inside it). The owner cuts an interrupted assistant message to
    exactly this. ``final``: the caller will hear no more of the turn (its audio was cleared by a
    barge-in), so even an answer its agent had finished is cut to this."""

    turn: int
    seq: int
    chars: int | None = None
    final: bool = False


MISSED_AT_MOST: Final = 10_000  # chunks one OutputMissed may ask for again


class OutputMissed(Event):
    """Published by the client edge: chunks ``first`` to ``last`` (both included) of ``turn`` never
    reached it, though a later one did (the broker lost them: a node that thawed deleted the edge's
    queue with them in it). The owner publishes them again, as they were; the edge holds what came
    after them meanwhile, so the caller hears the answer whole and in order."""

    turn: int = Field(ge=1)
    first: int = Field(ge=0)
    last: int = Field(ge=0)

    @model_validator(mode="after")
    def _a_gap(self) -> OutputMissed:
        if not 0 <= self.last - self.first < MISSED_AT_MOST:  # (what one bad message may cost an owner)
            raise ValueError(f"first..last must name 1 to {MISSED_AT_MOST} chunks")
        return self


class HeardTurn(BaseModel):
    """One turn of a :class:`HeardRecord`: the caller got chunks up to ``seq`` (of the last, ``chars``
    characters, if given), whose text is ``text``."""

    model_config = ConfigDict(extra="forbid")

    turn: int
    seq: int
    chars: int | None = None
    text: str


class HeardRecord(Event, control=True):
    """The client edge's answer to a session owner's :class:`InterruptPolicy` (which every owner
    publishes when it starts): what the caller heard of each recent turn, text included. A new owner
    has neither its predecessor's delivery reports nor the chunks it produced; with this it cuts an
    interrupted answer to what was really heard, and its first new turn waits for it."""

    turns: list[HeardTurn] = Field(default_factory=list)


CALLER_EVENTS: Final = (
    AgentResponse,
    AgentGenerationComplete,
    AgentError,
    SessionError,
    ToolCall,
    ToolResult,
    EndCall,
    TransferCall,
    LogMetric,
    DTMFOutputEvent,
)
"""What a speaking node's broadcasts send to the caller, in an agent that names one (Line's style:
Line's user bridge forwarded these to its harness). Anything else it broadcasts (an agent's own
events, say) is heard by the session's bridges only."""
