"""Reading carriers' JSON messages: the checks every carrier module makes, said once."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from bargein.edge.carriers.abc import (
    CallEnded,
    CallerAudio,
    CarrierError,
    CarrierEvent,
    Ignored,
    KeyPressed,
    MarkPlayed,
    StreamStopped,
    Webhook,
)

# a status callback's CallStatus once the call is over, answered or not (TwiML's, which TeXML keeps)
CALL_OVER = frozenset({"completed", "busy", "failed", "no-answer", "canceled"})
# a <Stream statusCallback>'s StreamEvent once the stream is gone, or never came up
STREAM_OVER = frozenset({"stream-stopped", "stream-error", "stream-failed"})


def message_of(text: str) -> dict[str, Any]:
    try:
        return object_of(json.loads(text), "a message")
    except json.JSONDecodeError as exc:
        raise CarrierError(f"not JSON: {exc}") from None


def object_of(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CarrierError(f"{what} must be an object")
    return value


def text_of(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise CarrierError(f"{what} must be a non-empty string")
    return value


def caller_audio(message: dict[str, Any]) -> CallerAudio | Ignored:
    """A ``media`` message's base64 payload, if it is the caller's (the ``inbound`` track)."""
    media = object_of(message.get("media"), "media")
    if media.get("track", "inbound") != "inbound":
        return Ignored("media of another track")
    try:
        return CallerAudio(base64.b64decode(text_of(media.get("payload"), "media.payload"), validate=True))
    except binascii.Error:
        raise CarrierError("media.payload is not base64") from None


def media_message(ulaw: bytes, **fields: Any) -> str:
    """A ``media`` message to a carrier, with whatever else it wants beside the payload."""
    return json.dumps({"event": "media", **fields, "media": {"payload": base64.b64encode(ulaw).decode()}})


def shared_event(message: dict[str, Any]) -> CarrierEvent | None:
    """The events the carriers spell alike (``media``, ``mark``, ``dtmf``, ``stop``); None for
    the others, which each carrier reads its own way (``start`` above all)."""
    event = message.get("event")
    if event == "media":
        return caller_audio(message)
    if event == "mark":
        return MarkPlayed(text_of(object_of(message.get("mark"), "mark").get("name"), "mark.name"))
    if event == "dtmf":
        return KeyPressed(text_of(object_of(message.get("dtmf"), "dtmf").get("digit"), "dtmf.digit"))
    if event == "stop":
        return StreamStopped()
    return None


def parameters_of(value: Any, what: str) -> dict[str, str]:
    """A stream's custom parameters: an object of names to values, or a list of ``{name, value}``."""
    if isinstance(value, list):
        pairs = [object_of(item, what) for item in value]
        return {str(p.get("name")): str(p.get("value")) for p in pairs if p.get("name") is not None}
    return {str(k): str(v) for k, v in object_of(value, what).items()}


def form_status(request: Webhook) -> CallEnded | None:
    """A TwiML-style status callback (form fields ``CallSid`` and ``CallStatus``, or a stream's
    ``StreamEvent``): the call is over, or None."""
    call = request.form.get("CallSid")
    if not call:
        raise CarrierError("a status callback without CallSid")
    status, stream = request.form.get("CallStatus", ""), request.form.get("StreamEvent", "")
    if status in CALL_OVER:
        return CallEnded(call, f"the carrier says the call is {status}")
    if stream in STREAM_OVER:
        error = request.form.get("StreamError", "")
        return CallEnded(call, f"the carrier says {stream}{': ' + error if error else ''}")
    return None
