"""A RabbitMQ node lost for good: the services on a 3-node cluster, every node's address in
``BARGEIN_RABBITMQ_URL``, and the node every process is connected to killed (SIGKILL, as its machine
dying) mid-answer.

Measured before the fixes, on the same cluster: a process took one address and knew no other, so
losing its node was losing the broker; and a durable classic mailbox lives on one node only, so
once that node is gone no surviving node will declare it again ("home node ... of durable queue
... is down or inaccessible"), and aio-pika's reconnection, which declares every queue the process
had, fails as a whole and retries for ever: not one session of that process works until the dead
node comes back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from bargein.agent.llm import DEFAULT_REPLIES
from tests.client import Frame, create_session, say, until
from tests.faults.stack import FaultStack, fault_stack
from tests.faults.test_handover import AGENT, arrives_whole, contextlib_all, history_of, take_chunks, text_of
from tests.faults.test_restarts import answered, log_lines, new_lines

T = 60.0

# The policy docs/operations.md tells an operator of a RabbitMQ 3.x cluster to set: every queue of
# bargein's kept on two nodes, a copy made at once, the copy promoted whatever happened, the leaders
# spread over the nodes.
REPLICATED = (
    '{"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic", '
    '"ha-promote-on-failure": "always", "ha-promote-on-shutdown": "always", '
    '"queue-master-locator": "min-masters"}'
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    base = Path(tmp_path_factory.mktemp("cluster"))
    with fault_stack(
        base, reasoning=2, speech=0, BARGEIN_AGENT=AGENT, rabbit_nodes=3, rabbit_policy=REPLICATED
    ) as running:
        yield running


async def test_no_call_is_lost_when_the_node_every_process_is_on_dies(
    stack: FaultStack, redis: aioredis.Redis
) -> None:
    assert stack.rabbits is not None
    sessions = [await create_session(stack.url) for _ in range(4)]
    async with contextlib_all(sessions) as sockets:
        for ws in sockets:
            assert await answered(ws, "hello") == DEFAULT_REPLIES[0]
        errors = log_lines(stack, "ERROR")
        streaming, idle = sockets[:2], sockets[2:]
        logs: list[list[Frame]] = [[] for _ in streaming]
        for ws in streaming:
            await say(ws, "tell me more")
        for ws, log in zip(streaming, logs, strict=True):
            await take_chunks(ws, 2, log)  # mid-answer
        killed = time.monotonic()
        await asyncio.to_thread(stack.rabbit.kill)
        for ws in idle:  # said while the processes look for another node
            await say(ws, "tell me more")
        for ws, log in zip(streaming, logs, strict=True):  # the answer in flight arrives whole, once
            await arrives_whole(ws, log, DEFAULT_REPLIES[1], T)
        for ws in idle:  # and what was said during the failover is answered
            log = []
            done = await until(ws, "turn_complete", log, T)
            assert not [f for f in log if f["type"] == "error"], log
            assert text_of(log, turn=done["turn"]) == DEFAULT_REPLIES[1]
        recovered = time.monotonic() - killed
        for ws in sockets:  # the conversation goes on, on the surviving nodes
            assert await answered(ws, "still there?") == DEFAULT_REPLIES[2]
        for session in sessions:
            said = [t for role, t in await history_of(redis, session["session_id"], 6) if role == "user"]
            assert said == ["hello", "tell me more", "still there?"], said
    survivors = {node.url for node in stack.rabbits.running()}
    assert stack.rabbit.url not in survivors and len(survivors) == 2
    for process in stack.cluster.processes:  # each process moved on to a node that is alive
        if process.alive():
            assert "reconnected to RabbitMQ at amqp://" in process.log(), process.log()[-3000:]
    assert not new_lines(errors, log_lines(stack, "ERROR")), stack.logs()
    print(f"recovered: every answer whole {recovered:.1f} s after the node was killed")
