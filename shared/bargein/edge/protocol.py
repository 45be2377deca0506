"""The client protocol's messages, both ways, validated (docs/protocol.md).

Everything a client may send (:data:`ClientMessage`), everything the edge sends back
(:data:`ServerFrame`), and the body of ``POST /v1/sessions`` (:class:`SessionRequest`) are models
here, so the edge builds frames by name and field, the call client reads them with the same
definitions, and a frame type or error code exists in one place only.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from bargein.agent.events import SessionErrorCode
from bargein.errors import TurnTakingError
from bargein.settings import check_turn_taking


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- client → server ------------------------------------------------------------------------------


class TextTurn(_Msg):
    type: Literal["text"]
    text: str = Field(min_length=1, max_length=10_000)


class Played(_Msg):
    """This client has played turn ``turn`` up to chunk ``seq`` (a text client) or up to its audio
    mark ``mark`` (a client that plays the agent's audio): exactly one of the two."""

    type: Literal["played"]
    turn: int = Field(ge=0)
    seq: int | None = Field(default=None, ge=0)
    mark: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _one_place(self) -> Played:
        if (self.seq is None) == (self.mark is None):
            raise ValueError("played takes a seq (text) or a mark (audio), not both or neither")
        return self


class Interrupt(_Msg):
    type: Literal["interrupt"]


class End(_Msg):
    type: Literal["end"]


class KeyPress(_Msg):
    """The caller pressed a key of the phone keypad (a DTMF tone): ``DTMFInputEvent`` for the agent."""

    type: Literal["dtmf"]
    button: str = Field(pattern=r"^[0-9*#A-D]$")


AnyClientMessage = TextTurn | Played | Interrupt | End | KeyPress
ClientMessage = Annotated[AnyClientMessage, Field(discriminator="type")]
_CLIENT: TypeAdapter[AnyClientMessage] = TypeAdapter(ClientMessage)


# --- server → client ------------------------------------------------------------------------------


class AgentChunk(_Msg):
    type: Literal["agent_chunk"] = "agent_chunk"
    turn: int
    seq: int
    text: str


class Clear(_Msg):
    """Stop playing ``turn`` and anything earlier, now."""

    type: Literal["clear"] = "clear"
    turn: int


class TurnComplete(_Msg):
    type: Literal["turn_complete"] = "turn_complete"
    turn: int


class ToolCallFrame(_Msg):
    """The agent called a tool (Line's ``tool_call`` output; a form filled in, a lookup)."""

    type: Literal["tool_call"] = "tool_call"
    turn: int
    seq: int
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str | None = None


class ToolResultFrame(_Msg):
    type: Literal["tool_result"] = "tool_result"
    turn: int
    seq: int
    name: str
    result: Any = None
    error: str | None = None
    id: str | None = None


class LogMetricFrame(_Msg):
    """A metric the agent logged for this call (Line's ``log_metric``)."""

    type: Literal["log_metric"] = "log_metric"
    turn: int
    seq: int
    name: str
    value: Any = None


class DtmfFrame(_Msg):
    """Play this key's tone to the line (the agent pressing a key, e.g. to work a phone menu)."""

    type: Literal["dtmf"] = "dtmf"
    turn: int
    seq: int
    button: str


class TransferFrame(_Msg):
    """Transfer the call to this number; the session then ends (``ended`` reason ``transferred``)."""

    type: Literal["transfer"] = "transfer"
    turn: int
    seq: int
    target_phone_number: str
    reason: str = ""


class SpeakingStarted(_Msg):
    type: Literal["user_started_speaking"] = "user_started_speaking"


class SpeakingStopped(_Msg):
    type: Literal["user_stopped_speaking"] = "user_stopped_speaking"
    false_interruption: bool | None = None  # sent (true) only when the burst was not a turn


class UserTranscript(_Msg):
    """What speech-to-text heard the caller say: a turn's words, or a backchannel ("uh-huh")
    that did not cut the agent off."""

    type: Literal["user_transcript"] = "user_transcript"
    text: str
    backchannel: bool = False


class AudioFormat(_Msg):
    """Sent first to a connection that joined with ``audio=``: the agent's audio follows as binary
    frames in this format."""

    type: Literal["audio_format"] = "audio_format"
    encoding: Literal["pcm16"] = "pcm16"
    sample_rate: int = 16_000
    frame_ms: int = 20


class AudioMark(_Msg):
    """The audio sent before this mark ends ``word`` of ``turn``: the caller who has played it has
    heard the turn up to the first ``chars`` characters of its chunk ``seq``. A client that reports
    playback echoes ``{"type": "played", "turn": T, "mark": N}`` once it has played it."""

    type: Literal["audio_mark"] = "audio_mark"
    turn: int
    mark: int
    seq: int
    chars: int
    word: str


class Pause(_Msg):
    """Soft barge-in: the caller may be starting to speak; stop playing now, keep what is buffered."""

    type: Literal["pause"] = "pause"
    turn: int


class Resume(_Msg):
    """It was only a cough or an "uh-huh": go on playing where you paused."""

    type: Literal["resume"] = "resume"
    turn: int


class ErrorFrame(_Msg):
    type: Literal["error"] = "error"
    code: str
    message: str = ""


class Ended(_Msg):
    type: Literal["ended"] = "ended"
    reason: str  # "caller", "agent" or "transferred" today; a client must take others it does not know yet


AnyServerFrame = (
    AgentChunk
    | Clear
    | TurnComplete
    | ToolCallFrame
    | ToolResultFrame
    | LogMetricFrame
    | DtmfFrame
    | TransferFrame
    | SpeakingStarted
    | SpeakingStopped
    | UserTranscript
    | AudioFormat
    | AudioMark
    | Pause
    | Resume
    | ErrorFrame
    | Ended
)
ServerFrame = Annotated[AnyServerFrame, Field(discriminator="type")]
_SERVER: TypeAdapter[AnyServerFrame] = TypeAdapter(ServerFrame)

# frames that belong to a turn: purged from an outbox when that turn is cleared
TURN_FRAMES = (
    AgentChunk,
    TurnComplete,
    ToolCallFrame,
    ToolResultFrame,
    LogMetricFrame,
    DtmfFrame,
    TransferFrame,
    AudioMark,
)

AUDIO_FORMATS = ("pcm16",)  # what a connection may ask for with ``audio=`` (none: text only)


def frame_json(frame: _Msg) -> dict[str, Any]:
    """A frame as the JSON object that goes on the socket (fields left unset are left out)."""
    return frame.model_dump(exclude_none=True)


class ErrorCode:
    """The ``code`` of an ``error`` frame (the table in docs/protocol.md). The speech tier's
    :class:`~bargein.agent.events.SessionErrorCode` values reach clients as they are."""

    INVALID_TOKEN: Final = "invalid_token"
    UNKNOWN_SESSION: Final = "unknown_session"
    MALFORMED_JSON: Final = "malformed_json"
    UNKNOWN_TYPE: Final = "unknown_type"
    FRAME_TOO_LARGE: Final = SessionErrorCode.FRAME_TOO_LARGE
    BAD_AUDIO_FRAME: Final = SessionErrorCode.BAD_AUDIO_FRAME
    BAD_TURN_TAKING: Final = SessionErrorCode.BAD_TURN_TAKING
    STT_BEHIND: Final = SessionErrorCode.STT_BEHIND
    LISTENER_CANNOT_SEND: Final = "listener_cannot_send"
    SLOW_CLIENT: Final = "slow_client"
    SHUTTING_DOWN: Final = "shutting_down"
    UNAVAILABLE: Final = "unavailable"
    RATE_LIMITED: Final = "rate_limited"
    OVERLOADED: Final = "overloaded"
    AGENT_ERROR: Final = "agent_error"
    BAD_AUDIO_FORMAT: Final = "bad_audio_format"
    NO_AUDIO: Final = "no_audio"

    FATAL: Final = frozenset({INVALID_TOKEN, UNKNOWN_SESSION, SLOW_CLIENT, SHUTTING_DOWN, BAD_AUDIO_FORMAT})
    """The connection is closed after these."""


class ProtocolError(Exception):
    """A message the other side sent is not the protocol's; ``code`` is the error frame's."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def frame(self) -> ErrorFrame:
        return ErrorFrame(code=self.code, message=self.message)


def _json_object(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
        raise ProtocolError(ErrorCode.MALFORMED_JSON, "text frames must be JSON objects") from None
    if not isinstance(data, dict):
        raise ProtocolError(ErrorCode.MALFORMED_JSON, "text frames must be JSON objects")
    return data


def _first_problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}"


def parse(text: str) -> AnyClientMessage:
    """A client's text frame; :class:`ProtocolError` with the client-facing code otherwise."""
    try:
        return _CLIENT.validate_python(_json_object(text))
    except ValidationError as exc:
        raise ProtocolError(
            ErrorCode.UNKNOWN_TYPE, f"not a valid message ({_first_problem(exc)}); see docs/protocol.md"
        ) from None


def parse_server_frame(
    text: str,
) -> AnyServerFrame:
    """A frame the edge sent (what a client reads); :class:`ProtocolError` if it is not one."""
    try:
        return _SERVER.validate_python(_json_object(text))
    except ValidationError as exc:
        raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"not a server frame ({_first_problem(exc)})") from None


# --- POST /v1/sessions ----------------------------------------------------------------------------

MAX_OPTION_DEPTH = 16  # agent options travel in every session start and directory entry


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


class SessionRequest(_Msg):
    """The body of ``POST /v1/sessions`` (every field optional)."""

    agent_options: dict[str, Any] = Field(default_factory=dict)
    turn_taking: dict[str, Any] = Field(default_factory=dict)
    voice: str | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:/+-]+$")

    @field_validator("agent_options")
    @classmethod
    def _plain_enough(cls, value: dict[str, Any]) -> dict[str, Any]:
        if _depth(value) > MAX_OPTION_DEPTH:
            raise ValueError(f"agent_options nests deeper than {MAX_OPTION_DEPTH} levels")
        return value

    @field_validator("turn_taking")
    @classmethod
    def _turn_taking(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            check_turn_taking(value)  # the speech tier's own check, applied before the session exists
        except TurnTakingError as exc:
            raise ValueError(str(exc)) from None
        return value

    @classmethod
    def parse(cls, raw: bytes) -> SessionRequest:
        """:class:`ProtocolError` (``bad_request``) with what is wrong."""
        if not raw.strip():
            return cls()
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            raise ProtocolError(
                "bad_request", "the body must be JSON (and not nested absurdly deep)"
            ) from None
        if not isinstance(data, dict):
            raise ProtocolError("bad_request", "the body must be a JSON object")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ProtocolError("bad_request", _first_problem(exc)) from None
