"""Phone calls: a carrier's voice webhook and media stream, joined to a session like any caller.

The path of a call (docs/telephony.md):

1. The carrier POSTs ``/v1/<carrier>/voice`` when a call comes in (or an outbound one is answered).
   The signature is checked, a session is created, and the reply is markup that connects the
   call's audio to ``/v1/<carrier>/media`` with the session and a caller token.
2. The carrier opens that WebSocket and announces the stream; the token is checked as any
   caller's, and the stream joins the session as a caller that hears audio and reports playback.
3. The caller's G.711 at 8 kHz becomes PCM16 16 kHz for the speech tier; key presses become DTMF
   events; the hang-up ends the session on every tier.
5. The carrier's status callbacks (``/v1/<carrier>/status``, signed like the voice webhook) end the
   session of a call that is over without a stream to say so: the caller hung up before it
   started, or it failed. A stream that has not started ``BARGEIN_PHONE_STREAM_WAIT_S`` after the
   webhook answered ends the session too.
4. The agent's voice goes out as μ-law frames with a mark after each word: the carrier echoes a
   mark when the caller has heard it, which is what the history keeps after a barge-in. A barge-in
   (and the soft barge-in's pause) sends ``clear``; marks the carrier echoes for audio a clear
   dropped are not counted as heard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from bargein.edge.carriers.abc import (
    SESSION_PARAMETER,
    TOKEN_PARAMETER,
    CallerAudio,
    Carrier,
    CarrierError,
    KeyPressed,
    MarkPlayed,
    StreamStarted,
    StreamStopped,
    Webhook,
)
from bargein.edge.carriers.codec import LineAudio
from bargein.edge.carriers.telnyx import Telnyx
from bargein.edge.carriers.twilio import Twilio
from bargein.edge.core import AudioOut, Connection, Edge, Frame
from bargein.edge.http import Refusal, admit, overloaded, read_body, requested_url, websocket_base
from bargein.edge.protocol import AnyServerFrame, AudioMark, Clear, End, KeyPress, Pause, TransferFrame
from bargein.edge.tokens import Tokens
from bargein.errors import BrokerUnavailable
from bargein.settings import TelephonySettings

log = logging.getLogger("bargein.edge.phone")

CARRIERS: dict[str, type[Carrier]] = {carrier.name: carrier for carrier in (Twilio, Telnyx)}
LINE_AUDIO = "mulaw"  # a phone connection's audio (the carrier's codec; the wire converts)
VOICE_QUERY = "voice"  # ``/v1/<carrier>/voice?voice=...`` picks the agent's voice
TRANSFER_WAIT_S = 10.0  # how long a transferred call's stream stays open for the REST call
CALL_RECORD_MS = 12 * 3600 * 1000  # how long a call id names its session (longer than any call)


def status_url_for(webhook_url: str) -> str | None:
    """The status callback beside a voice webhook (``.../v1/<carrier>/voice`` → ``.../status``)."""
    parts = urlsplit(webhook_url)
    if not parts.path.endswith("/voice"):
        return None
    return urlunsplit(parts._replace(path=parts.path.removesuffix("/voice") + "/status", query=""))


def carriers_from(settings: TelephonySettings) -> dict[str, Carrier]:
    return {name: cls(settings) for name, cls in CARRIERS.items()}


class CarrierWire:
    """What a session says to one phone call, in its carrier's messages (see :class:`~.core.Wire`)."""

    drops_buffer_on_pause = True  # a carrier cannot pause playback: a pause is a clear and a rewind

    def __init__(
        self, ws: WebSocket, carrier: Carrier, stream_id: str, call_id: str, encoding: str = "PCMU"
    ) -> None:
        self.ws = ws
        self.carrier = carrier
        self.stream_id = stream_id
        self.call_id = call_id
        self._transfer: asyncio.Task[None] | None = None
        self.line = LineAudio(encoding)
        self._pending: set[str] = set()  # marks sent, not yet echoed
        self._dropped: set[str] = set()  # marks a clear threw away: their echo is not "heard"

    async def send(self, frame: Frame) -> None:
        if isinstance(frame, AudioOut):
            for chunk in self.line.to_line(frame.pcm):
                await self.ws.send_text(self.carrier.media(self.stream_id, chunk))
        elif isinstance(frame, AudioMark):
            name = f"{frame.turn}.{frame.mark}"
            self._pending.add(name)
            await self.ws.send_text(self.carrier.mark(self.stream_id, name))
        elif isinstance(frame, Clear | Pause):
            self.line.drop_pending()
            self._dropped |= self._pending
            self._pending.clear()
            await self.ws.send_text(self.carrier.clear(self.stream_id))
        elif isinstance(frame, TransferFrame) and self._transfer is None:
            # its own task: the session ends right after, and the stream must stay open until the
            # carrier has the new instructions (when it closes first, the call simply ends)
            self._transfer = asyncio.create_task(self._move(frame.target_phone_number))
        # text, transcripts and the rest are for screens: a phone line has none

    async def _move(self, to: str) -> None:
        try:
            await self.carrier.transfer(self.call_id, to)
            log.info("%s call %s transferred to %s", self.carrier.name, self.call_id, to)
        except CarrierError as exc:
            log.warning("%s call %s: the transfer to %s failed: %s", self.carrier.name, self.call_id, to, exc)

    def played(self, name: str) -> tuple[int, int] | None:
        """The (turn, mark) the caller has now heard, from the carrier's echo of mark ``name``;
        None for a mark a clear dropped, or one that is not ours."""
        if name in self._dropped:
            self._dropped.discard(name)
            return None
        self._pending.discard(name)
        turn, _, mark = name.partition(".")
        if not (turn.isdigit() and mark.isdigit()):
            return None
        return int(turn), int(mark)

    async def close(self, code: int, last: AnyServerFrame | None) -> None:
        if self._transfer is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._transfer), TRANSFER_WAIT_S)
        try:
            await self.ws.close(code)
        except Exception as exc:  # already gone
            log.debug("closing a %s stream: %s", self.carrier.name, exc)


def phone_routes(
    edge: Edge,
    tokens: Tokens,
    carriers: Mapping[str, Carrier],
    *,
    public_url: str | None,
    agent_options: Mapping[str, Any],
    max_body_bytes: int,
) -> list[BaseRoute]:
    """``/v1/<carrier>/voice`` and ``/v1/<carrier>/media`` for each carrier."""

    def refuse(carrier: Carrier, why: str, status: int = 403, *, detail: str = "") -> Response:
        """Refuse a webhook, saying why; ``detail`` is for the log only (never for the requester)."""
        edge.count(f"{carrier.name}_webhooks_refused")
        log.warning("%s webhook refused: %s%s", carrier.name, why, detail)
        return JSONResponse({"error": {"code": "forbidden", "message": why}}, status_code=status)

    async def verified(carrier: Carrier, request: Request) -> Webhook | Response:
        """The carrier's request, signature checked; or the refusal to reply with."""
        if not carrier.configured:
            return refuse(carrier, f"{carrier.name} is not configured on this edge (docs/telephony.md)")
        body = await read_body(request, max_body_bytes)
        if body is None:
            return refuse(carrier, "the body is too large", 413)
        form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        webhook = Webhook(requested_url(request, public_url), dict(request.headers), body, form)
        try:
            carrier.verify(webhook)
        except CarrierError as exc:
            whose = "BARGEIN_PUBLIC_URL" if public_url else "the request as this process sees it"
            if public_url is None:
                whose += " (behind a proxy, set BARGEIN_PUBLIC_URL to the URL the carrier calls)"
            return refuse(carrier, str(exc), detail=f"; checked against {webhook.url}, from {whose}")
        return webhook

    def voice_endpoint(carrier: Carrier) -> Callable[[Request], Any]:
        async def voice(request: Request) -> Response:
            webhook = await verified(carrier, request)
            if isinstance(webhook, Response):
                return webhook
            if edge.overloaded:
                edge.count("sessions_refused_overloaded")
                return overloaded()
            query = dict(request.query_params)
            voice_name = query.pop(VOICE_QUERY, None)
            session_id = await edge.create_session(
                {**agent_options, **query},
                {},
                voice_name,
                join_within_s=carrier.settings.phone_stream_wait_s,  # a stream never opened ends it
            )
            call_id = carrier.call_id(webhook)
            if call_id is not None:  # its status callbacks name the call, not the session
                await edge.store.note_call(carrier.name, call_id, session_id, CALL_RECORD_MS)
            edge.count(f"{carrier.name}_calls")
            media_url = f"{websocket_base(request, public_url)}/v1/{carrier.name}/media"
            status_url = status_url_for(requested_url(request, public_url)) or ""
            token = tokens.issue(session_id, "caller")
            markup, media_type = carrier.answer(media_url, status_url, session_id, token)
            log.info("session %s: a %s call (%s), answered", session_id, carrier.name, call_id or "?")
            return Response(markup, media_type=media_type)

        return voice

    def status_endpoint(carrier: Carrier) -> Callable[[Request], Any]:
        async def status(request: Request) -> Response:
            webhook = await verified(carrier, request)
            if isinstance(webhook, Response):
                return webhook
            try:
                ended = carrier.call_ended(webhook)
            except CarrierError as exc:
                edge.count(f"{carrier.name}_bad_status")
                log.warning("%s status callback: %s", carrier.name, exc)
                return JSONResponse({"error": {"code": "bad_request", "message": str(exc)}}, status_code=400)
            if ended is None:  # ringing, answered, the stream started: nothing to do
                return Response(status_code=204)
            session_id = await edge.store.session_of_call(carrier.name, ended.call_id)
            if session_id is None:  # not a call of ours, or one long over
                edge.count(f"{carrier.name}_status_unknown_call")
                log.info("%s call %s: %s; no session answers it", carrier.name, ended.call_id, ended.why)
                return Response(status_code=204)
            edge.count(f"{carrier.name}_calls_ended_by_status")
            await edge.end_call(session_id, f"{carrier.name} call {ended.call_id}: {ended.why}")
            return Response(status_code=204)

        return status

    def media_endpoint(carrier: Carrier) -> Callable[[WebSocket], Any]:
        async def media(ws: WebSocket) -> None:
            await ws.accept()
            call = _Call(edge, tokens, carrier, ws)
            try:
                while not call.over:
                    incoming = await ws.receive()
                    if incoming["type"] == "websocket.disconnect":
                        break
                    await call.handle(incoming.get("text"))
            except WebSocketDisconnect:
                pass
            finally:
                await call.hang_up()

        return media

    routes: list[BaseRoute] = []
    for carrier in carriers.values():
        routes.append(Route(f"/v1/{carrier.name}/voice", voice_endpoint(carrier), methods=["POST"]))
        routes.append(Route(f"/v1/{carrier.name}/status", status_endpoint(carrier), methods=["POST"]))
        routes.append(WebSocketRoute(f"/v1/{carrier.name}/media", media_endpoint(carrier)))
    return routes


class _Call:
    """One carrier stream, from its ``start`` to its ``stop``."""

    def __init__(self, edge: Edge, tokens: Tokens, carrier: Carrier, ws: WebSocket) -> None:
        self.edge, self.tokens, self.carrier, self.ws = edge, tokens, carrier, ws
        self.connection: Connection | None = None
        self.wire: CarrierWire | None = None
        self.over = False

    def _bad(self, what: str) -> None:
        self.edge.count(f"{self.carrier.name}_bad_messages")
        log.warning("%s stream: %s", self.carrier.name, what)

    async def handle(self, text: str | None) -> None:
        if text is None:
            self._bad("a binary message (the protocol is JSON text)")
            return
        try:
            event = self.carrier.parse(text)
        except CarrierError as exc:
            self._bad(str(exc))
            return
        if isinstance(event, StreamStarted):
            await self._start(event)
            return
        if self.connection is None or self.wire is None:
            if not isinstance(event, StreamStopped):
                self.edge.count(f"{self.carrier.name}_before_start")
            return
        try:
            if isinstance(event, CallerAudio):
                pcm = self.wire.line.from_line(event.payload)
                if pcm:
                    await self.edge.client_audio(self.connection, pcm)  # refusals are counted there
            elif isinstance(event, KeyPressed):
                try:
                    key = KeyPress(type="dtmf", button=event.digit)
                except ValueError:
                    self._bad(f"not a keypad digit: {event.digit!r}")
                    return
                await self.edge.client_message(self.connection, key)
            elif isinstance(event, MarkPlayed):
                heard = self.wire.played(event.name)
                if heard is not None:
                    self.connection.session.played_mark(*heard)
            elif isinstance(event, StreamStopped):
                await self.hang_up()
        except BrokerUnavailable as exc:  # a phone line cannot be told: counted, and the call goes on
            self.edge.count("unavailable")
            log.warning("session %s: %s", self.connection.session.session_id, exc)

    async def _start(self, event: StreamStarted) -> None:
        if self.connection is not None:
            self._bad("a second start")
            return
        # from the stream's start only: a token in the URL would be in every proxy's access log
        session_id = event.parameters.get(SESSION_PARAMETER, "")
        token = event.parameters.get(TOKEN_PARAMETER)
        admitted = await admit(self.edge, self.tokens, session_id, token, "caller")
        if isinstance(admitted, Refusal):  # a carrier reads no frame: the reason is logged
            log.warning("%s stream %s: %s", self.carrier.name, event.stream_id, admitted.frame.message)
            await self.ws.close(admitted.close_code)
            self.over = True
            return
        self.wire = CarrierWire(self.ws, self.carrier, event.stream_id, event.call_id, event.encoding)
        self.connection = await self.edge.join(session_id, self.wire, "caller", True, LINE_AUDIO)
        with contextlib.suppress(Exception):  # (the voice webhook's call id names it already)
            await self.edge.store.note_call(self.carrier.name, event.call_id, session_id, CALL_RECORD_MS)
        log.info(
            "session %s: %s stream %s of call %s joined (%s)",
            session_id,
            self.carrier.name,
            event.stream_id,
            event.call_id,
            event.encoding,
        )

    async def hang_up(self) -> None:
        """The caller is gone (``stop``, or the stream dropped: a carrier never reconnects one):
        the session ends on every tier."""
        if self.over:
            return
        self.over = True
        if self.connection is None:
            return
        connection, started = self.connection, time.monotonic()
        self.edge.leave(connection)
        if not connection.session.ended:
            try:
                await self.edge.client_message(connection, End(type="end"))
            except Exception as exc:  # the broker is away: the owners end it when idle
                log.warning("session %s: hang-up not told: %s", connection.session.session_id, exc)
        log.info(
            "session %s: the %s caller hung up (%.0f ms to end it)",
            connection.session.session_id,
            self.carrier.name,
            (time.monotonic() - started) * 1000,
        )
