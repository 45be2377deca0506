"""What every phone carrier's media stream says, in bargein's words, and what a carrier module gives.

A carrier (Twilio, Telnyx, ...) answers our voice webhook's markup by opening a WebSocket and
streaming the call: it announces the stream, sends the caller's audio and key presses, echoes the
marks we send once the audio before them has played, and says when the caller hangs up. Each
carrier spells this differently; a module of this package turns its messages into the events below
and bargein's frames into its messages, and knows its webhook's markup, its signature and its REST
API for outbound calls. Everything else (sessions, tokens, audio, marks, barge-in) is shared, in
:mod:`bargein.edge.phone`: adding a carrier is one module and one line in :data:`CARRIERS`.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field

from bargein.settings import TelephonySettings

# what our webhook's markup hands the stream, for it to give back when it starts
SESSION_PARAMETER = "session"
TOKEN_PARAMETER = "token"


class CarrierError(ValueError):
    """A message or request the carrier's protocol does not allow (counted, never fatal)."""


LINE_CODECS = ("PCMU", "PCMA", "G722")  # what a stream may carry to us: G.711 μ-law or A-law, or G.722


@dataclass(frozen=True)
class StreamStarted:
    """The stream is up: ``parameters`` carry what our webhook put in (session and token);
    ``encoding`` is the caller's audio's codec (one of :data:`LINE_CODECS`)."""

    stream_id: str
    call_id: str
    parameters: Mapping[str, str] = field(default_factory=dict)
    encoding: str = "PCMU"


@dataclass(frozen=True)
class CallerAudio:
    payload: bytes  # mono, in the stream's encoding (StreamStarted.encoding)


@dataclass(frozen=True)
class KeyPressed:
    digit: str


@dataclass(frozen=True)
class MarkPlayed:
    """The carrier has played everything we sent before mark ``name``, or cleared it."""

    name: str


@dataclass(frozen=True)
class StreamStopped:
    """The caller hung up (or the call ended otherwise)."""


@dataclass(frozen=True)
class Ignored:
    """A message with nothing for us (``connected``, the other track's media, ...)."""

    event: str


@dataclass(frozen=True)
class CallEnded:
    """A status callback says call ``call_id`` is over (``why``: the carrier's words, for the log)."""

    call_id: str
    why: str


CarrierEvent = StreamStarted | CallerAudio | KeyPressed | MarkPlayed | StreamStopped | Ignored


@dataclass(frozen=True)
class Webhook:
    """A carrier's HTTP request to us, as its signature covers it."""

    url: str  # the URL the carrier requested, as it knows it (public host and scheme)
    headers: Mapping[str, str]  # lower-case names
    body: bytes
    form: Mapping[str, str]


@dataclass(frozen=True)
class Dialled:
    """An outbound call the carrier's API accepted."""

    call_id: str
    status: str


class Carrier(abc.ABC):
    """One carrier's protocol. ``name`` is its path segment: ``/v1/<name>/voice``, ``/v1/<name>/media``."""

    name: str

    def __init__(self, settings: TelephonySettings) -> None:
        self.settings = settings

    @property
    @abc.abstractmethod
    def configured(self) -> bool:
        """Whether the settings hold what checking its webhooks needs (else every call is refused)."""

    @abc.abstractmethod
    def verify(self, request: Webhook) -> None:
        """Raise :class:`CarrierError` unless the request is signed by the carrier."""

    @abc.abstractmethod
    def answer(self, media_url: str, status_url: str, session_id: str, token: str) -> tuple[str, str]:
        """The webhook's reply (body, content type) that connects the call's audio, both ways, to
        ``media_url``, handing the stream the session and its caller token (as parameters of its
        ``start``, never in a URL a proxy logs), and asking for the stream's status at ``status_url``."""

    def call_id(self, request: Webhook) -> str | None:
        """The call a voice webhook answers (its status callbacks name it)."""
        return request.form.get("CallSid") or None

    @abc.abstractmethod
    def call_ended(self, request: Webhook) -> CallEnded | None:
        """What a (verified) status callback says: the call is over, or None (it goes on: ringing,
        answered, the stream started). :class:`CarrierError` for one that names no call."""

    @abc.abstractmethod
    def parse(self, text: str) -> CarrierEvent:
        """One message from the carrier (raises :class:`CarrierError` on a bad one)."""

    @abc.abstractmethod
    def media(self, stream_id: str, ulaw: bytes) -> str:
        """A message that plays ``ulaw`` to the caller after what was sent before."""

    @abc.abstractmethod
    def mark(self, stream_id: str, name: str) -> str:
        """A message the carrier echoes once the caller has heard the audio sent before it."""

    @abc.abstractmethod
    def clear(self, stream_id: str) -> str:
        """A message that drops every bit of audio not yet played (and echoes its marks)."""

    @abc.abstractmethod
    async def transfer(self, call_id: str, to: str) -> None:
        """Move call ``call_id`` to number ``to`` (the agent's ``TransferCall``), by the REST API."""

    @abc.abstractmethod
    async def dial(self, to: str, from_: str, webhook_url: str, status_url: str | None = None) -> Dialled:
        """Place a call through the carrier's REST API; it fetches ``webhook_url`` once answered and
        tells ``status_url`` when the call ends (also when it was never answered)."""
