"""Redis kept available by Sentinel (a master, a replica, three Sentinels): when the master's host
dies, the services follow the Sentinels to the promoted replica, and no session dies or forgets its
conversation, even when a reasoning process dies with it.

Before ``redis+sentinel://`` URLs the services could only name one Redis server, so the
production overlay had no way to point at a highly available Redis: the master's death was a
Redis outage until someone repointed every process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from bargein.agent.llm import DEFAULT_REPLIES
from bargein.tools.private_brokers import PrivateSentinelRedis
from bargein.transport.redis_address import async_client
from tests.client import Frame, connect, create_session, say
from tests.faults.stack import FaultStack
from tests.faults.test_handover import arrives_whole, contextlib_all, owner_of, take_chunks
from tests.faults.test_restarts import answered, ready, stack_for

REPLICATION_S = 1.0  # replication is asynchronous: let the replica catch up before the crash


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    yield from stack_for(tmp_path_factory, "sentinel", sentinel=True)


async def test_sessions_follow_a_sentinel_failover_with_their_memory(stack: FaultStack) -> None:
    redis = stack.redis
    assert isinstance(redis, PrivateSentinelRedis)
    assert redis.master_port() == redis.master.port
    sessions = [await create_session(stack.url) for _ in range(3)]
    async with contextlib_all(sessions) as sockets:
        for ws in sockets:
            assert await answered(ws, "hello") == DEFAULT_REPLIES[0]
        await asyncio.sleep(REPLICATION_S)
        await asyncio.to_thread(redis.fail_over)  # the master is SIGKILLed; the replica promoted
        assert redis.master_port() == redis.replica.port
        for ws in sockets:  # each answer is the second reply: the conversation was remembered
            assert await answered(ws, "again") == DEFAULT_REPLIES[1]
    assert await ready(stack) == 200
    async with connect(sessions[0]) as ws:  # and the session directory moved with the data
        assert await answered(ws, "and again") == DEFAULT_REPLIES[2]
    # the services found the new master through the Sentinel, not by being restarted
    assert not [p for p in stack.cluster.processes if not p.alive()], stack.logs()


@pytest.fixture(scope="module")
def double_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    yield from stack_for(tmp_path_factory, "sentinel-double", sentinel=True)


async def test_the_redis_master_and_a_session_owner_lost_at_once(double_stack: FaultStack) -> None:
    """Two faults at once (the README's table named it as not covered): the machine of the Redis
    master and the machine of a reasoning process die together, mid-answer. The Sentinels promote
    the replica (which holds the owner's list of sessions, its heartbeat record and the checkpoints,
    all but the last writes) while the survivor sees the owner's heartbeat stop: it takes over from
    the promoted replica and every answer arrives whole, once."""
    stack = double_stack
    sentinels = stack.redis
    assert isinstance(sentinels, PrivateSentinelRedis)
    sessions = [await create_session(stack.url) for _ in range(4)]
    client = async_client(sentinels.url, pool_size=4, timeout_s=5.0)
    try:
        async with contextlib_all(sessions) as sockets:
            for ws in sockets:
                assert await answered(ws, "hello") == DEFAULT_REPLIES[0]
            victim = await owner_of(client, stack, sessions[0]["session_id"])
            logs: list[list[Frame]] = [[] for _ in sockets]
            for ws in sockets:
                await say(ws, "tell me more")
            for ws, log in zip(sockets, logs, strict=True):
                await take_chunks(ws, 2, log)  # mid-answer
            await asyncio.sleep(REPLICATION_S)
            victim.kill()
            await asyncio.to_thread(sentinels.fail_over)
            for ws, log in zip(sockets, logs, strict=True):
                await arrives_whole(ws, log, DEFAULT_REPLIES[1], 60.0)
            for ws in sockets:  # and remembered once
                assert await answered(ws, "still there?") == DEFAULT_REPLIES[2]
    finally:
        await client.aclose()
    assert "took over session" in stack.logs()
