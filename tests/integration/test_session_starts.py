"""Session starts on RabbitMQ: one publish each, no declaration, yet none lost when the work queue is
gone (deleted by an operator, or lost with its node) after this process declared it."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest

from bargein import SessionInfo
from bargein.transport.amqp import AmqpTransport
from bargein.wire.names import TIER_EDGE, session_work_queue

pytestmark = pytest.mark.integration


async def test_a_start_after_its_work_queue_was_deleted_declares_it_again(
    rabbitmq_url: str, unique_id: str
) -> None:
    publisher = await AmqpTransport.connect(rabbitmq_url, name="starts-test")
    worker = await AmqpTransport.connect(rabbitmq_url, name="starts-test")
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        first, second = (SessionInfo(f"{unique_id}-{n}").encode() for n in (1, 2))
        await publisher.publish_session_start(TIER_EDGE, first)  # declares the work queue
        channel = await connection.channel()
        await channel.queue_delete(session_work_queue(TIER_EDGE))  # the first start with it
        await publisher.publish_session_start(TIER_EDGE, second)  # returned, declared, published
        assert publisher.counters["work_queue_declared_again"] == 1
        taken: list[bytes] = []
        got_second = asyncio.Event()

        async def take(info: bytes) -> bool:
            taken.append(info)
            if info == second:
                got_second.set()
            return True

        subscription = await worker.consume_session_starts(TIER_EDGE, take)
        async with asyncio.timeout(10):
            await got_second.wait()
        await subscription.cancel()
        assert first not in taken
    finally:
        await connection.close()
        await publisher.close()
        await worker.close()
