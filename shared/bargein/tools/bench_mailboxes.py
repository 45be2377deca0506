"""The two mailbox designs of issue 27, side by side on one broker: what ``bargein bench scale``
measures beneath the services.

* **per-session** (what bargein does): each session has a mailbox per tier, a durable classic queue
  with two priority levels (control overtakes data) bound to the session's routing keys, and the
  edge binds the session's keys to its own queue. A start declares all that; an idle session keeps
  it at the broker.
* **partitioned** (the alternative): a fixed number of replicated partition queues per tier,
  sessions hashed to them, a worker owning whole partitions (single active consumer). RabbitMQ 3.10's
  quorum queues have no priorities, so each partition is two quorum queues, control and data, and
  the consumer takes control first. A start declares nothing; an idle session costs the broker
  nothing; every message is written to a Raft log on a majority of the nodes.

What is measured, each the same way for both designs:

* **session starts**: per-session, what a start asks of the broker, done by bargein's own transport
  (the two mailboxes declared by the edge, the edge's bindings, each owner's ``open_mailbox``), as
  starts a second and the broker's CPU time per start; partitioned starts ask nothing of it;
* **memory per idle session**: the node's memory (``rabbitmqctl status``) over that before, divided
  by the sessions; the partitions' own fixed cost beside it;
* **control latency under load**: ``sessions`` sessions each receiving ``rate`` data messages a
  second (persistent, confirmed) into their mailboxes, one consumer that spends ``work_ms`` on each
  message, and a control message (persistent, confirmed, high priority) to one session every
  ``sample_interval_s``: publish → handled, p50/p99;
* **failover after a node is lost** (``cluster`` only): one mailbox of each design whose leader is on
  the node that is killed, a publisher and a consumer on another node: the time from the SIGKILL
  to the first message published after it being handled.

Everything is named with a run id and deleted at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

from bargein.tools.benchkit import cpu_of, percentile
from bargein.transport import amqp_address
from bargein.transport.abc import EdgeQueue, Subscription
from bargein.transport.amqp import AmqpTransport
from bargein.wire.envelope import Envelope
from bargein.wire.names import (
    IN,
    PRIORITY_CONTROL,
    PRIORITY_DATA,
    TIER_REASONING,
    TIER_SPEECH,
    partition_of,
)

PARTITIONS = 16  # per tier: a worker owns whole partitions, so a tier has at most this many workers
START_CONCURRENCY = 20  # starts at once, as bench sessions' callers
SETTLE_S = 3.0  # for the broker's memory to settle before it is read
FAILOVER_GIVE_UP_S = 60.0
PROBE_EVERY_S = 0.05  # the failover probe's publish period
PARTITION_ARGUMENTS: dict[str, Any] = {"x-queue-type": "quorum", "x-single-active-consumer": True}
MAX_IN_FLIGHT = 100  # the load's publishes awaiting their confirm: beyond, it goes at the broker's pace


@dataclass
class StartCost:
    per_s: float
    broker_cpu_ms: float | None  # broker CPU per start, when the bench can read the node's process


@dataclass
class Latency:
    samples: list[float] = field(default_factory=list)
    handled: int = 0  # data messages the consumer has handled
    window: tuple[int, float] = (0, 0.0)  # data messages handled while the samples were taken, in seconds

    def summary(self) -> dict[str, float | int]:
        ordered = sorted(self.samples)
        count, seconds = self.window
        carried = count / seconds if seconds else 0.0
        if not ordered:
            return {"n": 0, "carried_per_s": carried}
        return {
            "n": len(ordered),
            "p50_ms": percentile(ordered, 50) * 1000,
            "p99_ms": percentile(ordered, 99) * 1000,
            "carried_per_s": carried,
        }


# --- per-session: bargein's own transport ---------------------------------------------------------


async def _ignore(envelope: Envelope, event: Any) -> None:
    return None


class PerSessionStarts:
    """What a session start asks of the broker today, done by bargein's transport: the edge
    declares both tiers' mailboxes and binds the session's keys to its queue, each tier's owner
    opens its mailbox (declares it again and consumes it)."""

    def __init__(self, transport: AmqpTransport, edge: EdgeQueue, run_id: str) -> None:
        self.transport = transport
        self.edge = edge
        self.run_id = run_id
        self.sessions: list[str] = []
        self.consumers: list[Subscription] = []

    async def start(self, count: int) -> None:
        todo = iter(range(count))

        async def starter() -> None:
            for _ in todo:
                session = f"scale-{self.run_id}-{len(self.sessions)}"
                self.sessions.append(session)
                await self.transport.declare_mailbox(session, TIER_SPEECH, IN)
                await self.transport.declare_mailbox(session, TIER_REASONING, IN)
                await self.edge.add_session(session)
                for tier in (TIER_SPEECH, TIER_REASONING):
                    self.consumers.append(await self.transport.open_mailbox(session, tier, IN, _ignore))

        await asyncio.gather(*(starter() for _ in range(START_CONCURRENCY)))

    async def tidy(self) -> None:
        for consumer in self.consumers:
            with contextlib.suppress(Exception):
                await consumer.cancel()
        for session in self.sessions:
            for tier in (TIER_SPEECH, TIER_REASONING):
                await self.transport.delete_mailbox(session, tier)


async def measure_starts(starts: PerSessionStarts, count: int, broker_pids: list[int]) -> StartCost:
    cpu_before = cpu_of(broker_pids)
    began = time.perf_counter()
    await starts.start(count)
    took = time.perf_counter() - began
    cpu_after = cpu_of(broker_pids)
    cpu_ms = None if cpu_before is None or cpu_after is None else (cpu_after - cpu_before) / count * 1000
    return StartCost(per_s=count / took, broker_cpu_ms=cpu_ms)


# --- the load and the control probe, the same for both designs ------------------------------------


class Topology:
    """Where a design's messages for a session go, and the queues its consumer reads."""

    name: str

    async def declare(self, channel: AbstractChannel, sessions: list[str]) -> None:
        raise NotImplementedError

    def route(self, session: str, control: bool) -> str:
        """The routing key (on :attr:`exchange`) of a message for ``session``."""
        raise NotImplementedError

    def queues(self) -> list[str]:
        """The queues the consumer reads."""
        raise NotImplementedError

    async def delete(self, channel: AbstractChannel) -> None:
        for queue in self.queues():
            with contextlib.suppress(Exception):
                await channel.queue_delete(queue)
        with contextlib.suppress(Exception):
            await channel.exchange_delete(self.exchange)

    exchange: str


class PerSessionTopology(Topology):
    """A durable classic queue a session with bargein's mailbox arguments (two priority levels)."""

    name = "per-session"

    def __init__(self, run_id: str, arguments: dict[str, Any]) -> None:
        self.exchange = f"bench.scale.{run_id}.sessions"
        self.run_id = run_id
        self.arguments = arguments
        self._queues: list[str] = []

    async def declare(self, channel: AbstractChannel, sessions: list[str]) -> None:
        exchange = await channel.declare_exchange(
            self.exchange, aio_pika.ExchangeType.TOPIC, auto_delete=False
        )
        for session in sessions:
            queue = await channel.declare_queue(
                f"bench.scale.{self.run_id}.{session}", durable=True, arguments=self.arguments
            )
            await queue.bind(exchange, f"{session}.#")
            self._queues.append(queue.name)

    def route(self, session: str, control: bool) -> str:
        return f"{session}.{'control' if control else 'data'}"

    def queues(self) -> list[str]:
        return self._queues


class PartitionedTopology(Topology):
    """``partitions`` quorum queues of data and as many of control, sessions hashed to them."""

    name = "partitioned"

    def __init__(self, run_id: str, partitions: int = PARTITIONS) -> None:
        self.exchange = f"bench.scale.{run_id}.partitions"
        self.run_id = run_id
        self.partitions = partitions

    def _queue(self, partition: int, control: bool) -> str:
        return f"bench.scale.{self.run_id}.p{partition}.{'control' if control else 'data'}"

    async def declare(self, channel: AbstractChannel, sessions: list[str]) -> None:
        exchange = await channel.declare_exchange(
            self.exchange, aio_pika.ExchangeType.DIRECT, auto_delete=False
        )
        for partition in range(self.partitions):
            for control in (False, True):
                queue = await channel.declare_queue(
                    self._queue(partition, control),
                    durable=True,
                    arguments=PARTITION_ARGUMENTS,
                )
                await queue.bind(exchange, queue.name)

    def route(self, session: str, control: bool) -> str:
        return self._queue(partition_of(session, self.partitions), control)

    def queues(self) -> list[str]:
        return [self._queue(p, control) for p in range(self.partitions) for control in (False, True)]


def _busy(work_s: float) -> None:
    """A handler's CPU time: the consumer is as busy as a worker, not idle."""
    until = time.perf_counter() + work_s
    while time.perf_counter() < until:
        pass


async def control_latency(
    connection: AbstractRobustConnection,
    topology: Topology,
    sessions: list[str],
    *,
    rate: float,
    work_ms: float,
    samples: int,
    sample_interval_s: float,
) -> Latency:
    """``sessions`` each receiving ``rate`` data messages a second, one consumer for all of them
    (``work_ms`` of CPU a message, prefetch 1 a queue, as bargein's owners), and a control message
    to a session every ``sample_interval_s``: publish → handled."""
    latency = Latency()
    setup = await connection.channel()
    await topology.declare(setup, sessions)
    publisher = await connection.channel(publisher_confirms=True)
    exchange = await publisher.get_exchange(topology.exchange, ensure=False)
    consumer = await connection.channel()
    await consumer.set_qos(prefetch_count=1)  # per consumer: one message at a time a queue

    async def handle(message: AbstractIncomingMessage) -> None:
        sent = message.headers.get("sent")
        _busy(work_ms / 1000)
        if not message.headers.get("control"):
            latency.handled += 1
        elif isinstance(sent, int):  # an int: AMQP's floats are 32-bit
            latency.samples.append((time.perf_counter_ns() - sent) / 1e9)
        await message.ack()

    for name in topology.queues():
        queue = await consumer.get_queue(name, ensure=False)
        await queue.consume(handle)

    async def send(session: str, control: bool) -> None:
        key = topology.route(session, control)
        await exchange.publish(
            aio_pika.Message(
                b"x" * 120,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                priority=PRIORITY_CONTROL if control else PRIORITY_DATA,
                headers={"sent": time.perf_counter_ns(), "control": control},
            ),
            routing_key=key,
        )

    stop = asyncio.Event()

    async def load() -> None:
        period = 1.0 / (rate * len(sessions))
        next_at = time.perf_counter()
        i = 0
        pending: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            if len(pending) >= MAX_IN_FLIGHT:  # the broker confirms slower than asked: its pace
                await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                next_at = time.perf_counter()
            task = asyncio.create_task(send(sessions[i % len(sessions)], False))
            pending.add(task)
            task.add_done_callback(pending.discard)
            i += 1
            next_at += period
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        await asyncio.gather(*pending, return_exceptions=True)

    loader = asyncio.create_task(load())
    try:
        await asyncio.sleep(2.0)  # the load reaches its pace first
        began, handled_before = time.perf_counter(), latency.handled
        for i in range(samples):
            await send(sessions[(i * 7) % len(sessions)], True)
            await asyncio.sleep(sample_interval_s)
        latency.window = (latency.handled - handled_before, time.perf_counter() - began)
        await asyncio.sleep(1.0)
    finally:
        stop.set()
        await loader
        await consumer.close()
        await publisher.close()
        await topology.delete(setup)
        await setup.close()
    return latency


# --- failover after a node is lost ----------------------------------------------------------------


async def failover_time(
    url: str, queue: str, arguments: dict[str, Any], kill: Callable[[], Awaitable[None]]
) -> float | None:
    """Seconds from ``kill()`` (the queue's leader's node lost) to the first message published
    after it being consumed; None if that did not happen within FAILOVER_GIVE_UP_S. The publisher
    and the consumer reconnect and re-subscribe as bargein's processes do."""
    connection = await amqp_address.connect_robust(url)
    killed_at: int | None = None
    recovered = asyncio.get_running_loop().create_future()

    async def subscribe() -> None:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, durable=True, arguments=arguments)

        async def handle(message: AbstractIncomingMessage) -> None:
            await message.ack()
            sent = message.headers.get("sent")
            if killed_at is not None and isinstance(sent, int) and sent > killed_at and not recovered.done():
                recovered.set_result((time.perf_counter_ns() - killed_at) / 1e9)

        await declared.consume(handle)

    async def keep_consuming() -> None:
        while not recovered.done():
            with contextlib.suppress(Exception):
                await subscribe()
                return
            await asyncio.sleep(0.2)

    async def probe() -> None:
        channel: AbstractChannel | None = None
        while not recovered.done():
            try:
                if channel is None or channel.is_closed:
                    channel = await connection.channel(publisher_confirms=True)
                await asyncio.wait_for(
                    channel.default_exchange.publish(
                        aio_pika.Message(
                            b"probe",
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                            headers={"sent": time.perf_counter_ns()},
                        ),
                        routing_key=queue,
                    ),
                    timeout=1.0,
                )
            except Exception:
                channel = None
            await asyncio.sleep(PROBE_EVERY_S)

    try:
        await keep_consuming()
        prober = asyncio.create_task(probe())
        await asyncio.sleep(1.0)
        killed_at = time.perf_counter_ns()
        await kill()
        resubscriber = asyncio.create_task(_resubscribe_while(recovered, subscribe))
        try:
            return await asyncio.wait_for(asyncio.shield(recovered), FAILOVER_GIVE_UP_S)
        except TimeoutError:
            return None
        finally:
            prober.cancel()
            resubscriber.cancel()
    finally:
        with contextlib.suppress(Exception):
            channel = await connection.channel()
            await channel.queue_delete(queue)
        with contextlib.suppress(Exception):
            await connection.close()


async def _resubscribe_while(done: asyncio.Future[float], subscribe: Callable[[], Awaitable[None]]) -> None:
    """A consumer whose queue's leader moved may be cancelled by the broker: subscribe again, now
    and then, until the probe comes through (a second consumer on the queue does no harm)."""
    while not done.done():
        await asyncio.sleep(1.0)
        with contextlib.suppress(Exception):
            await subscribe()


def mailbox_arguments(transport: AmqpTransport) -> dict[str, Any]:
    """bargein's own arguments of a reasoning mailbox (two priority levels, bounded, dead-lettered)."""
    arguments = dict(transport._mailbox_arguments(TIER_REASONING))
    arguments.pop("x-dead-letter-exchange", None)  # the bench's queues are not bargein's to dead-letter
    return arguments


def new_run_id() -> str:
    return uuid.uuid4().hex[:8]
