"""A worker's partitions are consumed again when RabbitMQ stops answering their channel.

After a node's stall, RabbitMQ 3.10 left a worker's ``basic.consume`` on a partition unanswered,
and then the ``channel.close`` that aiormq sends after such a time-out too. aio-pika reopens a
channel only once it has closed, so every later consume on it failed at once ("closed by RPC
timeout") and the worker consumed none of its partitions for a minute: the freeze fault test
(partitioned) lost an answer's words. A proxy between the worker and RabbitMQ does here what the
broker did there: it stops passing on the broker's frames for one channel, and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from bargein import Event, UserTranscriptionReceived
from bargein.settings import BrokerSettings, load
from bargein.tools.benchkit import delete_partitions
from bargein.transport.amqp import AmqpTransport
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN, TIER_REASONING, partition_of

PARTITIONS = 4
FRAME_END = 0xCE

pytestmark = pytest.mark.timeout(60)


class ChannelMuzzle:
    """A TCP proxy to RabbitMQ that passes the client's bytes as they are and the broker's frame by
    frame, except those of the channels it is told to keep back (AMQP 0-9-1 frames: type, channel,
    size, payload, end)."""

    def __init__(self, broker_host: str, broker_port: int) -> None:
        self.broker = (broker_host, broker_port)
        self.muted: set[int] = set()
        self.kept_back = 0
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for pipe in self._pipes:
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        broker_in, broker_out = await asyncio.open_connection(*self.broker)
        for pipe in (self._plain(client_in, broker_out), self._frames(broker_in, client_out)):
            task = asyncio.create_task(pipe)
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    @staticmethod
    async def _plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _frames(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                header = await reader.readexactly(7)
                _, channel, size = struct.unpack(">BHI", header)
                rest = await reader.readexactly(size + 1)
                assert rest[-1] == FRAME_END, "not an AMQP frame"
                if channel in self.muted:
                    self.kept_back += 1
                    continue
                writer.write(header + rest)
                await writer.drain()
        writer.close()


def through(url: str, port: int) -> str:
    """``url`` with its host and port those of the proxy."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    return urlunsplit(
        parts._replace(netloc=f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}")
    )


@pytest.fixture
async def partitions_cleared(rabbitmq_url: str) -> AsyncIterator[None]:
    count = max(PARTITIONS, load(BrokerSettings).partitions)
    await delete_partitions(rabbitmq_url, count)  # whatever another stack left in them
    yield
    await delete_partitions(rabbitmq_url, count)


async def test_partitions_are_consumed_again_when_rabbitmq_leaves_their_channel_unanswered(
    rabbitmq_url: str, partitions_cleared: None
) -> None:
    parts = urlsplit(rabbitmq_url)
    muzzle = ChannelMuzzle(parts.hostname or "localhost", parts.port or 5672)
    port = await muzzle.start()
    worker = await AmqpTransport.connect(
        through(rabbitmq_url, port), name="muzzled-worker", partitions=PARTITIONS
    )
    caller = await AmqpTransport.connect(rabbitmq_url, name="caller", partitions=PARTITIONS)
    heard: list[str] = []
    arrived = asyncio.Event()

    async def handle(envelope: Envelope, event: Event) -> None:
        assert isinstance(event, UserTranscriptionReceived)
        heard.append(event.content)
        arrived.set()

    async def no_start(info: bytes) -> bool:
        raise AssertionError("no session start was expected")

    try:
        earlier = await worker.open_partition(TIER_REASONING, 1, handle, no_start)
        assert earlier.alive
        consuming = (await worker._consume.get_underlay_channel()).number  # type: ignore[union-attr]
        muzzle.muted.add(consuming)  # the broker answers nothing on it from now on
        with pytest.raises(TimeoutError):  # basic.consume unanswered (PARTITION_CONSUME_WAIT_S) ...
            await worker.open_partition(TIER_REASONING, 0, handle, no_start)
        await asyncio.sleep(0.5)  # ... and so is the channel.close aiormq sends after it
        # the keeper tries again (CONSUMING_CHECK_S later): a fresh channel, and the partition flows
        subscription = await worker.open_partition(TIER_REASONING, 0, handle, no_start)
        assert subscription.alive
        assert not earlier.alive  # on the channel given up on: its keeper consumes it again
        assert muzzle.kept_back >= 2  # (the consume's answer and the close's were kept back)
        session = next(s for i in range(1000) if partition_of(s := f"muzzled-{i}", PARTITIONS) == 0)
        await caller.publish(Envelope.wrap(session, UserTranscriptionReceived(content="hello")), IN)
        await asyncio.wait_for(arrived.wait(), 10)
        assert heard == ["hello"]
        assert worker.counters["consuming_channels_replaced"] == 1
    finally:
        muzzle.muted.clear()
        await caller.close()
        await worker.close()
        await muzzle.close()
