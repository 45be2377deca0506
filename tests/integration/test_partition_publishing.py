"""Publishing to a partition on RabbitMQ: a message is taken once however many times it was sent,
and a publisher whose channel is refused for long moves to a fresh channel and goes on.

The fault these guard against is RabbitMQ 3.10's: after a node's loss, a channel that began to
publish to a quorum queue as the queue elected a new leader was refused by it for good (see
``AmqpTransport._publish_to_partition``). It shows only on a cluster losing a node, about one run
in two: ``tests/faults/test_cluster.py`` runs that. Here the same paths run on a partition that is
really full, and on a message that really came twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from bargein import Event, UserTranscriptionReceived
from bargein.tools.benchkit import delete_partitions
from bargein.transport.amqp import STUCK_CONFIRM_S, AmqpTransport
from bargein.wire.envelope import Envelope, encode
from bargein.wire.names import IN, PARTITION_HEADER, TIER_REASONING, partition_of, partition_tag, routing_key

pytestmark = pytest.mark.integration

PARTITIONS = 2
FULL = 10  # messages a partition holds here


@pytest.fixture
async def transports(rabbitmq_url: str) -> AsyncIterator[tuple[AmqpTransport, AmqpTransport]]:
    await delete_partitions(rabbitmq_url, PARTITIONS)  # declared again, bounded at FULL
    made = [
        await AmqpTransport.connect(
            rabbitmq_url,
            partitions=PARTITIONS,
            queue_max_messages=FULL,
            broker_wait_s=30,
            name="partition-test",
        )
        for _ in range(2)
    ]
    try:
        yield made[0], made[1]
    finally:
        for transport in made:
            await transport.close()
        await delete_partitions(rabbitmq_url, PARTITIONS)


def session_in(partition: int, unique_id: str) -> str:
    return next(sid for i in range(1000) if partition_of(sid := f"{unique_id}{i}", PARTITIONS) == partition)


async def never_starts(info: bytes) -> bool:
    raise AssertionError("no session start was expected")


async def test_a_message_sent_twice_with_one_id_is_taken_once(
    transports: tuple[AmqpTransport, AmqpTransport], unique_id: str
) -> None:
    publisher, consumer = transports
    session = session_in(0, unique_id)
    seen: list[str] = []

    async def record(envelope: Envelope, event: Event) -> None:
        seen.append(str(getattr(event, "content", "")))

    await consumer.open_partition(TIER_REASONING, 0, record, never_starts)
    headers = {PARTITION_HEADER: partition_tag(0)}
    for content, message_id in (("once", "m-1"), ("once", "m-1"), ("next", "m-2")):
        body = encode(Envelope.wrap(session, UserTranscriptionReceived(content=content)))
        key = routing_key(session, IN, "UserTranscriptionReceived")
        await publisher.publish_raw(key, body, persistent=True, headers=headers, message_id=message_id)
    async with asyncio.timeout(10):
        while len(seen) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    assert seen == ["once", "next"]
    assert consumer.counters["partition_duplicates_dropped"] == 1


async def test_a_publisher_refused_for_long_moves_to_a_fresh_channel_and_goes_on(
    transports: tuple[AmqpTransport, AmqpTransport], unique_id: str
) -> None:
    publisher, consumer = transports
    session = session_in(1, unique_id)
    sent = 0
    while True:  # until the partition is full (no consumer yet): a publish is held back
        held = asyncio.create_task(
            publisher.publish(Envelope.wrap(session, UserTranscriptionReceived(content=str(sent))), IN)
        )
        sent += 1
        done, _ = await asyncio.wait([held], timeout=1.0)
        if not done:
            break
        assert sent <= 2 * FULL, "a partition bounded at FULL took twice as many"
    await asyncio.sleep(STUCK_CONFIRM_S + 1.0)  # refused all along: it moved to a fresh channel
    assert not held.done()
    assert publisher.counters["publishing_channels_replaced"] >= 1
    seen: list[str] = []

    async def record(envelope: Envelope, event: Event) -> None:
        seen.append(str(getattr(event, "content", "")))

    await consumer.open_partition(TIER_REASONING, 1, record, never_starts)
    async with asyncio.timeout(15):
        await held  # taken once there is room, on the fresh channel
        while len(seen) < sent:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert seen == [str(i) for i in range(sent)]
    # and the fresh channel carries what comes next
    await publisher.publish(Envelope.wrap(session, UserTranscriptionReceived(content="after")), IN)
    async with asyncio.timeout(10):
        while len(seen) < sent + 1:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert seen[-1] == "after"
