"""A client of the public protocol (docs/protocol.md) for the tests that talk to a real edge."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import websockets
from websockets.asyncio.client import ClientConnection

T = 15.0
Frame = dict[str, Any]


async def create_session(base: str, **body: Any) -> dict[str, Any]:
    """``POST /v1/sessions``: the session id, tokens and WebSocket URL (201 expected)."""
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{base}/v1/sessions", json=body)
    assert response.status_code == 201, response.text
    data: dict[str, Any] = response.json()
    return data


@contextlib.asynccontextmanager
async def connect(
    session: dict[str, Any], role: str = "caller", token: str | None = None, **query: str
) -> AsyncIterator[ClientConnection]:
    if token is None:
        token = session["token"] if role == "caller" else session["listener_token"]
    params = "&".join(f"{k}={v}" for k, v in {"token": token, "role": role, **query}.items())
    async with websockets.connect(f"{session['ws_url']}?{params}", max_size=None) as ws:
        yield ws


async def recv(ws: ClientConnection, timeout: float = T) -> Frame:
    """The next frame, with ``_received`` (``time.monotonic()`` when it was read) added."""
    frame: Frame = json.loads(await asyncio.wait_for(ws.recv(), timeout))
    frame["_received"] = time.monotonic()
    return frame


async def until(ws: ClientConnection, kind: str, log: list[Frame] | None = None, timeout: float = T) -> Frame:
    deadline = time.monotonic() + timeout
    while True:
        frame = await recv(ws, max(0.1, deadline - time.monotonic()))
        if log is not None:
            log.append(frame)
        if frame["type"] == kind:
            return frame


async def say(ws: ClientConnection, text: str) -> None:
    await ws.send(json.dumps({"type": "text", "text": text}))


def chunks(frames: list[Frame]) -> list[tuple[int, int, str]]:
    return [(f["turn"], f["seq"], f["text"]) for f in frames if f["type"] == "agent_chunk"]
