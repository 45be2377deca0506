"""Partitioned mailboxes (``BARGEIN_MAILBOXES=partitioned``): real reasoning processes, real RabbitMQ
(quorum queues), real Redis.

Two ``python -m services.reasoning`` processes share eight partitions; the test process plays caller
and edge with a transport that hashes sessions to the same partitions. What the per-session tests of
``test_distributed.py`` hold for a turn holds here: answers whole and in order, interrupts that reach
the owner's generation, a crash or a drain mid-answer that costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import pytest

from bargein import UserStartedSpeaking
from bargein.testing.caller import Caller
from bargein.tools import benchkit
from bargein.wire.names import TIER_REASONING, lease_key, mailbox_queue, partition_lease

from .cluster import Cluster, cluster_env, reset_shared_queues
from .support import Client, T, ask, chunks, connected_client, text_of

PARTITIONS = 8


def forget_partitions(rabbitmq_url: str, redis_url: str) -> None:
    """The shared broker's partitions and Redis's record of them: gone before and after."""
    asyncio.run(benchkit.forget_partitions(rabbitmq_url, redis_url, PARTITIONS))


@pytest.fixture(scope="module")
def cluster(rabbitmq_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reset_shared_queues(rabbitmq_url, redis_url)
    forget_partitions(rabbitmq_url, redis_url)
    env = cluster_env(
        rabbitmq_url, redis_url, BARGEIN_MAILBOXES="partitioned", BARGEIN_PARTITIONS=str(PARTITIONS)
    )
    try:
        with Cluster(env, Path(tmp_path_factory.mktemp("partitioned"))) as c:
            c.start()
            c.start()
            yield c
    finally:
        forget_partitions(rabbitmq_url, redis_url)


@pytest.fixture
async def client(cluster: Cluster, rabbitmq_url: str, redis_url: str) -> AsyncIterator[Client]:
    async with connected_client(rabbitmq_url, redis_url, "test-client", partitions=PARTITIONS) as c:
        yield c


async def start(client: Client, **options: object) -> Caller:
    return await client.open({"agent": "tests.integration.agents:probe", **options})


async def partition_owners(client: Client) -> list[str]:
    leases = [
        await client.redis.get(lease_key(TIER_REASONING, partition_lease(p))) for p in range(PARTITIONS)
    ]
    return [lease.decode().rsplit(":", 1)[0] if lease else "" for lease in leases]


async def shared_as(client: Client, *counts: int) -> None:
    """Wait until the partitions are held in these numbers, one per worker (in any order)."""
    async with asyncio.timeout(T):
        while True:
            owners = await partition_owners(client)
            if sorted(owners.count(o) for o in set(owners)) == sorted(counts):
                return
            await asyncio.sleep(0.1)


async def test_sessions_are_answered_by_the_owners_of_their_partitions(
    client: Client, cluster: Cluster, rabbitmq_url: str
) -> None:
    await shared_as(client, PARTITIONS // 2, PARTITIONS // 2)
    callers = [await start(client, word_delay=0.005) for _ in range(8)]
    for caller in callers:
        await ask(caller, f"hello {caller.session_id[:4]}")
    for caller in callers:
        assert text_of(await caller.collect_turn(timeout=T)) == f"hello {caller.session_id[:4]}"
    pids = {await client.owner_pid(c) for c in callers}
    assert pids <= {p.pid for p in cluster.processes if p.alive()} and len(pids) == 2
    connection = await aio_pika.connect(rabbitmq_url)
    async with connection:  # no queue of their own: their partitions are their mailboxes
        channel = await connection.channel()
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await channel.declare_queue(mailbox_queue(TIER_REASONING, callers[0].session_id), passive=True)


async def test_an_interrupt_reaches_the_generation_through_the_partition(client: Client) -> None:
    caller = await start(client, tail=200, word_delay=0.02)
    await ask(caller, "go")
    await chunks(caller, 3)
    await caller.emit(UserStartedSpeaking())
    await client.wait_note(caller, "cancelled")  # the owner's generator saw CancelledError
    await caller.wait_interrupted(1)
    assert await caller.quiet(0.3) == []


async def test_a_crash_mid_turn_costs_nothing_the_partitions_move(client: Client, cluster: Cluster) -> None:
    caller = await start(client, tail=60, word_delay=0.03)
    await ask(caller, "start")
    heard = await chunks(caller, 10)
    cluster.by_pid(await client.owner_pid(caller)).kill()
    rest = await caller.collect_turn(timeout=30)
    assert heard + text_of(rest) == "start " + " ".join(f"tail{i}" for i in range(60))
    await shared_as(client, PARTITIONS)  # the survivor holds every partition
    cluster.start()  # and hands half back to a new worker


async def test_a_drain_hands_the_partitions_over_and_the_turn_resumes(
    client: Client, cluster: Cluster
) -> None:
    await shared_as(client, PARTITIONS // 2, PARTITIONS // 2)  # two workers again
    caller = await start(client, tail=60, word_delay=0.03)
    await ask(caller, "start")
    heard = await chunks(caller, 10)
    owner = cluster.by_pid(await client.owner_pid(caller))
    assert owner.terminate() == 0
    assert "drained" in owner.log()
    rest = await caller.collect_turn(timeout=30)
    assert heard + text_of(rest) == "start " + " ".join(f"tail{i}" for i in range(60))
    with contextlib.suppress(Exception):
        cluster.start()
