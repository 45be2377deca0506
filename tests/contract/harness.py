"""What the transport contract suite needs besides the seam itself, once per implementation:
transports on one broker, raw bytes on the bus, and the dead letters."""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable

import aio_pika

from bargein.settings import BrokerSettings, load
from bargein.tools.benchkit import delete_partitions
from bargein.transport.abc import Transport
from bargein.transport.amqp import AmqpTransport
from bargein.transport.memory import MemoryBroker, MemoryTransport
from bargein.wire.names import (
    DEAD_QUEUE,
    DEAD_REASON_HEADER,
    EVENTS_EXCHANGE,
    Direction,
    routing_key,
)

AUDIO_FRAMES = 20  # speech mailboxes keep this many frames in the suite
QUEUE_MAX = 60  # other mailboxes and edge queues hold this many, then hold their publishers back
T = 10.0  # generous: the machines are shared


class Bus(ABC):
    """Transports on one broker, and the two things the suite needs beside the seam."""

    def __init__(self) -> None:
        self.transports: list[Transport] = []

    @abstractmethod
    async def transport(self, *, broker_wait_s: float = 15.0, partitions: int = 0) -> Transport:
        """A new transport (a new process, as far as the broker can tell); a publisher waits up to
        ``broker_wait_s`` for room in a full queue; with ``partitions``, the reasoning tier's
        mailboxes are that many partitions."""

    @abstractmethod
    async def publish_raw(self, session: str, direction: Direction, event_name: str, body: bytes) -> None:
        """Bytes on the events exchange under ``session``'s key, as a hostile or broken peer would."""

    @abstractmethod
    async def dead_letter_reasons(self, queue_part: str, count: int) -> list[str]:
        """The reasons of the next ``count`` dead letters from queues whose name has ``queue_part``."""

    async def close(self) -> None:
        for transport in self.transports:
            with contextlib.suppress(Exception):
                await transport.close()


class MemoryBus(Bus):
    def __init__(self) -> None:
        super().__init__()
        self.broker = MemoryBroker()

    async def transport(self, *, broker_wait_s: float = 15.0, partitions: int = 0) -> Transport:
        transport = MemoryTransport(
            self.broker,
            audio_mailbox_frames=AUDIO_FRAMES,
            queue_max_messages=QUEUE_MAX,
            broker_wait_s=broker_wait_s,
            partitions=partitions,
        )
        self.transports.append(transport)
        return transport

    async def publish_raw(self, session: str, direction: Direction, event_name: str, body: bytes) -> None:
        self.broker.route(EVENTS_EXCHANGE, routing_key(session, direction, event_name), body)

    async def dead_letter_reasons(self, queue_part: str, count: int) -> list[str]:
        async with asyncio.timeout(T):
            while True:
                reasons = [d.reason for d in self.broker.dead if queue_part in d.queue]
                if len(reasons) >= count:
                    return reasons[:count]
                await asyncio.sleep(0.01)


class RabbitBus(Bus):
    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.partitions = 0

    async def transport(self, *, broker_wait_s: float = 15.0, partitions: int = 0) -> Transport:
        if partitions and not self.partitions:  # a stack's partitions, other bounds: not this suite's
            await delete_partitions(self.url, max(partitions, load(BrokerSettings).partitions))
        transport = await AmqpTransport.connect(
            self.url,
            audio_mailbox_frames=AUDIO_FRAMES,
            queue_max_messages=QUEUE_MAX,
            broker_wait_s=broker_wait_s,
            mailbox_expiry_ms=120_000,
            name="contract-test",
            partitions=partitions,
        )
        self.partitions = max(self.partitions, partitions)
        self.transports.append(transport)
        return transport

    async def close(self) -> None:
        await super().close()
        if self.partitions:  # the shared broker's partitions: gone, with what a test left in them
            await delete_partitions(self.url, self.partitions)

    async def publish_raw(self, session: str, direction: Direction, event_name: str, body: bytes) -> None:
        connection = await aio_pika.connect(self.url)
        async with connection:
            channel = await connection.channel()
            exchange = await channel.get_exchange(EVENTS_EXCHANGE)
            await exchange.publish(aio_pika.Message(body), routing_key(session, direction, event_name))

    async def dead_letter_reasons(self, queue_part: str, count: int) -> list[str]:
        reasons: list[str] = []
        connection = await aio_pika.connect(self.url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(DEAD_QUEUE, passive=True)
            async with asyncio.timeout(T):
                while len(reasons) < count:
                    message = await queue.get(fail=False)
                    if message is None:
                        await asyncio.sleep(0.05)
                        continue
                    await message.ack()
                    if queue_part in str(message.headers.get("x-bargein-queue", "")):
                        reasons.append(str(message.headers.get(DEAD_REASON_HEADER)))
        return reasons


async def until(predicate: Callable[[], bool], timeout: float = T) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - the handlers under test signal nothing
            await asyncio.sleep(0.01)
