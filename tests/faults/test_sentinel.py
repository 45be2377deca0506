"""Redis kept available by Sentinel: when the master's host dies, the services follow the Sentinel
to the promoted replica, and no session dies or forgets its conversation.

Before ``redis+sentinel://`` URLs the services could only name one Redis server, so the
production overlay had no way to point at a highly available Redis: the master's death was a
Redis outage until someone repointed every process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from bargein.agent.llm import DEFAULT_REPLIES
from tests.client import connect, create_session
from tests.faults.brokers import PrivateSentinelRedis
from tests.faults.stack import FaultStack
from tests.faults.test_handover import contextlib_all
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
