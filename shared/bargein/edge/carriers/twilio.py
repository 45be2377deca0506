"""Twilio Media Streams, bidirectional (``<Connect><Stream>``), as Twilio's "Media Streams -
WebSocket Messages" reference documents them.

From Twilio: ``connected``; ``start`` (``start.streamSid``, ``start.callSid``,
``start.customParameters``); ``media`` (``media.payload``: base64 μ-law 8 kHz of the ``inbound``
track); ``dtmf`` (``dtmf.digit``); ``mark`` (``mark.name``, once the audio sent before it has
played, or was dropped by a ``clear``); ``stop``. To Twilio: ``media``, ``mark`` and ``clear``, each
naming the ``streamSid``.

The webhook's signature (``X-Twilio-Signature``) and its TwiML come from Twilio's own library,
and so does the outbound call (its REST client, pointed at ``BARGEIN_TWILIO_API_URL``).
"""

from __future__ import annotations

import asyncio
import json

from twilio.base.exceptions import TwilioException
from twilio.request_validator import RequestValidator
from twilio.rest import Client
from twilio.twiml.voice_response import Connect, VoiceResponse

from bargein.edge.carriers.abc import (
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


class Twilio(Carrier):
    name = "twilio"

    @property
    def configured(self) -> bool:
        return bool(self.settings.twilio_auth_token)

    def verify(self, request: Webhook) -> None:
        signature = request.headers.get("x-twilio-signature")
        if not signature:
            raise CarrierError("no X-Twilio-Signature: not a request from Twilio")
        validator = RequestValidator(self.settings.twilio_auth_token or "")
        if not validator.validate(request.url, dict(request.form), signature):
            raise CarrierError(
                "X-Twilio-Signature does not match (a forged request, or the wrong auth token)"
            )

    def answer(self, media_url: str, status_url: str, session_id: str, token: str) -> tuple[str, str]:
        response = VoiceResponse()
        connect = Connect()
        stream = connect.stream(url=media_url, status_callback=status_url, status_callback_method="POST")
        stream.parameter(name=SESSION_PARAMETER, value=session_id)
        stream.parameter(name=TOKEN_PARAMETER, value=token)
        response.append(connect)
        return str(response), "text/xml"

    def parse(self, text: str) -> CarrierEvent:
        message = message_of(text)
        shared = shared_event(message)
        if shared is not None:
            return shared
        event = message.get("event")
        if event == "start":
            start = object_of(message.get("start"), "start")
            return StreamStarted(
                stream_id=text_of(start.get("streamSid") or message.get("streamSid"), "start.streamSid"),
                call_id=text_of(start.get("callSid"), "start.callSid"),
                parameters=parameters_of(start.get("customParameters", {}), "start.customParameters"),
            )
        if event == "connected":
            return Ignored("connected")
        raise CarrierError(f"unknown event {event!r}")

    def call_ended(self, request: Webhook) -> CallEnded | None:
        """The call's ``statusCallback`` (set on the number, or by ``bargein dial``) and the
        stream's (set by :meth:`answer`)."""
        return form_status(request)

    def media(self, stream_id: str, ulaw: bytes) -> str:
        return media_message(ulaw, streamSid=stream_id)

    def mark(self, stream_id: str, name: str) -> str:
        return json.dumps({"event": "mark", "streamSid": stream_id, "mark": {"name": name}})

    def clear(self, stream_id: str) -> str:
        return json.dumps({"event": "clear", "streamSid": stream_id})

    def _client(self, what: str) -> Client:
        sid, token = self.settings.twilio_account_sid, self.settings.twilio_auth_token
        if not sid or not token:
            raise CarrierError(f"set BARGEIN_TWILIO_ACCOUNT_SID and BARGEIN_TWILIO_AUTH_TOKEN to {what}")
        client = Client(sid, token)
        client.api.base_url = self.settings.twilio_api_url.rstrip("/")
        return client

    async def transfer(self, call_id: str, to: str) -> None:
        """The call's instructions replaced by ``<Dial>``: the stream ends and Twilio dials ``to``."""
        client = self._client("transfer calls")
        response = VoiceResponse()
        response.dial(to)
        try:
            await asyncio.to_thread(lambda: client.calls(call_id).update(twiml=str(response)))
        except TwilioException as exc:
            raise CarrierError(f"Twilio refused the transfer: {exc}") from exc

    async def dial(self, to: str, from_: str, webhook_url: str, status_url: str | None = None) -> Dialled:
        client = self._client("place calls")
        status = {"status_callback": status_url, "status_callback_method": "POST"} if status_url else {}

        def place() -> Dialled:
            call = client.calls.create(to=to, from_=from_, url=webhook_url, method="POST", **status)
            return Dialled(call_id=str(call.sid), status=str(call.status))

        try:
            return await asyncio.to_thread(place)  # the REST client blocks
        except TwilioException as exc:
            raise CarrierError(f"Twilio refused the call: {exc}") from exc
