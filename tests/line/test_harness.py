"""``bargein.line.harness.ConversationHarness`` over a real WebSocket: a Starlette app served by
uvicorn on loopback, and a client speaking Line's harness protocol to it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
import websockets
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket

from bargein.line import Bridge, Bus
from bargein.line import harness_types as t
from bargein.line.events import DTMFInputEvent, UserStartedSpeaking, UserTranscriptionReceived
from bargein.line.harness import ConversationHarness

from . import wait_for


class Served:
    """What the server side saw: the events the harness's input became, through a bus."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.done = asyncio.Event()


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, Served]]:
    served = Served()

    async def endpoint(websocket: WebSocket) -> None:
        await websocket.accept()
        shutdown = asyncio.Event()
        harness = ConversationHarness(websocket, shutdown)
        bus = Bus()
        user = Bridge("user").with_input_routing(harness)
        agent = Bridge("agent")
        agent.on(UserTranscriptionReceived).map(lambda m: served.events.append(m.event))
        agent.on(UserStartedSpeaking).map(lambda m: served.events.append(m.event))
        agent.on(DTMFInputEvent).map(lambda m: served.events.append(m.event))
        bus.register_bridge("user", user)
        bus.register_bridge("agent", agent)
        await harness.start()
        await bus.start()
        await user.start()
        # answer with three messages at once: they must arrive in the order they were sent
        await wait_for(lambda: len(served.events) == 3)
        await asyncio.gather(*(harness.send_message(f"reply {i}") for i in range(3)))
        await harness.end_call()
        await shutdown.wait()  # the client hangs up
        await user.stop()
        await bus.cleanup()
        await harness.cleanup()
        served.done.set()

    app = Starlette(routes=[WebSocketRoute("/ws", endpoint)])
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    uv = uvicorn.Server(config)
    task = asyncio.create_task(uv.serve())
    await wait_for(lambda: uv.started, timeout=10)
    try:
        port = uv.servers[0].sockets[0].getsockname()[1]  # port 0: the system picked a free one
        yield f"ws://127.0.0.1:{port}/ws", served
    finally:
        uv.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)


async def test_the_harness_turns_lines_protocol_into_events_and_replies_in_order(
    server: tuple[str, Served],
) -> None:
    url, served = server
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"type": "user_state", "value": "speaking"}))
        await ws.send(json.dumps({"type": "not-a-line-message"}))  # logged and skipped
        await ws.send(json.dumps({"type": "message", "content": "hello"}))
        await ws.send(json.dumps({"type": "dtmf", "button": "5"}))
        replies = [json.loads(await asyncio.wait_for(ws.recv(), 10)) for _ in range(4)]
    await asyncio.wait_for(served.done.wait(), 10)
    assert served.events == [
        UserStartedSpeaking(),
        UserTranscriptionReceived(content="hello"),
        DTMFInputEvent(button="5"),
    ]
    assert replies == [
        {"type": "message", "content": "reply 0"},
        {"type": "message", "content": "reply 1"},
        {"type": "message", "content": "reply 2"},
        {"type": "end_call"},
    ]


async def test_map_to_events_covers_every_input_type() -> None:
    harness = ConversationHarness(websocket=None, shutdown_event=asyncio.Event())  # type: ignore[arg-type]
    kinds = [
        type(e).__name__
        for message in (
            t.UserStateInput(value="idle"),
            t.AgentStateInput(value="speaking"),
            t.AgentStateInput(value="idle"),
            t.AgentSpeechInput(content="Hi"),
            t.CustomInput(metadata={"k": 1}),
            t.ValidationErrorInput(error_message="bad", error_type="x"),
        )
        for e in harness.map_to_events(message)
    ]
    assert kinds == [
        "UserStoppedSpeaking",
        "AgentStartedSpeaking",
        "AgentStoppedSpeaking",
        "AgentSpeechSent",
        "CustomReceived",
        "UserUnknownInputReceived",
    ]
