"""Bad input gets a clear error, is counted, and never crashes a service or costs another session.

Each case was measured from outside before it was fixed: a 50 MB session request accepted (and then
re-read by every worker each second), ``turn_taking`` taking NaN, booleans and negatives, deeply
nested JSON answered with 1006 or 500, a forged token for an unknown session answered 1006, 300
rejoins at once after an edge restart answered 1006, whole bodies kept in the dead-letter queue, and
one bus message with epoch 10^9 taking over the edge's fence.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
import websockets

from bargein.agent.events import AgentResponse
from bargein.transport.amqp import DEAD_BODY_HEAD, DEAD_QUEUE_MAX_BYTES
from bargein.wire.envelope import Envelope, encode
from bargein.wire.names import DEAD_QUEUE, EVENTS_EXCHANGE, OUT, routing_key
from tests.client import Frame, connect, create_session, recv, say, until
from tests.faults.stack import FaultStack, fault_stack

PROBE = {"agent": "tests.integration.agents:probe", "tail": 10, "word_delay": 0.02}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    with fault_stack(Path(tmp_path_factory.mktemp("bad-input")), reasoning=1, speech=0) as running:
        yield running


async def answer(session: dict[str, Any], text: str = "still here") -> str:
    """Say ``text`` and return the answer's text (the probe echoes it, then its tail)."""
    async with connect(session) as ws:
        await say(ws, text)
        frames: list[Frame] = []
        await until(ws, "turn_complete", frames)
    return "".join(f["text"] for f in frames if f["type"] == "agent_chunk")


async def test_an_oversized_session_request_is_413_and_a_normal_one_still_works(stack: FaultStack) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        huge = {"agent_options": {"blob": "x" * (50 * 1024 * 1024)}}
        too_big = await client.post(f"{stack.url}/v1/sessions", content=json.dumps(huge))
        just_over = await client.post(
            f"{stack.url}/v1/sessions", json={"agent_options": {"blob": "x" * 70_000}}
        )
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "too_large"
    assert just_over.status_code == 413
    assert (await answer(await create_session(stack.url, agent_options=PROBE))).startswith("still here")


@pytest.mark.parametrize(
    "turn_taking",
    [
        {"min_silence_ms": float("nan")},
        {"min_silence_ms": float("inf")},
        {"min_interruption_ms": True},
        {"min_interruption_ms": -5},
        {"speech_threshold": 7},
        {"min_silence_ms": "600"},
        {"vad_tick_ms": 4},
    ],
)
async def test_turn_taking_takes_finite_numbers_in_range_only(stack: FaultStack, turn_taking: Any) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{stack.url}/v1/sessions", content=json.dumps({"turn_taking": turn_taking})
        )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "bad_request"


async def test_deeply_nested_json_is_a_400_or_an_error_frame_never_a_crash(stack: FaultStack) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    async with httpx.AsyncClient() as client:
        body = await client.post(f"{stack.url}/v1/sessions", content='{"agent_options": {"a": ' + deep + "}}")
        twenty_deep: Any = 1
        for _ in range(20):
            twenty_deep = [twenty_deep]
        nested_options = await client.post(
            f"{stack.url}/v1/sessions", json={"agent_options": {"a": twenty_deep}}
        )
    assert body.status_code in (400, 413), body.text
    assert nested_options.status_code == 400
    session = await create_session(stack.url, agent_options=PROBE)
    async with connect(session) as ws:
        await ws.send('{"type": ' + deep + "}")
        assert (await until(ws, "error"))["code"] == "malformed_json"
        await say(ws, "the socket stays open")
        frames: list[Frame] = []
        await until(ws, "turn_complete", frames)
    assert "".join(f["text"] for f in frames if f["type"] == "agent_chunk").startswith("the socket")


async def test_an_unknown_session_is_4404_whatever_the_token(stack: FaultStack) -> None:
    real = await create_session(stack.url, agent_options=PROBE)
    base = real["ws_url"].rsplit("/v1/", 1)[0]

    async def attempt(i: int) -> tuple[int, str]:
        token = ["forged.token.value", real["token"], ""][i % 3]
        url = f"{base}/v1/sessions/no-such-session-{i}/ws?token={token}"
        async with websockets.connect(url) as ws:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 15))
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 15)
        assert closed.value.rcvd is not None
        return closed.value.rcvd.code, frame["code"]

    results = await asyncio.gather(*(attempt(i) for i in range(300)))
    assert set(results) == {(4404, "unknown_session")}, sorted(set(results))


async def test_hundreds_of_clients_rejoining_at_once_are_all_let_in(stack: FaultStack) -> None:
    sessions = [await create_session(stack.url, agent_options=PROBE) for _ in range(30)]
    stack.edges[-1].terminate()
    stack.start("broadcast")  # a fresh edge process that knows none of them yet
    stack.wait_ready()
    ws_base = stack.url.replace("http://", "ws://")
    sessions = [{**s, "ws_url": f"{ws_base}/v1/sessions/{s['session_id']}/ws"} for s in sessions]

    async def rejoin(session: dict[str, Any]) -> str:
        async with connect(session, role="listener") as ws:
            try:
                frame = await recv(ws, timeout=1.0)
            except TimeoutError:
                return "joined"  # let in: nothing to hear yet, and no refusal
            return f"got {frame}"

    results = await asyncio.gather(*(rejoin(sessions[i % len(sessions)]) for i in range(300)))
    assert results == ["joined"] * 300
    assert (await answer(sessions[0])).startswith("still here")


async def test_the_dead_letter_queue_keeps_reasons_and_heads_not_whole_bodies(stack: FaultStack) -> None:
    session = await create_session(stack.url, agent_options=PROBE)
    sid = session["session_id"]
    async with connect(session) as ws:  # the owner consumes the session's mailbox from now on
        await say(ws, "warm up")
        await until(ws, "turn_complete")
    connection = await aio_pika.connect(stack.rabbit.url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange(EVENTS_EXCHANGE)
        junk = b"\xc1" + b"j" * (1024 * 1024)  # a megabyte: over the message limit
        for _ in range(40):  # (to the session's partition, as the edge would)
            message = aio_pika.Message(junk, headers=stack.in_headers(sid))
            await exchange.publish(message, routing_key(sid, "in", "AgentResponse"))
        await asyncio.sleep(2)
        queue = await channel.declare_queue(DEAD_QUEUE, passive=True)
        message = await queue.get(fail=False)
    assert message is not None
    assert message.headers["x-bargein-reason"] == "too_large"
    assert message.headers["x-bargein-body-bytes"] == len(junk)
    assert len(message.body) == DEAD_BODY_HEAD
    assert stack.rabbit.queue_bytes(DEAD_QUEUE) <= DEAD_QUEUE_MAX_BYTES
    assert "still here" in await answer(session)  # the session carried on


async def test_a_forged_owner_epoch_on_the_bus_is_dropped(stack: FaultStack) -> None:
    session = await create_session(stack.url, agent_options=PROBE)
    sid = session["session_id"]
    async with connect(session) as ws:
        await say(ws, "first")
        await until(ws, "turn_complete")
        connection = await aio_pika.connect(stack.rabbit.url)
        async with connection:
            channel = await connection.channel()
            exchange = await channel.get_exchange(EVENTS_EXCHANGE)
            claim = AgentResponse(content="FORGED")
            forged = Envelope.wrap(sid, claim, turn=99, seq=0, epoch=10**9, source="x")
            await exchange.publish(aio_pika.Message(encode(forged)), routing_key(sid, OUT, "AgentResponse"))
        await say(ws, "second")
        frames: list[Frame] = []
        await until(ws, "turn_complete", frames)
    texts = [f["text"] for f in frames if f["type"] == "agent_chunk"]
    assert "FORGED" not in texts
    assert "".join(texts).startswith("first second")  # the real answers still arrive
    assert "forged_epochs" in stack.edges[-1].log() or "claiming epoch" in stack.edges[-1].log()
