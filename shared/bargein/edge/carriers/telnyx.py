"""Telnyx media streaming over TeXML (``<Connect><Stream bidirectionalMode="rtp">``), as Telnyx's
"Media Streaming" and TeXML references document it. How it differs from Twilio's, which is why
it is the second carrier:

* messages are snake case (``stream_id``, ``sequence_number``, ``call_control_id``), and messages
  to Telnyx name no stream;
* ``<Stream codec="PCMU">`` asks Telnyx to hand us μ-law whatever the call's codec; it can
  transcode only between PCMU and PCMA, so a ``start`` may still announce PCMA (taken, and
  decoded as A-law), G.722 (an HD-voice call: taken, and decoded at its 16 kHz) or another codec
  (Opus, AMR-WB: refused, with the reason logged);
* the session and its token go in as ``<Parameter>`` children, which Telnyx hands back in
  ``start.custom_parameters`` (never in the stream URL, where proxies log it);
* status callbacks come as TeXML's form posts (``CallStatus``, ``StreamEvent``, as Twilio's) or,
  from a Call Control application, as JSON events (``call.hangup``), signed the same way;
* webhooks are signed with Ed25519 (``telnyx-signature-ed25519`` over ``<telnyx-timestamp>|<body>``,
  checked with the account's public key, and refused when older than
  ``BARGEIN_PHONE_SIGNATURE_MAX_AGE_S``), not an HMAC of the URL;
* outbound calls go through ``POST /v2/texml/calls/{connection_id}`` with a bearer key.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from xml.sax.saxutils import quoteattr

import httpx
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from bargein.edge.carriers.abc import (
    LINE_CODECS,
    SESSION_PARAMETER,
    TOKEN_PARAMETER,
    CallEnded,
    Carrier,
    CarrierError,
    CarrierEvent,
    Dialled,
    Ignored,
    StreamStarted,
    Webhook,
)
from bargein.edge.carriers.reading import (
    form_status,
    media_message,
    message_of,
    object_of,
    parameters_of,
    shared_event,
    text_of,
)

DIAL_TIMEOUT_S = 15.0
# Call Control's JSON events that mean the call, or its stream, is over
EVENTS_OVER = frozenset({"call.hangup", "streaming.failed", "streaming.stopped"})


class Telnyx(Carrier):
    name = "telnyx"

    @property
    def configured(self) -> bool:
        return bool(self.settings.telnyx_public_key)

    def _public_key(self) -> Ed25519PublicKey:
        try:
            return Ed25519PublicKey.from_public_bytes(base64.b64decode(self.settings.telnyx_public_key or ""))
        except (ValueError, binascii.Error):
            raise CarrierError("BARGEIN_TELNYX_PUBLIC_KEY is not a base64 Ed25519 public key") from None

    def verify(self, request: Webhook) -> None:
        signature = request.headers.get("telnyx-signature-ed25519")
        stamp = request.headers.get("telnyx-timestamp", "")
        if not signature or not stamp.isdigit():
            raise CarrierError("no telnyx-signature-ed25519 / telnyx-timestamp: not a request from Telnyx")
        if abs(time.time() - int(stamp)) > self.settings.phone_signature_max_age_s:
            raise CarrierError("the signed timestamp is too old (a replayed request?)")
        try:
            self._public_key().verify(base64.b64decode(signature), stamp.encode() + b"|" + request.body)
        except (InvalidSignature, binascii.Error):
            raise CarrierError("telnyx-signature-ed25519 does not match (a forged request?)") from None

    def answer(self, media_url: str, status_url: str, session_id: str, token: str) -> tuple[str, str]:
        parameters = "".join(
            f"<Parameter name={quoteattr(name)} value={quoteattr(value)} />"
            for name, value in ((SESSION_PARAMETER, session_id), (TOKEN_PARAMETER, token))
        )
        body = (
            '<?xml version="1.0" encoding="UTF-8"?><Response><Connect>'
            f'<Stream url={quoteattr(media_url)} codec="PCMU" bidirectionalMode="rtp" '
            f'bidirectionalCodec="PCMU" statusCallback={quoteattr(status_url)} statusCallbackMethod="POST">'
            f"{parameters}</Stream></Connect></Response>"
        )
        return body, "text/xml"

    def call_id(self, request: Webhook) -> str | None:
        return request.form.get("CallSid") or request.form.get("CallControlId") or None

    def call_ended(self, request: Webhook) -> CallEnded | None:
        if not request.body.lstrip().startswith(b"{"):
            return form_status(request)  # a TeXML application's status callback
        data = object_of(message_of(request.body.decode("utf-8", "replace")).get("data"), "data")
        payload = object_of(data.get("payload", {}), "data.payload")
        call = payload.get("call_control_id") or payload.get("call_sid")
        if not isinstance(call, str) or not call:
            raise CarrierError("a Telnyx event without data.payload.call_control_id")
        event = data.get("event_type")
        if event not in EVENTS_OVER:
            return None
        cause = payload.get("hangup_cause") or payload.get("failure_reason") or ""
        return CallEnded(call, f"Telnyx says {event}{': ' + str(cause) if cause else ''}")

    def parse(self, text: str) -> CarrierEvent:
        message = message_of(text)
        shared = shared_event(message)
        if shared is not None:
            return shared
        event = message.get("event")
        if event == "start":
            start = object_of(message.get("start"), "start")
            encoding = object_of(start.get("media_format", {}), "start.media_format").get("encoding", "PCMU")
            if encoding not in LINE_CODECS:
                raise CarrierError(
                    f"the stream is {encoding}, which Telnyx could not transcode to PCMU; "
                    f"bargein takes {', '.join(LINE_CODECS)} (set the number's codecs to G.711 or G.722)"
                )
            return StreamStarted(
                stream_id=text_of(message.get("stream_id"), "stream_id"),
                call_id=text_of(start.get("call_control_id"), "start.call_control_id"),
                parameters=parameters_of(start.get("custom_parameters", {}), "start.custom_parameters"),
                encoding=encoding,
            )
        if event in ("connected", "error"):
            return Ignored(str(event))
        raise CarrierError(f"unknown event {event!r}")

    def media(self, stream_id: str, ulaw: bytes) -> str:
        return media_message(ulaw)

    def mark(self, stream_id: str, name: str) -> str:
        return json.dumps({"event": "mark", "mark": {"name": name}})

    def clear(self, stream_id: str) -> str:
        return json.dumps({"event": "clear"})

    async def _post(self, path: str, body: dict[str, str], what: str) -> httpx.Response:
        key = self.settings.telnyx_api_key
        if not key:
            raise CarrierError(f"set BARGEIN_TELNYX_API_KEY to {what}")
        async with httpx.AsyncClient(timeout=DIAL_TIMEOUT_S) as client:
            response = await client.post(
                f"{self.settings.telnyx_api_url.rstrip('/')}{path}",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
            )
        if response.status_code >= 300:
            raise CarrierError(f"Telnyx refused to {what}: HTTP {response.status_code} {response.text[:300]}")
        return response

    async def transfer(self, call_id: str, to: str) -> None:
        """Call Control's ``transfer`` action on the stream's ``call_control_id``."""
        await self._post(f"/v2/calls/{call_id}/actions/transfer", {"to": to}, "transfer calls")

    async def dial(self, to: str, from_: str, webhook_url: str, status_url: str | None = None) -> Dialled:
        connection = self.settings.telnyx_connection_id
        if not connection:
            raise CarrierError("set BARGEIN_TELNYX_CONNECTION_ID (the TeXML application) to place calls")
        call = {"To": to, "From": from_, "Url": webhook_url, "UrlMethod": "POST"}
        if status_url:
            call |= {"StatusCallback": status_url, "StatusCallbackMethod": "POST"}
        reply = (await self._post(f"/v2/texml/calls/{connection}", call, "place calls")).json()
        data = reply.get("data", reply) if isinstance(reply, dict) else {}
        return Dialled(
            call_id=str(data.get("call_sid") or data.get("sid") or ""), status=str(data.get("status", ""))
        )
