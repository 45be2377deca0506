"""Redis and RabbitMQ restart under the product: no session dies, nothing is lost in silence.

Measured before the fixes: after a Redis restart without persistence every session was dead (0 of
117 texts answered; renewals found no lease, sessions closed without release, the directory was
gone so nothing was adopted, rejoining gave 4404); during a RabbitMQ restart, texts sent were lost
(20 of 23 with stop_app, 32 of 33 with a node restart), each dropping the client's WebSocket with
1006 and no error frame, and /readyz said ready throughout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import ClientConnection

from bargein.agent.llm import DEFAULT_REPLIES
from tests.client import Frame, connect, create_session, say, until
from tests.faults.stack import FaultStack, fault_stack
from tests.faults.test_handover import (
    AGENT,
    arrives_whole,
    contextlib_all,
    history_of,
    owner_of,
    take_chunks,
    text_of,
)

T = 45.0


def stack_for(tmp_path_factory: pytest.TempPathFactory, name: str, **kw: Any) -> Iterator[FaultStack]:
    with fault_stack(
        Path(tmp_path_factory.mktemp(name)), reasoning=2, speech=0, BARGEIN_AGENT=AGENT, **kw
    ) as s:
        yield s


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    yield from stack_for(tmp_path_factory, "restarts")


async def answered(ws: ClientConnection, text: str) -> str:
    await say(ws, text)
    log: list[Frame] = []
    done = await until(ws, "turn_complete", log, T)
    return text_of(log, turn=done["turn"])


async def ready(stack: FaultStack) -> int:
    async with httpx.AsyncClient(timeout=5) as client:
        return (await client.get(f"{stack.url}/readyz")).status_code


async def unready_within(stack: FaultStack, seconds: float) -> bool:
    """Whether the edge says it is not ready (503) before ``seconds`` pass: a node restart takes
    its time to bring the broker down on a busy machine."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await ready(stack) == 503:
            return True
        await asyncio.sleep(0.2)
    return False


async def test_sessions_live_through_a_redis_restart_that_lost_everything(
    stack: FaultStack, redis: aioredis.Redis
) -> None:
    sessions = [await create_session(stack.url) for _ in range(4)]
    async with contextlib_all(sessions) as sockets:
        for ws in sockets:
            assert await answered(ws, "hello") == DEFAULT_REPLIES[0]
        await asyncio.to_thread(stack.redis.stop)
        assert await ready(stack) == 503  # the edge says it cannot work without Redis
        await asyncio.sleep(2.0)
        await asyncio.to_thread(stack.redis.start)  # empty: no persistence
        for ws in sockets:  # every session answers again, remembering the conversation
            assert await answered(ws, "again") == DEFAULT_REPLIES[1]
        assert await ready(stack) == 200
    rejoined = sessions[0]  # a session can be joined again (it is back in the directory)
    async with connect(rejoined) as ws:
        assert await answered(ws, "and again") == DEFAULT_REPLIES[2]
        victim = await owner_of(redis, stack, rejoined["session_id"])
        victim.kill()  # and its records are whole again: another process adopts it with its history
        assert await answered(ws, "after the crash") == DEFAULT_REPLIES[3]
    stack.start("reasoning")


async def test_redis_lost_while_an_owner_dies_no_session_falls_silent(
    stack: FaultStack, redis: aioredis.Redis
) -> None:
    """Two faults at once: Redis restarts empty while the owner of some sessions is killed. The
    survivor writes its own sessions' records back, as above; the dead owner's records are gone with
    it, so before the fix nobody knew those sessions any more: their callers, still connected, got
    no answer and no error, for ever. Now their edge writes the directory entries back
    (edge/records.py) and a worker adopts them: the call goes on, without the conversation before
    (the answer is the first reply again), which two lost copies cannot give back."""
    sessions = [await create_session(stack.url) for _ in range(4)]
    async with contextlib_all(sessions) as sockets:
        for ws in sockets:
            assert await answered(ws, "hello") == DEFAULT_REPLIES[0]
        victim = await owner_of(redis, stack, sessions[0]["session_id"])
        orphaned = {
            i
            for i, session in enumerate(sessions)
            if await owner_of(redis, stack, session["session_id"]) == victim
        }
        await asyncio.to_thread(stack.redis.stop)
        victim.kill()
        await asyncio.sleep(1.0)
        await asyncio.to_thread(stack.redis.start)  # empty: no persistence
        for i, ws in enumerate(sockets):
            reply = await answered(ws, "again")
            assert reply == (DEFAULT_REPLIES[0] if i in orphaned else DEFAULT_REPLIES[1]), i
        for ws in sockets:  # and from there on every session remembers
            again = await answered(ws, "and again")
            assert again in (DEFAULT_REPLIES[1], DEFAULT_REPLIES[2])
    assert "written back, so a worker takes it up again" in stack.logs()
    stack.start("reasoning")


@pytest.fixture(scope="module")
def persistent_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    yield from stack_for(tmp_path_factory, "restarts-aof", aof=True)


async def test_with_redis_persistence_the_state_itself_survives_a_restart(
    persistent_stack: FaultStack,
) -> None:
    stack = persistent_stack
    sessions = [await create_session(stack.url) for _ in range(2)]
    async with contextlib_all(sessions) as sockets:
        for ws in sockets:
            assert await answered(ws, "hello") == DEFAULT_REPLIES[0]
        await asyncio.to_thread(stack.redis.restart)  # AOF, as docker-compose runs it
        for ws in sockets:
            assert await answered(ws, "again") == DEFAULT_REPLIES[1]
    # nothing had to be written back: Redis came back with every lease, epoch and checkpoint
    assert "was gone from Redis" not in stack.logs()


def log_lines(stack: FaultStack, level: str) -> dict[int, list[str]]:
    """Each live process's log lines at ``level`` (the text format: time, level, logger)."""
    marker = f" {level:<7} "
    return {
        p.pid: [line for line in p.log().splitlines() if marker in line]
        for p in stack.cluster.processes
        if p.alive()
    }


def new_lines(before: dict[int, list[str]], after: dict[int, list[str]]) -> list[str]:
    return [line for pid, lines in after.items() for line in lines[len(before.get(pid, [])) :]]


@pytest.mark.parametrize("outage", ["stop_app", "node restart"])
async def test_sessions_live_through_a_rabbitmq_restart(
    stack: FaultStack, redis: aioredis.Redis, outage: str
) -> None:
    sessions = [await create_session(stack.url) for _ in range(3)]
    async with contextlib_all(sessions) as sockets:
        for ws in sockets:
            assert await answered(ws, "hello") == DEFAULT_REPLIES[0]
        errors, warnings = log_lines(stack, "ERROR"), log_lines(stack, "WARNING")
        if outage == "stop_app":
            await asyncio.to_thread(stack.rabbit.stop_app)
            await asyncio.sleep(1.0)
            assert await ready(stack) == 503  # not ready while the broker is unusable
            for ws in sockets:  # said during the outage (shorter than BARGEIN_BROKER_WAIT_S)
                await say(ws, "are you")
                await say(ws, "there?")
            await asyncio.sleep(3.0)
            await asyncio.to_thread(stack.rabbit.start_app)
        else:
            restarting = asyncio.create_task(asyncio.to_thread(stack.rabbit.restart))
            assert await unready_within(stack, 15.0)
            for ws in sockets:
                await say(ws, "are you")
                await say(ws, "there?")
            await restarting
        for ws in sockets:  # what was said while the broker was away is answered afterwards
            log: list[Frame] = []
            done = await until(ws, "turn_complete", log, T)
            assert not [f for f in log if f["type"] == "error"]
            assert text_of(log, turn=done["turn"]) == DEFAULT_REPLIES[1]
        for ws in sockets:  # the connection survived: the conversation goes on
            assert await answered(ws, "still there?") == DEFAULT_REPLIES[2]
        assert await ready(stack) == 200
        for session in sessions:  # the two texts are two utterances, not "youthere?"
            said = [
                text for role, text in await history_of(redis, session["session_id"], 6) if role == "user"
            ]
            assert said == ["hello", "are you there?", "still there?"], said
    # a broker restart is an event the services handle: an operator's alert on ERROR stays quiet,
    # and each process names it once, as a warning
    assert not new_lines(errors, log_lines(stack, "ERROR")), stack.logs()
    warned = new_lines(warnings, log_lines(stack, "WARNING"))
    assert any("RabbitMQ" in line for line in warned), warned


async def test_the_answer_in_flight_during_a_rabbitmq_restart_arrives_whole(stack: FaultStack) -> None:
    session = await create_session(stack.url)
    async with connect(session) as ws:
        await say(ws, "hello")
        log: list[Frame] = []
        await take_chunks(ws, 3, log)  # mid-answer
        await asyncio.to_thread(stack.rabbit.stop_app)
        await asyncio.sleep(2.0)
        await asyncio.to_thread(stack.rabbit.start_app)
        await arrives_whole(ws, log, DEFAULT_REPLIES[0], T)
        assert await answered(ws, "and now?") == DEFAULT_REPLIES[1]  # remembered once
