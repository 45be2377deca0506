"""The HTTP and WebSocket surface of the edge (docs/protocol.md), on Starlette.

Handlers only translate between the wire and :class:`~bargein.edge.core.Edge`: parse and
check what a client sent, answer with the protocol's frames and codes.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket, WebSocketDisconnect

from bargein import metrics, tracing
from bargein.edge.carriers.abc import Carrier
from bargein.edge.core import Connection, Edge, JsonWire
from bargein.edge.http import (
    CLOSE_BAD_REQUEST,
    CLOSE_TRY_AGAIN,
    Refusal,
    admit,
    overloaded,
    read_body,
    websocket_base,
)
from bargein.edge.phone import phone_routes
from bargein.edge.protocol import (
    AUDIO_FORMATS,
    ErrorCode,
    ErrorFrame,
    Played,
    ProtocolError,
    SessionRequest,
    frame_json,
    parse,
)
from bargein.edge.tokens import Role, Tokens
from bargein.errors import BrokerUnavailable
from bargein.settings import DEFAULT_MAX_BODY_BYTES

log = logging.getLogger("bargein.edge.http")

STATIC = Path(__file__).resolve().parent / "static"


def _bad_request(message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": "bad_request", "message": message}}, status_code=400)


async def _refuse(ws: WebSocket, frame: ErrorFrame, code: int) -> None:
    await ws.send_json(frame_json(frame))
    await ws.close(code)


def create_app(
    edge: Edge,
    tokens: Tokens,
    *,
    public_url: str | None = None,
    ready: Any = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    about: dict[str, Any] | None = None,
    carriers: Mapping[str, Carrier] | None = None,
    phone_agent_options: Mapping[str, Any] | None = None,
) -> Starlette:
    async def create_session(request: Request) -> Response:
        raw = await read_body(request, max_body_bytes)
        if raw is None:
            edge.count("bodies_too_large")
            message = f"the body is larger than {max_body_bytes} bytes"
            return JSONResponse({"error": {"code": "too_large", "message": message}}, status_code=413)
        try:
            body = SessionRequest.parse(raw)
        except ProtocolError as exc:
            edge.count("bad_requests")
            return _bad_request(exc.message)
        if edge.overloaded:
            edge.count("sessions_refused_overloaded")
            return overloaded()
        session_id = await edge.create_session(body.agent_options, body.turn_taking, body.voice)
        ws_base = websocket_base(request, public_url)
        return JSONResponse(
            {
                "session_id": session_id,
                "token": tokens.issue(session_id, "caller"),
                "listener_token": tokens.issue(session_id, "listener"),
                "ws_url": f"{ws_base}/v1/sessions/{session_id}/ws",
            },
            status_code=201,
        )

    async def session_socket(ws: WebSocket) -> None:
        session_id = ws.path_params["session_id"]
        role_param = ws.query_params.get("role", "caller")
        role = await admit(edge, tokens, session_id, ws.query_params.get("token"), role_param)
        audio = ws.query_params.get("audio", "none")
        if not isinstance(role, Refusal) and audio != "none" and audio not in AUDIO_FORMATS:
            edge.count("bad_audio_formats")
            formats = ", ".join(("none", *AUDIO_FORMATS))
            bad = ErrorFrame(code=ErrorCode.BAD_AUDIO_FORMAT, message=f"audio must be one of {formats}")
            role = Refusal(bad, CLOSE_BAD_REQUEST)
        if not isinstance(role, Refusal):
            # listen before the socket opens: from the moment the client sees it open, whatever the
            # agent says reaches it (a session another edge created is not bound here yet)
            role = await _listen(session_id, role)
        await ws.accept()
        if isinstance(role, Refusal):
            await _refuse(ws, role.frame, role.close_code)
            return
        reports = ws.query_params.get("reports") == "played"
        hears = None if audio == "none" else audio
        connection = await edge.join(session_id, JsonWire(ws), role, reports, hears)
        try:
            while True:
                incoming = await ws.receive()
                if incoming["type"] == "websocket.disconnect":
                    break
                reply = await _handle_incoming(incoming, connection)
                if reply is not None:
                    connection.outbox.put_first(reply)
        except WebSocketDisconnect:
            pass
        finally:
            edge.leave(connection)

    async def _listen(session_id: str, role: Role) -> Role | Refusal:
        try:
            await edge.listen(session_id)
        except Exception as exc:  # the broker is away (a restart): the client may retry
            edge.count("joins_unavailable")
            log.warning("session %s: cannot listen for it now: %s: %s", session_id, type(exc).__name__, exc)
            busy = ErrorFrame(code=ErrorCode.UNAVAILABLE, message="the session cannot be joined now; retry")
            return Refusal(busy, CLOSE_TRY_AGAIN)
        return role

    async def _handle_incoming(incoming: Mapping[str, Any], connection: Connection) -> ErrorFrame | None:
        if connection.role != "caller":
            return ErrorFrame(code=ErrorCode.LISTENER_CANNOT_SEND, message="listeners only receive")
        data = incoming.get("bytes")
        try:
            if data is not None:
                return await edge.client_audio(connection, data)
            try:
                message = parse(incoming.get("text") or "")
            except ProtocolError as exc:
                edge.count(f"bad_{exc.code}")
                return exc.frame()
            if isinstance(message, Played):  # a report a word: counted, not a span each
                edge.count("played_reports")
                return await edge.client_message(connection, message)
            with tracing.span(
                f"client {message.type}", kind=SpanKind.SERVER, session=connection.session.session_id
            ):
                return await edge.client_message(connection, message)
        except BrokerUnavailable as exc:  # said aloud, never lost in silence; the socket stays open
            edge.count("unavailable")
            log.warning(
                "session %s: what the caller sent was not taken: %s", connection.session.session_id, exc
            )
            return ErrorFrame(code=ErrorCode.UNAVAILABLE, message=f"{exc}; say it again shortly")
        return None

    async def info(request: Request) -> Response:
        """What a client may offer its user: the agent's voices, whether replies are scripted."""
        return JSONResponse(about or {})

    async def scrape(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=metrics.CONTENT_TYPE)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        problems = await ready() if ready is not None else []
        if problems:
            return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def index(request: Request) -> Response:
        page = STATIC / "index.html"
        if not page.exists():
            return JSONResponse({"error": "the web client is not installed"}, status_code=404)
        return FileResponse(page)

    routes = [
        Route("/", index),
        Route("/healthz", healthz),
        Route("/v1/info", info),
        Route("/metrics", scrape),
        Route("/readyz", readyz),
        Route("/v1/sessions", create_session, methods=["POST"]),
        WebSocketRoute("/v1/sessions/{session_id}/ws", session_socket),
    ]
    routes += phone_routes(
        edge,
        tokens,
        carriers or {},
        public_url=public_url,
        agent_options=phone_agent_options or {},
        max_body_bytes=max_body_bytes,
    )
    if STATIC.is_dir():
        routes.append(Mount("/static", StaticFiles(directory=STATIC), name="static"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await edge.start()
        try:
            yield
        finally:
            await edge.stop()

    return Starlette(routes=routes, lifespan=lifespan)
