"""HTTP pieces every edge endpoint uses alike: who may join a session, the body within its limit,
the addresses clients and carriers reach the edge at, and the answer of an overloaded edge."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse

from bargein.edge.core import Edge
from bargein.edge.protocol import ErrorCode, ErrorFrame
from bargein.edge.tokens import ROLES, Role, TokenError, Tokens
from bargein.wire.envelope import SESSION_ID_PATTERN

log = logging.getLogger("bargein.edge.http")

CLOSE_BAD_REQUEST = 4400
CLOSE_BAD_TOKEN = 4401
CLOSE_UNKNOWN_SESSION = 4404
CLOSE_TRY_AGAIN = 1013


@dataclass(frozen=True)
class Refusal:
    """Why a socket may not join: the frame that says so (for clients that read one) and the
    close code."""

    frame: ErrorFrame
    close_code: int


async def admit(edge: Edge, tokens: Tokens, session_id: str, token: str | None, role: str) -> Role | Refusal:
    """The role a socket joins ``session_id`` in, or why it may not: the one rule for a web
    client's socket and a phone carrier's stream alike (each refusal counted)."""
    try:
        # an unknown session is unknown whatever token comes with it: 4404, not 4401
        known = bool(SESSION_ID_PATTERN.fullmatch(session_id)) and await edge.known(session_id)
    except Exception as exc:  # the state store is down: say so, rather than drop the socket
        edge.count("joins_unavailable")
        log.warning("session %s: cannot look the session up: %s: %s", session_id, type(exc).__name__, exc)
        busy = ErrorFrame(code=ErrorCode.UNAVAILABLE, message="sessions cannot be looked up now; retry")
        return Refusal(busy, CLOSE_TRY_AGAIN)
    if not known:
        edge.count("unknown_sessions")
        unknown = ErrorFrame(code=ErrorCode.UNKNOWN_SESSION, message=f"no session {session_id!r}")
        return Refusal(unknown, CLOSE_UNKNOWN_SESSION)
    try:
        if role not in ROLES:
            raise TokenError(f"role must be one of {ROLES}")
        joined: Role = "caller" if role == "caller" else "listener"
        tokens.check(token, session_id, joined)
    except TokenError as exc:
        edge.count("bad_tokens")
        return Refusal(ErrorFrame(code=ErrorCode.INVALID_TOKEN, message=str(exc)), CLOSE_BAD_TOKEN)
    return joined


async def read_body(request: Request, limit: int) -> bytes | None:
    """The request body, or None once it is over ``limit`` bytes (read no further than that)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def websocket_base(request: Request, public_url: str | None) -> str:
    """``ws://`` or ``wss://`` and the host clients reach the edge at (``BARGEIN_PUBLIC_URL``, else
    the request's own), without a trailing slash."""
    base = (public_url or str(request.base_url)).rstrip("/")
    return base.replace("https://", "wss://", 1).replace("http://", "ws://", 1)


def requested_url(request: Request, public_url: str | None) -> str:
    """The URL a caller requested, as it knows it (a carrier's signature covers it): behind a
    proxy, the edge's public URL with this request's path and query."""
    if public_url is None:
        return str(request.url)
    query = f"?{request.url.query}" if request.url.query else ""
    return f"{public_url.rstrip('/')}{request.url.path}{query}"


def overloaded() -> JSONResponse:
    """New callers go to another edge, or come back in a moment."""
    message = "this edge is overloaded; try again shortly"
    return JSONResponse(
        {"error": {"code": ErrorCode.OVERLOADED, "message": message}},
        status_code=503,
        headers={"Retry-After": "1"},
    )
