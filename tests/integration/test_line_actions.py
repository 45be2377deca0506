"""A Line-style agent that does more than speak, through the three services and a WebSocket
client: its tool calls, tool results and metrics (form-filling's shape), key presses and a
transfer (personal_banking's) reach the caller as frames, in turn order with its words, and a
transfer ends the call for every tier.

The stack is private (its own RabbitMQ node and Redis, ``tests/faults/stack.py``) because its
reasoning process runs the Line dispatcher (``tests.integration.line_agents:by_option``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from tests.client import Frame, connect, create_session, recv, say, until
from tests.faults.stack import FaultStack, fault_stack

T = 30.0
DESK = {"agent": "tests.integration.line_agents:desk"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    path = Path(tmp_path_factory.mktemp("line-actions"))
    with fault_stack(
        path, reasoning=1, speech=0, BARGEIN_AGENT="tests.integration.line_agents:by_option"
    ) as s:
        yield s


def of_turn(frames: list[Frame], turn: int) -> list[Frame]:
    return [f for f in frames if f.get("turn") == turn and f["type"] != "clear"]


async def test_tool_calls_metrics_and_keys_reach_the_caller_in_turn_order(stack: FaultStack) -> None:
    session = await create_session(stack.url, agent_options=DESK)
    async with connect(session) as ws:
        frames: list[Frame] = []
        await say(ws, "answer 42")
        done = await until(ws, "turn_complete", frames, T)
        turn = of_turn(frames, done["turn"])
        assert [f["type"] for f in turn] == [
            "tool_call",
            "log_metric",
            "tool_result",
            "agent_chunk",
            "turn_complete",
        ]
        call, metric, result = turn[0], turn[1], turn[2]
        assert (call["name"], call["arguments"], call["id"]) == ("record_answer", {"answer": "42"}, "call-1")
        assert (metric["name"], metric["value"]) == ("answer", "42")
        assert (result["name"], result["result"]) == ("record_answer", "recorded")
        assert [f["seq"] for f in turn[:-1]] == [0, 1, 2, 3]  # one sequence for the turn's frames
        frames.clear()
        await say(ws, "press 5")
        done = await until(ws, "turn_complete", frames, T)
        assert [(f["type"], f.get("button")) for f in of_turn(frames, done["turn"])][:2] == [
            ("dtmf", "5"),
            ("agent_chunk", None),
        ]


async def test_a_transfer_reaches_the_caller_and_ends_the_call(stack: FaultStack) -> None:
    session = await create_session(stack.url, agent_options=DESK)
    async with connect(session) as ws:
        frames: list[Frame] = []
        await say(ws, "transfer +14155550100")
        ended = await until(ws, "ended", frames, T)
        transfer = next(f for f in frames if f["type"] == "transfer")
        assert transfer["target_phone_number"] == "+14155550100"
        assert transfer["reason"] == "the caller asked for a person"
        assert ended["reason"] == "transferred"
        spoken = "".join(f["text"] for f in frames if f["type"] == "agent_chunk")
        assert spoken == "Transferring you now."
        with pytest.raises(ConnectionClosed):  # the edge closed the socket
            await recv(ws, timeout=5)


OUTBOUND = {"agent": "tests.integration.line_agents:outbound"}


async def test_a_pre_call_handler_gives_the_call_its_metadata(stack: FaultStack) -> None:
    session = await create_session(stack.url, agent_options={**OUTBOUND, "to": "+15555555555"})
    async with connect(session) as ws:
        frames: list[Frame] = []
        await until(ws, "turn_complete", frames, T)
        greeting = "".join(f["text"] for f in frames if f["type"] == "agent_chunk")
        assert greeting == "Hello +15555555555, with extra care."


async def test_a_call_the_pre_call_handler_rejects_is_ended(stack: FaultStack) -> None:
    session = await create_session(stack.url, agent_options={**OUTBOUND, "to": "911"})
    async with connect(session) as ws:
        frames: list[Frame] = []
        ended = await until(ws, "ended", frames, T)
        assert ended["reason"] == "rejected", frames
        assert not [f for f in frames if f["type"] == "agent_chunk"]


KEYS = {"agent": "tests.integration.line_agents:keys"}


async def press(ws: ClientConnection, button: str) -> None:
    await ws.send(json.dumps({"type": "dtmf", "button": button}))


async def test_two_quick_key_presses_give_one_answer(stack: FaultStack) -> None:
    session = await create_session(stack.url, agent_options={**KEYS, "debounce_s": 0.5})
    async with connect(session) as ws:
        frames: list[Frame] = []
        await press(ws, "1")
        await press(ws, "2")
        done = await until(ws, "turn_complete", frames, T)
        assert "".join(f["text"] for f in of_turn(frames, done["turn"]) if f["type"] == "agent_chunk") == (
            "You pressed 12."
        )
        with pytest.raises(TimeoutError):  # and no second answer
            await until(ws, "agent_chunk", frames, 1.5)


async def test_a_key_being_debounced_holds_up_neither_a_barge_in_nor_the_next_turn(stack: FaultStack) -> None:
    """Measured before the fix (in process): a barge-in waited 0.82 s behind a debouncing key, and
    15 more chunks reached the caller. Here the debounce is 3 s: nothing may wait for it."""
    session = await create_session(stack.url, agent_options={**KEYS, "debounce_s": 3.0})
    async with connect(session) as ws:
        frames: list[Frame] = []
        await say(ws, "story")
        story = await until(ws, "agent_chunk", frames, T)
        pressed_at = time.monotonic()
        await press(ws, "5")  # cuts the story off (interrupt_on DTMFInputEvent); its debounce sleeps 3 s
        cut = await until(ws, "clear", frames, T)
        assert cut["turn"] == story["turn"] and cut["_received"] - pressed_at < 2.0
        asked_at = time.monotonic()
        await say(ws, "story")  # while the key is still being debounced
        again = await until(ws, "agent_chunk", frames, T)
        assert again["turn"] > story["turn"] and again["_received"] - asked_at < 2.0


async def test_an_agent_that_cannot_start_ends_the_call_with_the_reason_instead_of_hanging(
    stack: FaultStack,
) -> None:
    session = await create_session(
        stack.url, agent_options={"agent": "tests.integration.line_agents:no_such"}
    )
    async with connect(session) as ws:
        frames: list[Frame] = []
        ended = await until(ws, "ended", frames, T)
        (error,) = [f for f in frames if f["type"] == "error"]
        assert error["code"] == "agent_error" and "could not start" in error["message"]
        assert ended["reason"] == "agent"
    await asyncio.sleep(1.0)  # and no worker keeps trying it
    log = "\n".join(p.log() for p in stack.cluster.processes)
    assert log.count("could not start") <= 2 and "looking for orphaned sessions failed" not in log
