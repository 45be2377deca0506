"""Overload stays bounded and fair: queues have limits and hold publishers back, a process that
falls behind says it is not ready, and one client's flood costs only that client.

Measured before the fixes: at 200 sessions the edge queue grew from 4.4k to 26k messages in a
minute (one queue, prefetch 1, no length limit, no backpressure) with first chunks 4-5 s late; a
client that sent 10,000 interrupts delayed another session's first chunk by 8.9 s.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import httpx
import pytest
import redis.asyncio as aioredis

from bargein.agent.events import AgentResponse
from bargein.wire.envelope import Envelope, encode
from bargein.wire.names import DATA, EVENTS_EXCHANGE, OUT, TIER_REASONING, edge_queue, epoch_key, routing_key
from tests.client import Frame, connect, create_session, recv, say, until
from tests.faults.stack import FaultStack, fault_stack
from tests.faults.test_handover import contextlib_all

PROBE = {"agent": "tests.integration.agents:probe", "tail": 30, "word_delay": 0.01}
QUEUE_MAX = 300  # small limits, so a test reaches them in a moment
PREFETCH = 20  # taken by the edge ahead of handling: not counted by the limit (RabbitMQ counts ready ones)
OVERLOAD_BACKLOG = 50
T = 45.0
PAUSE_S = 4.0  # how long the stalled-edge test keeps its edge frozen


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    with fault_stack(
        Path(tmp_path_factory.mktemp("overload")),
        reasoning=1,
        speech=0,
        BARGEIN_QUEUE_MAX_MESSAGES=str(QUEUE_MAX),
        BARGEIN_EDGE_PREFETCH=str(PREFETCH),
        BARGEIN_OVERLOAD_BACKLOG=str(OVERLOAD_BACKLOG),
        BARGEIN_BROKER_WAIT_S="30",
    ) as running:
        yield running


@pytest.fixture(autouse=True)
def ready(stack: FaultStack) -> None:
    """Each test starts with an edge that has caught up with the last one's load."""
    stack.wait_ready()


def reply(frames: list[Frame], turn: int) -> str:
    return "".join(f["text"] for f in frames if f["type"] == "agent_chunk" and f["turn"] == turn)


async def test_a_stalled_edge_holds_the_answers_back_at_its_queue_limit_and_loses_none(
    stack: FaultStack,
) -> None:
    sessions = [await create_session(stack.url, agent_options={**PROBE, "tail": 300}) for _ in range(3)]
    async with contextlib_all(sessions) as sockets:
        logs: list[list[Frame]] = [[] for _ in sockets]
        for ws in sockets:
            await say(ws, "go")
        for ws, log in zip(sockets, logs, strict=True):
            await until(ws, "agent_chunk", log)
        edge = stack.edges[-1]
        queue = edge_data_queue(stack)
        stack.pause(edge)  # the edge stops taking chunks; the answers go on being written
        try:
            deepest = 0
            # Watch for PAUSE_S only: a process frozen past two AMQP heartbeats (BARGEIN_RABBITMQ_HEARTBEAT_S,
            # 5 s) loses its connection, and with it its exclusive queue, whatever rabbitmqctl is slow at.
            end = time.monotonic() + PAUSE_S
            while time.monotonic() < end:
                await asyncio.sleep(0.2)
                deepest = max(deepest, await asyncio.to_thread(stack.rabbit.queue_length, queue))
        finally:
            stack.resume(edge)
        assert QUEUE_MAX * 0.8 <= deepest <= QUEUE_MAX + PREFETCH  # it filled up, and no further
        for ws, frames in zip(sockets, logs, strict=True):  # nothing dropped at the limit: all whole
            done = await until(ws, "turn_complete", frames, T)
            words = reply(frames, done["turn"]).split()
            assert words[0] == "go" and len(words) == 301, words[:5]
            seqs = [f["seq"] for f in frames if f["type"] == "agent_chunk"]
            assert seqs == sorted(set(seqs))


async def test_an_edge_that_falls_behind_is_not_ready_until_it_has_caught_up(stack: FaultStack) -> None:
    session = await create_session(stack.url, agent_options=PROBE)  # its output is flooded below
    sid = session["session_id"]
    redis = aioredis.Redis.from_url(stack.redis.url)
    try:
        epoch = int(await wait_for_value(redis, epoch_key(TIER_REASONING, sid)))
    finally:
        await redis.aclose()
    stop = asyncio.Event()
    connection = await aio_pika.connect(stack.rabbit.url)
    async with connection, httpx.AsyncClient(timeout=10) as client:
        channel = await connection.channel(publisher_confirms=False)
        exchange = await channel.get_exchange(EVENTS_EXCHANGE)
        key = routing_key(sid, OUT, "AgentResponse")

        async def flood(start: int) -> None:  # chunks faster than one edge takes them (nobody listens)
            seq = start
            while not stop.is_set():
                chunk = Envelope.wrap(sid, AgentResponse(content="x"), turn=50, seq=seq, epoch=epoch)
                await exchange.publish(aio_pika.Message(encode(chunk)), key)
                seq += 4
                if seq % 400 == start:
                    await asyncio.sleep(0)

        floods = [asyncio.create_task(flood(i)) for i in range(4)]
        try:
            async with asyncio.timeout(T):  # behind: it says so, and sends new callers elsewhere
                while (readyz := await client.get(f"{stack.url}/readyz")).status_code != 503:  # noqa: ASYNC110
                    await asyncio.sleep(0.1)
            new = await client.post(f"{stack.url}/v1/sessions", json={})
            deepest = await asyncio.to_thread(stack.rabbit.queue_length, edge_data_queue(stack))
        finally:
            stop.set()
            await asyncio.gather(*floods)
            # Every chunk published has reached the broker once the channel's close is answered (a
            # channel's frames are handled in order). Without it, chunks still in the connection's
            # buffers came after the edge had caught up once: it was ready for a moment, then
            # overloaded again, and the next session was refused (one CI run of many).
            await channel.close()
        assert readyz.json()["problems"] == ["overloaded"]
        assert new.status_code == 503 and new.json()["error"]["code"] == "overloaded"
        assert new.headers["retry-after"] == "1"
        assert deepest <= QUEUE_MAX + PREFETCH  # the broker refused the rest: the queue stayed bounded
        async with asyncio.timeout(T):  # caught up: ready again
            while (await client.get(f"{stack.url}/readyz")).status_code != 200:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
    assert "overloaded" in stack.edges[-1].log()
    async with connect(await create_session(stack.url, agent_options=PROBE)) as ws:  # works as before
        await say(ws, "after the flood")
        frames: list[Frame] = []
        done = await until(ws, "turn_complete", frames, T)
        assert reply(frames, done["turn"]).startswith("after the flood")


async def test_one_clients_flood_is_refused_and_costs_no_one_else(stack: FaultStack) -> None:
    flooder, other = [await create_session(stack.url, agent_options=PROBE) for _ in range(2)]
    async with connect(flooder) as noisy, connect(other) as quiet:
        stop = json.dumps({"type": "interrupt"})
        for _ in range(10_000):
            await noisy.send(stop)
        started = time.monotonic()
        await say(quiet, "are you there")
        frames: list[Frame] = []
        first = await until(quiet, "agent_chunk", frames, T)
        waited = first["_received"] - started
        await until(quiet, "turn_complete", frames, T)
        assert reply(frames, first["turn"]).startswith("are you there")
        assert waited < 3.0, f"another session's first chunk took {waited:.1f} s"  # was 8.9 s
        told: list[Frame] = []
        while not any(f["type"] == "error" and f["code"] == "rate_limited" for f in told):
            told.append(await recv(noisy, T))
        await asyncio.sleep(1.1)  # the budget refills: the flooder may talk again
        await say(noisy, "sorry")
        log: list[Frame] = []
        done = await until(noisy, "turn_complete", log, T)
        assert reply(log, done["turn"]).startswith("sorry")
    assert "rate_limited" in stack.edges[-1].log()


# --- helpers ----------------------------------------------------------------------------------------


def edge_data_queue(stack: FaultStack) -> str:
    """The data queue of the stack's edge process (its owner name is in its log)."""
    match = re.search(r"connected to RabbitMQ at \S+ as '([^']+)'", stack.edges[-1].log())
    assert match, "the edge did not log its name"
    return edge_queue(match.group(1), DATA)


async def wait_for_value(redis: aioredis.Redis, key: str) -> bytes:
    async with asyncio.timeout(T):
        while (value := await redis.get(key)) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    return bytes(value)
