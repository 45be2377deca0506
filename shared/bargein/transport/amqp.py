"""The RabbitMQ transport (aio-pika).

Topology, declared idempotently by every process at start-up (names in :mod:`bargein.wire.names`):

* ``bargein.events`` (topic, durable): every session event, keyed ``<session>.<in|out>.<Event>``;
* ``bargein.audio`` (topic): client audio frames (the speech tier);
* ``bargein.dead`` (fanout, durable) and its queue: messages no consumer could accept, with an
  ``x-bargein-reason`` header;
* ``bargein.sessions.<tier>`` (durable): session starts, taken by whichever worker has room;
* ``bargein.mailbox.<tier>.<session>``: one classic queue per session and tier, bound to the
  session's keys, with two priority levels (data, control), idle expiry, single active consumer.

Three channels, because their needs differ: data is published with publisher confirms; control
(``Event.control``) with confirms, high priority and ``mandatory`` + ``on_return_raises`` so an
interrupt that no queue would receive is an error rather than a silent success; and mailboxes are
consumed on a channel with a per-consumer prefetch of one, so a control message waiting in the
broker is never stuck behind a client-side buffer of data: priority can only reorder what is still
in the broker.

Output travels in bundles. A worker's sessions stream to the callers of a few edge processes, and
each AMQP message costs the publisher (framing, a confirm), the broker and the consumer about the
same whatever it carries; one message a chunk made those costs the limit of a worker. So the data a
session publishes ``out`` goes to an :class:`_Outlet` per edge process: what is ready while a
bundle is on its way to the broker goes, all of it, in the next one, routed by every one of its
routing keys (RabbitMQ's sender-selected distribution, the ``CC`` header), so it reaches every
queue that any of its sessions is bound to, once. Which edge a session's caller is on the worker
learns from the ``reply_to`` of what that edge publishes ``in``; a session it knows no edge for
(yet) is published message by message, as is control, and everything while a reconnect settles.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aio_pika
import aiormq
import aiormq.abc
from aio_pika.abc import (
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustChannel,
    AbstractRobustQueue,
)
from aio_pika.exceptions import DeliveryError, PublishError

from bargein.errors import (
    BrokerUnavailable,
    EnvelopeError,
    InvalidSessionId,
    NotOwner,
    QueueFull,
    UnroutableError,
)
from bargein.metrics import Counted
from bargein.settings import BrokerSettings, CoreSettings
from bargein.tasks import cancel_and_wait
from bargein.transport.abc import (
    AUDIO_PARTITION_MAILBOXES,
    PUT_BACK_AFTER_S,
    EdgeQueue,
    Handler,
    StartHandler,
    Subscription,
    Subscriptions,
    Transport,
    offer_start,
)
from bargein.transport.amqp_address import FailoverConnection, connect_robust
from bargein.wire.envelope import (
    DEFAULT_MAX_BYTES,
    BundleEntry,
    Envelope,
    decode,
    decode_bundle,
    encode,
    encode_bundle,
    new_message_id,
)
from bargein.wire.names import (
    AUDIO,
    AUDIO_EXCHANGE,
    CONTROL,
    DATA,
    DEAD_EXCHANGE,
    DEAD_QUEUE,
    DEAD_REASON_HEADER,
    EVENTS_EXCHANGE,
    IN,
    PARTITION_HEADER,
    PARTITIONED_TIERS,
    PRIORITY_CONTROL,
    PRIORITY_DATA,
    START_HEADER,
    TIER_EDGE,
    TIER_SPEECH,
    Direction,
    Kind,
    PartitionKind,
    Tier,
    edge_bindings,
    edge_queue,
    mailbox_binding,
    mailbox_extra_bindings,
    mailbox_queue,
    partition_headers,
    partition_kinds,
    partition_queue,
    partition_sources,
    partition_tag,
    partitions_exchange,
    routing_key,
    session_work_queue,
    tier_exchange,
)
from bargein.wire.session_info import SessionInfo

log = logging.getLogger("bargein.transport.amqp")

CONTENT_TYPE = "application/msgpack"
BUNDLE_CONTENT_TYPE = "application/vnd.bargein.bundle+msgpack"  # envelope.encode_bundle
BUNDLE_MAX_ENTRIES = 512
BUNDLE_MAX_SHARE = 4  # a bundle holds at most this fraction of what a consumer accepts (its bytes)
OUTLET_IN_FLIGHT = 1  # bundles to one edge awaiting their confirms at once; more waits for the next
ROUTES_KEPT = 65_536  # which edge each session's caller is on: forgotten wholesale beyond this
RECONNECT_INTERVAL_S = 1.0
QUEUE_FULL_RETRY_S = 0.02  # a full queue's consumer takes hundreds a second: try again soon
# A partition's basic.consume unanswered this long is given up, and tried again by the partition's
# keeper on a fresh channel (AmqpTransport._replace_consuming): after a node's stall, RabbitMQ 3.10
# left one unanswered for good, and the worker consumed none of its partitions again (the edge's
# request for chunks it missed waited there: two words of an answer lost, the freeze fault test)
PARTITION_CONSUME_WAIT_S = 2.0
# A partition's confirm comes in milliseconds, a leader election's in about one second: one not come
# after this long is stuck (see AmqpTransport._publish_to_partition), and published again
STUCK_CONFIRM_S = 2.0
RECENT_IDS_KEPT = 4_096  # message ids a partition consumer remembers, to drop what comes twice
# what a publish raises when the broker went away under it
BROKER_GONE = (
    aio_pika.exceptions.ChannelInvalidStateError,
    aio_pika.exceptions.AMQPConnectionError,
    ConnectionError,
)
EDGE_CONTROL_PREFETCH = 16
EDGE_ACK_EVERY = 50  # the edge acknowledges this many messages at once at most
DEAD_QUEUE_MAX = 10_000  # dead letters kept, the oldest dropped first ...
DEAD_QUEUE_MAX_BYTES = 16 * 1024 * 1024  # ... and at most this many bytes of them
DEAD_BODY_HEAD = 2048  # of a rejected message's body, this much is kept (its size is in a header)


class _Received(Protocol):
    """What consuming a message needs of it, whichever library handed it over."""

    @property
    def body(self) -> bytes: ...

    @property
    def content_type(self) -> str | None: ...

    @property
    def routing_key(self) -> str | None: ...


class _Delivery:
    """A message as aiormq hands it to a mailbox's consumer. Mailboxes are consumed on aiormq's
    channel directly: aio-pika's consumer would wrap each message (reading all its properties) and
    hand it on in a task of its own, one more pass of a busy event loop on an interrupt's way."""

    __slots__ = ("body", "content_type", "headers", "message_id", "reply_to", "routing_key", "tag")

    def __init__(self, delivered: aiormq.abc.DeliveredMessage) -> None:
        properties = delivered.header.properties
        deliver = delivered.delivery
        assert isinstance(deliver, aiormq.spec.Basic.Deliver) and deliver.delivery_tag is not None
        self.body: bytes = delivered.body
        self.content_type = properties.content_type
        self.headers = properties.headers
        self.message_id: str | None = properties.message_id
        self.reply_to = properties.reply_to
        self.routing_key = deliver.routing_key
        self.tag: int = deliver.delivery_tag


class _Consumer(Subscription):
    """``underlay`` is the AMQP channel the consumer was made on: after a reconnect that channel is
    closed (aio-pika makes a new one), and a consumer the broker cancelled is gone from it.
    ``abandoned``: channels the transport gave up on (the broker stopped answering on them), whose
    consumers are as good as gone although the channel is not closed yet."""

    def __init__(
        self,
        stop: Callable[[str], Awaitable[Any]],
        tag: str,
        underlay: aiormq.abc.AbstractChannel | None,
        abandoned: weakref.WeakSet[Any] | None = None,
    ) -> None:
        self._stop = stop
        self._tag: str | None = tag
        self._underlay = underlay
        self._abandoned = abandoned
        self._cancelling: asyncio.Future[None] | None = None
        self._refused = False

    @property
    def alive(self) -> bool:
        """Consuming still: not cancelled by us, by the broker (a queue that crashed or vanished)
        or by a lost connection (the consumer is not restored: its owner subscribes again)."""
        if self._tag is None:
            return False
        if self._underlay is None:  # robust (session starts, edge queue): aio-pika restores it
            return True
        if self._underlay.is_closed or (self._abandoned is not None and self._underlay in self._abandoned):
            return False
        if not self._tag:  # its basic.consume is on its way, and the broker delivers before it answers
            return True
        return self._tag in getattr(self._underlay, "consumers", {})

    @property
    def closing(self) -> bool:
        """Its owner is cancelling it (the session is closing here), not its handler's NotOwner."""
        return self._cancelling is not None and not self._refused

    def refused(self) -> None:
        """Its handler said NotOwner: what it puts back is for another process, in its turn."""
        self._refused = True

    async def cancel(self) -> None:
        """Stop consuming. A second call while the first is on its way waits for it: a handler
        that says NotOwner while its owner closes the session puts its message back only once
        the consumer is gone, or the broker hands it straight back to it."""
        if self._cancelling is None:
            tag, self._tag = self._tag, None
            self._cancelling = asyncio.ensure_future(self._stop_consuming(tag))
        await asyncio.shield(self._cancelling)

    async def _stop_consuming(self, tag: str | None) -> None:
        if tag is None:
            return
        try:
            await self._stop(tag)
        except Exception as exc:  # the channel may already be gone; nothing left to stop
            log.debug("cancelling consumer %s: %s", tag, exc)


def _forget_binding(queue: AbstractRobustQueue, exchange: str, key: str) -> None:
    """Take a binding off what aio-pika binds again after a reconnect. Its own ``unbind`` does
    that by going through every binding the queue has (aio-pika 10.2), and an edge's queues had a
    dozen a session then (two now), so each hang-up cost the edge's event loop time in proportion
    to its callers: taking 1,500 sessions off an edge took 64 s against 10 s to put them on. The
    bindings are kept by the key they were made with (``add_session``)."""
    bindings = getattr(queue, "_bindings", None)
    if isinstance(bindings, dict):
        bindings.pop((exchange, key), None)


class _AmqpEdgeQueue(EdgeQueue):
    """An edge process's two queues (:func:`~bargein.wire.names.edge_queue`), each drained in order
    by a task of its own: data in bulk (prefetch many), control on a channel of its own, so an
    interrupt never waits behind the chunks already on their way."""

    def __init__(
        self, queues: dict[Kind, AbstractRobustQueue], tasks: list[asyncio.Task[None]], sessions: set[str]
    ) -> None:
        self._queues = queues
        self._tasks = tasks
        self._sessions = sessions  # what it is bound to: a bundle's entries of other sessions are not ours

    @property
    def alive(self) -> bool:
        return all(not task.done() for task in self._tasks)

    async def add_session(self, session: str) -> None:
        self._sessions.add(session)
        for kind, key in edge_bindings(session):
            await self._queues[kind].bind(EVENTS_EXCHANGE, key)

    async def remove_session(self, session: str) -> None:
        self._sessions.discard(session)
        for kind, key in edge_bindings(session):
            queue = self._queues[kind]
            with contextlib.suppress(Exception):  # already gone with the connection
                channel = await queue.channel.get_underlay_channel()
                await channel.queue_unbind(queue.name, EVENTS_EXCHANGE, key)
            _forget_binding(queue, EVENTS_EXCHANGE, key)

    async def backlog(self) -> int:
        """Messages waiting in the data queue (asked of the broker)."""
        queue = self._queues[DATA]
        channel = await queue.channel.get_underlay_channel()
        declared = await channel.queue_declare(queue.name, passive=True)
        return declared.message_count or 0

    async def cancel(self) -> None:
        await cancel_and_wait(*self._tasks)


class _Outlet:
    """The output on its way to one edge process (see the module docstring): what is published in
    one pass of the event loop goes in one bundle, sent in the next pass; while
    ``OUTLET_IN_FLIGHT`` bundles await their confirms, what comes meanwhile waits and goes in one
    bundle as soon as one of them is back. So an idle worker sends each chunk at once, a busy one
    sends bigger bundles rather than more of them, and each publisher waits for the broker's
    confirm of the bundle that carried its envelope, as it would for its own message. Bundles are
    published on one channel in the order they were made; a session's next chunk is published only
    once its last one was confirmed, so its chunks keep their order."""

    def __init__(self, transport: AmqpTransport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._entries: list[tuple[str, str, bytes]] = []  # (session, routing key, envelope bytes)
        self._waiters: list[asyncio.Future[None]] = []
        self._in_flight = 0
        self._flush_due = False

    async def send(self, session: str, key: str, body: bytes) -> None:
        loop = self._loop
        waiter = loop.create_future()
        self._entries.append((session, key, body))
        self._waiters.append(waiter)
        if not self._flush_due:  # after what else is ready in this pass
            self._flush_due = True
            loop.call_soon(self._flush)
        try:
            await waiter
        except asyncio.CancelledError:
            self._withdraw(waiter)
            raise

    def _withdraw(self, waiter: asyncio.Future[None]) -> None:
        """Its publisher was cancelled (an interrupt cut the turn off) before its entry went into a
        bundle: it does not go. Sent later, it followed the turn's ``TurnInterrupted`` (published
        at once, not through the outlet) while a bundle was on its way: a chunk of a turn after the
        notice that the turn was cut (the edge's fence dropped it, but nothing should be there)."""
        for i, waiting in enumerate(self._waiters):
            if waiting is waiter:
                del self._waiters[i], self._entries[i]
                return

    def _flush(self) -> None:
        self._flush_due = False
        limit = self._transport.max_message_bytes // BUNDLE_MAX_SHARE
        while self._entries and self._in_flight < OUTLET_IN_FLIGHT:
            count, size = 0, 0
            for _, _, body in self._entries[:BUNDLE_MAX_ENTRIES]:
                if count and size + len(body) > limit:
                    break
                count, size = count + 1, size + len(body)
            entries, self._entries = self._entries[:count], self._entries[count:]
            waiters, self._waiters = self._waiters[:count], self._waiters[count:]
            self._in_flight += 1
            self._loop.create_task(self._send(entries, waiters), name="bundle")

    async def _send(self, entries: list[tuple[str, str, bytes]], waiters: list[asyncio.Future[None]]) -> None:
        try:
            async with asyncio.timeout(self._transport.broker_wait_s):
                await self._transport.publish_bundle(entries)
        except BaseException as exc:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(_for_each(exc))
            if not isinstance(exc, Exception):
                raise
        else:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        finally:
            self._in_flight -= 1
            if self._entries and not self._flush_due:
                self._flush_due = True
                self._loop.call_soon(self._flush)


def _for_each(exc: BaseException) -> Exception:
    """An error of a bundle, for one of its publishers (each raises its own: one exception object
    raised in many tasks collects all their tracebacks). Their retry loop tells these apart."""
    if isinstance(exc, QueueFull | UnroutableError | BrokerUnavailable):
        return type(exc)(str(exc))
    if isinstance(exc, BROKER_GONE):
        return ConnectionError(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, asyncio.CancelledError):  # the transport closes
        return BrokerUnavailable("the transport closed before this was sent")
    if isinstance(exc, TimeoutError):
        return BrokerUnavailable("RabbitMQ did not confirm a bundle in time (BARGEIN_BROKER_WAIT_S)")
    return BrokerUnavailable(f"publishing a bundle failed: {type(exc).__name__}: {exc}")


class AmqpTransport(Transport):
    def __init__(
        self,
        url: str,
        *,
        max_message_bytes: int = DEFAULT_MAX_BYTES,
        mailbox_expiry_ms: int = 3_600_000,
        audio_mailbox_frames: int = 500,
        name: str = "bargein",
        heartbeat_s: int = 10,
        broker_wait_s: float = 15.0,
        queue_max_messages: int = 10_000,
        edge_prefetch: int = 200,
        partitions: int = 0,
    ) -> None:
        self.url = url
        self.partition_count = partitions  # 0: a mailbox per session (Transport.partitions)
        self.queue_max_messages = queue_max_messages
        self.edge_prefetch = edge_prefetch
        self.heartbeat_s = heartbeat_s
        self.broker_wait_s = broker_wait_s
        self.max_message_bytes = max_message_bytes
        self.mailbox_expiry_ms = mailbox_expiry_ms
        self.audio_mailbox_frames = audio_mailbox_frames
        self.name = name
        self.counters: collections.Counter[str] = Counted("rabbitmq")
        self._connection: FailoverConnection | None = None
        self._data: AbstractRobustChannel | None = None
        self._control: AbstractRobustChannel | None = None
        self._consume: AbstractRobustChannel | None = None
        self._starts: AbstractRobustChannel | None = None
        # queue deletions: an RPC holds its channel's lock until the broker answers, and on the
        # publishing channels a thousand callers hanging up at once kept every publish waiting
        self._topology: AbstractRobustChannel | None = None
        self._events_data: AbstractExchange | None = None
        self._events_control: AbstractExchange | None = None
        self._dead: AbstractExchange | None = None
        self._audio_channel: AbstractRobustChannel | None = None
        self._audio: AbstractExchange | None = None
        self._usable = asyncio.Event()
        self._lost_at = time.monotonic()  # when the connection was last lost
        self._recovering_until = 0.0  # until then, an unroutable message is tried again
        self._closing = False  # our own close: not an outage worth a warning
        # Where output goes (see the module docstring). A consumer's view: the queue each
        # session's caller hears on, from the reply_to of what the caller's edge publishes in;
        # and the outlet of each of those queues.
        self._routes: dict[str, str] = {}
        self._outlets: dict[str, _Outlet] = {}
        # A publisher's view: the queue this process hears a session on (reply_to of what it
        # publishes in): its edge queue, or a session's own edge mailbox (a test's Caller).
        self._edge_route: str | None = None
        self._session_routes: dict[str, str] = {}
        self._work_queues_declared: set[Tier] = set()  # by this process: a start then only publishes
        self._replacing = asyncio.Lock()  # one fresh publishing channel for many stuck publishes
        self._abandoned: weakref.WeakSet[Any] = weakref.WeakSet()  # consuming channels given up on
        # since when publishes to a partition (control?, its tag) have been refused, on end
        self._refused_since: dict[tuple[bool, str], float] = {}
        self._retired: set[asyncio.Task[None]] = set()  # stuck channels on their way out
        self._recent_ids: collections.OrderedDict[str, None] = collections.OrderedDict()

    @classmethod
    async def connect(cls, url: str, **kwargs: Any) -> AmqpTransport:
        transport = cls(url, **kwargs)
        await transport.start()
        return transport

    @classmethod
    async def from_settings(
        cls, core: CoreSettings, broker: BrokerSettings, *, name: str, **kwargs: Any
    ) -> AmqpTransport:
        """Connected as every service connects, from its settings."""
        return await cls.connect(
            broker.rabbitmq_url,
            name=name,
            max_message_bytes=core.max_message_bytes,
            mailbox_expiry_ms=broker.mailbox_expiry_s * 1000,
            audio_mailbox_frames=broker.audio_mailbox_frames,
            heartbeat_s=broker.rabbitmq_heartbeat_s,
            broker_wait_s=broker.broker_wait_s,
            queue_max_messages=broker.queue_max_messages,
            partitions=broker.partition_count,
            **kwargs,
        )

    async def start(self) -> None:
        # a short heartbeat: the broker hands a frozen process's unacknowledged message back soon
        # a reconnect every second while the broker is away (aio-pika's default waits 5 s)
        # several addresses (a cluster's nodes): the first that answers, the next one on a loss
        self._connection = connection = await connect_robust(
            self.url,
            client_properties={"connection_name": self.name},
            heartbeat=self.heartbeat_s,
            reconnect_interval=RECONNECT_INTERVAL_S,
        )
        # usable = connected *and* every channel restored: aio-pika marks the connection connected
        # before it reopens the channels, and a publish in between fails
        self._connection.close_callbacks.add(self._on_closed)
        self._connection.reconnect_callbacks.add(self._on_reconnected)
        self._data = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
        self._control = await self._connection.channel(publisher_confirms=True, on_return_raises=True)
        self._consume = await self._connection.channel(publisher_confirms=False)
        await self._consume.set_qos(prefetch_count=1)  # per consumer: control is never stuck behind data
        self._starts = await self._connection.channel(publisher_confirms=False)
        await self._starts.set_qos(prefetch_count=1)
        self._topology = await self._connection.channel(publisher_confirms=False)
        self._events_data = await self._data.declare_exchange(
            EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
        )
        self._events_control = await self._control.declare_exchange(
            EVENTS_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
        )
        self._audio_channel = await self._connection.channel(publisher_confirms=False)
        self._audio = await self._audio_channel.declare_exchange(
            AUDIO_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True
        )
        self._dead = await self._data.declare_exchange(
            DEAD_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True
        )
        await self._declare_dead_queue()
        for tier in PARTITIONED_TIERS if self.partition_count else ():
            await self._declare_partitions(tier)
        self._usable.set()
        log.info("connected to RabbitMQ at %s as %r; topology declared", connection.address, self.name)

    def _on_closed(self, _sender: object, exc: BaseException | None = None) -> None:
        """Called on the loss and again on every failed attempt to reconnect: the loss is told
        once (aio-pika's own reports of it are filtered out, see hosting/logs.py)."""
        was_usable = self._usable.is_set()
        self._usable.clear()
        if exc is None or self._closing:
            return
        if was_usable:
            self._lost_at = time.monotonic()
            log.warning(
                "lost RabbitMQ (%s: %s); reconnecting, publishers wait up to %.0f s",
                type(exc).__name__,
                exc,
                self.broker_wait_s,
            )
        else:
            log.debug("RabbitMQ still away (%s: %s)", type(exc).__name__, exc)

    def _on_reconnected(self, *_: object) -> None:
        self._recovering_until = time.monotonic() + self.broker_wait_s
        self._usable.set()
        self.counters["reconnects"] += 1
        log.info(
            "reconnected to RabbitMQ at %s as %r after %.1f s; channels and consumers restored",
            self.address,
            self.name,
            time.monotonic() - self._lost_at,
        )

    async def _declare_dead_queue(self) -> None:
        """The dead-letter queue, bounded in length and bytes. One declared by an older bargein with
        other bounds is kept as it is (RabbitMQ refuses to change a queue's arguments; an operator
        may delete it, or set a policy), with a warning."""
        arguments = {
            "x-max-length": DEAD_QUEUE_MAX,
            "x-max-length-bytes": DEAD_QUEUE_MAX_BYTES,
            "x-overflow": "drop-head",
        }
        connection = self._need(self._connection)
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(DEAD_QUEUE, durable=True, arguments=arguments)
        except aio_pika.exceptions.ChannelPreconditionFailed:
            log.warning("%s exists with other limits than %s; keeping it as it is", DEAD_QUEUE, arguments)
            channel = await connection.channel()
            queue = await channel.declare_queue(DEAD_QUEUE, passive=True)
        await queue.bind(DEAD_EXCHANGE)
        await channel.close()

    @property
    def address(self) -> str:
        """The RabbitMQ node this process is connected to (or trying to reach), without a password."""
        return self._connection.address if self._connection is not None else "(not connected)"

    @property
    def connected(self) -> bool:
        """Usable now (a robust connection that is reconnecting is not: the broker is away)."""
        connection = self._connection
        return connection is not None and not connection.is_closed and self._usable.is_set()

    async def close(self) -> None:
        for task in self._retired:  # their channels close with the connection
            task.cancel()
        if self._connection is not None:
            self._closing = True
            await self._connection.close()
            self._connection = None

    def _need(self, thing: Any) -> Any:
        if thing is None:
            raise RuntimeError("AmqpTransport is not started (call start() or connect())")
        return thing

    # --- publishing ------------------------------------------------------------------------------

    async def publish(self, envelope: Envelope, direction: Direction) -> None:
        """While the broker is away (a restart), wait for it to come back, up to ``broker_wait_s``
        (audio, worthless by then, does not wait); then :class:`BrokerUnavailable`. Events toward
        the agent are persistent: what waits in a mailbox survives a broker restart. For a while
        after a reconnect, a message that reaches no queue is tried again: the other processes'
        queues (an edge's is exclusive) come back at their own pace, and output published before
        its edge is back would be lost."""
        session = envelope.session
        key = routing_key(session, direction, envelope.type)
        if envelope.lane == "audio":
            await self.publish_audio(key, encode(envelope), session)
            return
        body = encode(envelope)
        control = envelope.control
        persistent = direction == IN
        reply_to = (self._session_routes.get(session) or self._edge_route) if persistent else None
        headers = self._partition_headers(session) if persistent and self.partition_count else None
        route = None if persistent or control else self._routes.get(session)
        if route is not None and self.connected and time.monotonic() >= self._recovering_until:
            try:  # the usual way of output: no timer of its own (each bundle has one)
                await self._outlet(route).send(session, key, body)
                return
            except (QueueFull, *BROKER_GONE):
                pass  # then as any message below
        full = False
        message_id = new_message_id()  # the same for every attempt: a consumer drops a second copy
        try:
            async with asyncio.timeout(self.broker_wait_s):
                while True:
                    if not self.connected:
                        self.counters["publishes_waiting_for_broker"] += 1
                        await self._usable.wait()
                    recovering = time.monotonic() < self._recovering_until
                    try:
                        if route is not None and not recovering:
                            await self._outlet(route).send(session, key, body)
                            return
                        publish = functools.partial(
                            self.publish_raw,
                            key,
                            body,
                            control=control,
                            persistent=persistent,
                            mandatory=control or recovering,
                            reply_to=reply_to,
                            headers=headers,
                            message_id=message_id,
                        )
                        if headers is None:
                            await publish()
                        else:
                            await self._publish_to_partition(publish, headers, control=control)
                        return
                    except BROKER_GONE:  # it went away between the check and the publish
                        pass
                    except QueueFull:  # the consumer is behind: wait for it (backpressure)
                        self.counters["publishes_held_back"] += 1
                        full = True
                        await asyncio.sleep(QUEUE_FULL_RETRY_S)
                        continue
                    except UnroutableError:
                        if not recovering:
                            raise
                        self.counters["republished_after_reconnect"] += 1
                    await asyncio.sleep(RECONNECT_INTERVAL_S / 10)
        except TimeoutError:
            self.counters["publishes_unavailable"] += 1
            why = "a queue on the way stayed full" if full else "RabbitMQ did not come back"
            raise BrokerUnavailable(f"{why} for {self.broker_wait_s:.0f} s") from None

    async def publish_audio(self, key: str, body: bytes, session: str | None = None) -> None:
        """Audio is transient and high-rate: no confirms to wait for, and old audio is worthless
        anyway (speech mailboxes drop their oldest frames when full), so it is dropped, not held,
        while the broker is away."""
        headers = self._partition_headers(session) if session and self.partitions(TIER_SPEECH) else None
        message = aio_pika.Message(body, content_type=CONTENT_TYPE, headers=headers)
        try:
            if not self.connected:
                raise aio_pika.exceptions.ChannelInvalidStateError("the broker is away")
            await self._need(self._audio).publish(message, key, mandatory=False)
        except BROKER_GONE:
            self.counters["audio_dropped_broker_away"] += 1
            raise BrokerUnavailable("RabbitMQ is away; audio is not kept") from None
        self.counters["published_audio"] += 1

    async def publish_raw(
        self,
        key: str,
        body: bytes,
        *,
        control: bool = False,
        persistent: bool = False,
        mandatory: bool | None = None,
        reply_to: str | None = None,
        headers: dict[str, Any] | None = None,
        message_id: str | None = None,
    ) -> None:
        """Publish bytes as they are (the codec's output, or a malformed message in tests).
        ``mandatory`` (default: control only) raises :class:`UnroutableError` if no queue took it."""
        if mandatory is None:
            mandatory = control
        message = aio_pika.Message(
            body,
            content_type=CONTENT_TYPE,
            priority=PRIORITY_CONTROL if control else PRIORITY_DATA,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            if persistent
            else aio_pika.DeliveryMode.NOT_PERSISTENT,
            reply_to=reply_to,
            headers=headers,
            message_id=message_id or new_message_id(),  # (else aiormq makes a UUID for each one)
        )
        await self._publish(message, key, control=control, mandatory=mandatory)
        self.counters["published"] += 1

    async def publish_bundle(self, entries: list[tuple[str, str, bytes]]) -> None:
        """Publish (session, routing key, envelope bytes) entries as one message, routed by all
        their keys (one of them alone: as it is)."""
        keys = list(dict.fromkeys(key for _, key, _ in entries))
        if len(entries) == 1:
            await self.publish_raw(keys[0], entries[0][2])
            return
        bundle: list[BundleEntry] = [(session, body) for session, _, body in entries]
        also: list[Any] = keys[1:]  # the other routing keys (an AMQP field array)
        message = aio_pika.Message(
            encode_bundle(bundle),
            content_type=BUNDLE_CONTENT_TYPE,
            priority=PRIORITY_DATA,
            delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT,
            headers={"CC": also} if also else None,
            message_id=new_message_id(),
        )
        await self._publish(message, keys[0], control=False, mandatory=False)
        self.counters["published"] += len(entries)
        self.counters["published_bundles"] += 1

    async def _publish(self, message: aio_pika.Message, key: str, *, control: bool, mandatory: bool) -> None:
        exchange = self._need(self._events_control if control else self._events_data)
        kind = CONTROL if control else DATA
        try:
            await exchange.publish(message, key, mandatory=mandatory)
        except PublishError as exc:  # returned: no queue is bound for it
            self.counters[f"unroutable_{kind}"] += 1
            raise UnroutableError(f"{kind} message {key} reached no queue") from exc
        except DeliveryError as exc:  # refused (nack): a queue it goes to is full
            self.counters[f"refused_{kind}"] += 1
            raise QueueFull(f"{kind} message {key}: a queue it goes to is full") from exc

    async def _publish_to_partition(
        self, publish: Callable[[], Awaitable[None]], headers: dict[str, Any], *, control: bool
    ) -> None:
        """``publish`` to a partition (a quorum queue), on a fresh channel when the one it went on
        seems wedged for that queue: refused for :data:`STUCK_CONFIRM_S` on end, or its confirm not
        come after as long. The caller bounds the whole, and waits after a refusal (QueueFull) as
        for any full queue.

        Measured on RabbitMQ 3.10 (the node-loss fault test, about one run in two): after the
        processes reconnected to a surviving node, within 0.1 s of the loss and so while the
        partitions elected new leaders, one partition refused every message one edge published to
        it (1,917 refusals in 40 s) though it held a handful: that session's caller went unheard
        for good. A channel's first publish to a quorum queue registers it with the queue's leader,
        and RabbitMQ 3.10 refuses the message when that times out, as it does with a leader that is
        gone; a fresh channel registers again, with the leader there is now, and goes through.
        Confirms that never come after a leader change are a fault of the same part (fixed in
        RabbitMQ 4.0 and 4.2), met the same way. Should the first copy arrive after all (a stalled
        broker), the partition's consumer drops the second by its message id (:meth:`_take`)."""
        channel = self._control if control else self._data
        queue = (control, headers[PARTITION_HEADER])
        try:
            async with asyncio.timeout(STUCK_CONFIRM_S):
                await publish()
        except TimeoutError:
            self.counters["confirms_stuck"] += 1
            await self._replace_publisher(channel, control=control, why="was not confirmed")
            await self._publish_to_partition(publish, headers, control=control)
        except QueueFull:
            first = self._refused_since.setdefault(queue, time.monotonic())
            if time.monotonic() - first >= STUCK_CONFIRM_S:
                del self._refused_since[queue]
                await self._replace_publisher(channel, control=control, why="was refused")
            raise
        else:
            self._refused_since.pop(queue, None)

    async def _replace_publisher(
        self, stuck: AbstractRobustChannel | None, *, control: bool, why: str
    ) -> None:
        """A fresh publishing channel in place of ``stuck`` (once, however many publishes were
        stuck on it); the stuck one is closed in the background, later."""
        async with self._replacing:
            if stuck is not (self._control if control else self._data):
                return  # another stuck publish replaced it already
            connection = self._need(self._connection)
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            events = await channel.get_exchange(EVENTS_EXCHANGE, ensure=False)  # declared at start
            if control:
                self._control, self._events_control = channel, events
            else:
                self._data, self._events_data = channel, events
                self._dead = await channel.get_exchange(DEAD_EXCHANGE, ensure=False)
            self.counters["publishing_channels_replaced"] += 1
            log.warning(
                "a %s publish to a partition %s for %.0f s: publishing on a fresh channel (RabbitMQ "
                "3.10 can wedge a channel that began to publish to a quorum queue as its leader changed)",
                CONTROL if control else DATA,
                why,
                STUCK_CONFIRM_S,
            )
        if stuck is not None:
            self._retire_later(stuck)

    def _retire_later(self, channel: AbstractRobustChannel) -> None:
        """Close a replaced channel in the background (:meth:`_retire`)."""
        task = asyncio.create_task(self._retire(channel))
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    async def _retire(self, channel: AbstractRobustChannel) -> None:
        """Close a replaced channel once what else was on its way there is confirmed (its other
        queues answer as ever): as long as any publisher waits."""
        await asyncio.sleep(self.broker_wait_s)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.broker_wait_s):
                await channel.close()

    def _outlet(self, route: str) -> _Outlet:
        outlet = self._outlets.get(route)
        if outlet is None:
            outlet = self._outlets[route] = _Outlet(self, asyncio.get_running_loop())
        return outlet

    def _heard_on(self, session: str, route: str | None) -> None:
        """What a session's caller publishes says which queue it hears the session on."""
        if route is None or self._routes.get(session) == route:
            return
        if len(self._routes) >= ROUTES_KEPT:
            self._routes.clear()  # only ever an optimisation: sessions go message by message again
        self._routes[session] = route

    # --- mailboxes -------------------------------------------------------------------------------

    def _mailbox_arguments(self, tier: Tier) -> dict[str, Any]:
        # No x-single-active-consumer: a frozen consumer keeps that slot (and RabbitMQ 3.10 crashes
        # such queues on redelivery, issue #5460); the lease and the owner's check before every
        # message (NotOwner) keep a mailbox to one owner instead.
        arguments: dict[str, Any] = {"x-queue-type": "classic", "x-expires": self.mailbox_expiry_ms}
        if tier == TIER_SPEECH:  # audio: bounded, oldest dropped (not dead-lettered): it is worthless
            arguments.update({"x-max-length": self.audio_mailbox_frames, "x-overflow": "drop-head"})
        else:
            # bounded: when full, the broker refuses more and the publisher waits (backpressure)
            arguments.update(
                {
                    "x-max-priority": PRIORITY_CONTROL,
                    "x-dead-letter-exchange": DEAD_EXCHANGE,
                    "x-max-length": self.queue_max_messages,
                    "x-overflow": "reject-publish",
                }
            )
        return arguments

    async def _declare_mailbox(self, session: str, tier: Tier, direction: Direction) -> str:
        """Declare ``tier``'s mailbox for ``session`` and its bindings, on a channel of its own (a
        refused declaration closes its channel). One declared by an older bargein with other
        arguments is used as it is until it expires."""
        name = mailbox_queue(tier, session)
        connection = self._need(self._connection)
        channel = await connection.channel(publisher_confirms=False)
        try:
            try:
                queue = await channel.declare_queue(
                    name, durable=True, arguments=self._mailbox_arguments(tier), robust=False
                )
            except aio_pika.exceptions.ChannelPreconditionFailed:
                self.counters["mailboxes_with_old_arguments"] += 1
                channel = await connection.channel(publisher_confirms=False)
                queue = await channel.declare_queue(name, passive=True, robust=False)
            await queue.bind(tier_exchange(tier), mailbox_binding(session, direction), robust=False)
            for exchange, key in mailbox_extra_bindings(tier, session):
                await queue.bind(exchange, key, robust=False)
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        return name

    # --- partitioned mailboxes --------------------------------------------------------------------

    def _partition_headers(self, session: str) -> dict[str, Any]:
        return dict(partition_headers(session, self.partition_count))

    def _partition_arguments(self, kind: PartitionKind) -> dict[str, Any]:
        """Events: replicated (a quorum queue survives the loss of a minority of nodes), bounded as
        a mailbox is, dead-lettered; one consumer at a time (a worker that lost a partition and
        still consumes it keeps its successor waiting, not doubled). Audio: a classic queue, as a
        speech mailbox is (replicated by the operator's policy, if at all: audio is worthless
        late), holding :data:`AUDIO_PARTITION_MAILBOXES` mailboxes' worth of frames, the oldest
        dropped first. No single active consumer on a classic queue (RabbitMQ 3.10 crashes such
        queues on redelivery, issue #5460): the partition's lease keeps it to one consumer."""
        if kind == AUDIO:
            return {
                "x-queue-type": "classic",
                "x-max-length": self.audio_mailbox_frames * AUDIO_PARTITION_MAILBOXES,
                "x-overflow": "drop-head",
            }
        return {
            "x-queue-type": "quorum",
            "x-single-active-consumer": True,
            "x-dead-letter-exchange": DEAD_EXCHANGE,
            "x-max-length": self.queue_max_messages,
            "x-overflow": "reject-publish",
        }

    async def _declare_partitions(self, tier: Tier) -> None:
        """``bargein.events`` (and ``bargein.audio``) → one headers exchange per kind → each
        partition's queue of that kind (``partition_sources``). Declared by every process at
        start-up (idempotent), so that a session started before any worker consumed its partition
        waits there; on a channel of its own (a refused declaration closes its channel). A
        partition declared with other bounds is used as it is."""
        connection = self._need(self._connection)
        channel = await connection.channel(publisher_confirms=False)
        try:
            for kind in partition_kinds(tier):
                exchange = await channel.declare_exchange(
                    partitions_exchange(tier, kind), aio_pika.ExchangeType.HEADERS, durable=True, robust=False
                )
                for source, key in partition_sources(tier, kind):
                    await exchange.bind(source, key, robust=False)
                for partition in range(self.partition_count):
                    name = partition_queue(tier, partition, kind)
                    try:
                        queue = await channel.declare_queue(
                            name, durable=True, arguments=self._partition_arguments(kind), robust=False
                        )
                    except aio_pika.exceptions.ChannelPreconditionFailed:
                        self.counters["partitions_with_old_arguments"] += 1
                        log.warning("%s exists with other arguments; using it as it is", name)
                        channel = await connection.channel(publisher_confirms=False)
                        queue = await channel.declare_queue(name, passive=True, robust=False)
                    await queue.bind(
                        partitions_exchange(tier, kind),
                        arguments={"x-match": "all", PARTITION_HEADER: partition_tag(partition)},
                        robust=False,
                    )
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        log.info("%d partitions of the %s tier's mailboxes declared", self.partition_count, tier)

    async def open_partition(
        self, tier: Tier, partition: int, handler: Handler, on_start: StartHandler
    ) -> Subscription:
        robust: AbstractRobustChannel = self._need(self._consume)
        channel: Any = await robust.get_underlay_channel()  # (aiormq types its callbacks narrowly)
        consumers: list[Subscription] = []
        for kind in partition_kinds(tier):
            name = partition_queue(tier, partition, kind)
            consumer = _Consumer(channel.basic_cancel, "", channel, self._abandoned)
            on_message = self._partition_consumer(channel, name, handler, on_start, consumer)
            try:
                consuming = await channel.basic_consume(name, on_message, timeout=PARTITION_CONSUME_WAIT_S)
            except BaseException as exc:
                for started in consumers:  # (gone with the channel, if it closed)
                    with contextlib.suppress(Exception):
                        await started.cancel()
                if isinstance(exc, TimeoutError | aio_pika.exceptions.ChannelInvalidStateError):
                    await self._replace_consuming(robust)
                raise
            consumer._tag = consuming.consumer_tag
            consumers.append(consumer)
        return Subscriptions(consumers)

    async def _replace_consuming(self, stuck: AbstractRobustChannel) -> None:
        """A fresh consuming channel in place of ``stuck``, for the next consume. A consume the
        broker leaves unanswered (``PARTITION_CONSUME_WAIT_S``) closes its channel, by asking the
        broker to: after a node's stall RabbitMQ 3.10 left that unanswered too, and aio-pika
        reopens a channel only once it is closed, so every consume on it failed ("closed by RPC
        timeout") and the worker consumed none of its partitions for a minute (the freeze fault
        test, partitioned: an answer's words were lost)."""
        async with self._replacing:
            if self._consume is not stuck or not self._usable.is_set():
                return  # replaced already, or the connection is down (it reopens every channel)
            try:
                fresh = await self._need(self._connection).channel(publisher_confirms=False)
                await fresh.set_qos(prefetch_count=1)
            except BROKER_GONE:
                return  # the broker went away meanwhile: the next consume tries again
            self._consume = fresh
            with contextlib.suppress(*BROKER_GONE):  # what else consumes there is consumed again
                self._abandoned.add(await stuck.get_underlay_channel())
            self.counters["consuming_channels_replaced"] += 1
            log.warning("a partition's consume failed on its channel: consuming on a fresh one from now on")
        self._retire_later(stuck)

    def _partition_consumer(
        self,
        channel: aiormq.abc.AbstractChannel,
        queue: str,
        handler: Handler,
        on_start: StartHandler,
        consumer: _Consumer,
    ) -> Callable[[aiormq.abc.DeliveredMessage], Awaitable[None]]:
        """Handle, then acknowledge (prefetch 1, as a mailbox). What cannot be taken yet is kept and
        tried again, not put back: a quorum queue on RabbitMQ 3.10 puts a returned message behind
        the others, and a session's messages must stay in order. Only once the consumer is
        cancelled (the partition moves) does it go back, for the next owner."""

        async def on_message(delivered: aiormq.abc.DeliveredMessage) -> None:
            message = _Delivery(delivered)
            while not await self._take(message, queue, handler, on_start):
                if not consumer.alive:
                    self.counters["partition_put_back"] += 1
                    with contextlib.suppress(*BROKER_GONE):  # its channel closed: put back by the broker
                        await channel.basic_nack(message.tag, requeue=True)
                    return
                self.counters["partition_tried_again"] += 1
                await asyncio.sleep(PUT_BACK_AFTER_S)
            with contextlib.suppress(*BROKER_GONE):
                await channel.basic_ack(message.tag)

        return on_message

    async def _take(self, message: _Delivery, queue: str, handler: Handler, on_start: StartHandler) -> bool:
        """Hand one partition message over: False when it must wait (NotOwner, or a start the
        worker did not take). A second copy (published again when its confirm was stuck:
        :meth:`_publish_to_partition`) is dropped."""
        if message.message_id is not None and message.message_id in self._recent_ids:
            self.counters["partition_duplicates_dropped"] += 1
            return True
        try:
            if message.headers and START_HEADER in message.headers:
                taken = await self._start(message, queue, on_start)
            else:
                await self._handle(message, queue, None, self._noting_route(handler, message.reply_to))
                taken = True
        except NotOwner:
            return False
        if taken and message.message_id is not None:
            self._recent_ids[message.message_id] = None
            if len(self._recent_ids) > RECENT_IDS_KEPT:
                self._recent_ids.popitem(last=False)
        return taken

    def _noting_route(self, handler: Handler, reply_to: str | None) -> Handler:
        """``handler``, after noting which edge queue the session's caller hears on (what a
        mailbox's consumer knows by its session, a partition's learns from each envelope)."""

        async def handle(envelope: Envelope, event: Any) -> None:
            self._heard_on(envelope.session, reply_to)
            await handler(envelope, event)

        return handle

    async def _start(self, message: _Delivery, queue: str, on_start: StartHandler) -> bool:
        """A session start in a partition: False to have it again later (the handler had no room,
        or failed: Redis away, say); one that cannot be read is dead-lettered."""

        async def dead_letter(exc: EnvelopeError) -> None:
            await self._dead_letter(message, exc.reason, str(exc), queue)

        taken = await offer_start(message.body, queue, on_start, dead_letter)
        if taken is None:
            self.counters["partition_start_failed"] += 1
        return bool(taken)

    async def open_edge_queue(self, owner: str, handler: Handler) -> EdgeQueue:
        """Exclusive queues (they live and die with this process's connection), bounded: when one
        is full the broker refuses what is published to it, and the publisher waits (backpressure),
        instead of the queue growing without end."""
        connection = self._need(self._connection)
        arguments = {"x-max-length": self.queue_max_messages, "x-overflow": "reject-publish"}
        queues: dict[Kind, AbstractRobustQueue] = {}
        tasks: list[asyncio.Task[None]] = []
        sessions: set[str] = set()
        self._edge_route = edge_queue(owner, DATA)  # where its callers' sessions are to be sent
        for kind, prefetch in ((DATA, self.edge_prefetch), (CONTROL, EDGE_CONTROL_PREFETCH)):
            channel = await connection.channel(publisher_confirms=False)
            await channel.set_qos(prefetch_count=prefetch)
            queue = await channel.declare_queue(edge_queue(owner, kind), exclusive=True, arguments=arguments)
            queues[kind] = queue
            inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
            # robust: aio-pika consumes again after a reconnect. Deliveries are put in the inbox in
            # the order they came (each put finishes at once), and one task handles them in order.
            await queue.consume(inbox.put)
            drain = self._drain(queue, inbox, handler, sessions)
            tasks.append(asyncio.create_task(drain, name=f"edge:{kind}"))
        return _AmqpEdgeQueue(queues, tasks, sessions)

    async def _drain(
        self,
        queue: AbstractQueue,
        inbox: asyncio.Queue[AbstractIncomingMessage],
        handler: Handler,
        sessions: set[str],
    ) -> None:
        """Handle what arrives, in order, and acknowledge in batches (one ``multiple`` ack for up
        to EDGE_ACK_EVERY messages: acknowledging each one costs the edge half its throughput)."""
        while True:
            message = await inbox.get()
            handled = 0
            while True:
                try:
                    await self._handle(message, queue.name, None, handler, serves=sessions)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # dead-lettering failed (the broker went): keep draining
                    self.counters["edge_handling_failed"] += 1
                    log.warning(
                        "edge queue %s: a bad message could not be dead-lettered (%s: %s)",
                        queue.name,
                        type(exc).__name__,
                        exc,
                    )
                handled += 1
                if handled >= EDGE_ACK_EVERY or inbox.empty():
                    break
                message = inbox.get_nowait()
            try:
                await message.ack(multiple=True)
            except BROKER_GONE:  # its channel went while they were handled: the acks are moot
                self.counters["acks_lost_with_channel"] += 1

    async def _handle(
        self,
        message: _Received,
        queue: str,
        session: str | None,
        handler: Handler,
        *,
        serves: set[str] | None = None,
    ) -> bool:
        """Decode and hand over one message, or each envelope of a bundle of the sessions this
        queue is for (``session``'s mailbox; the ``serves`` of an edge queue): the others' came
        along with them. True if the handler took all. What fails to decode, is for another
        session (when the queue is one session's), or makes the handler fail is dead-lettered
        with its reason instead (not acknowledged here: the caller does)."""
        if message.content_type != BUNDLE_CONTENT_TYPE:
            return await self._handle_one(message, message.body, queue, session, handler)
        try:
            entries = decode_bundle(message.body, max_bytes=self.max_message_bytes)
        except EnvelopeError as exc:
            await self._dead_letter(message, exc.reason, str(exc), queue)
            return False
        handled = True
        for entry_session, body in entries:
            if entry_session != session if serves is None else entry_session not in serves:
                self.counters["bundled_for_others"] += 1
                continue
            handled &= await self._handle_one(message, body, queue, entry_session, handler)
        return handled

    async def _handle_one(
        self, message: _Received, body: bytes, queue: str, session: str | None, handler: Handler
    ) -> bool:
        try:
            envelope, event = decode(body, max_bytes=self.max_message_bytes)
            if session is not None and envelope.session != session:
                raise InvalidSessionId(f"message for session {envelope.session!r} in {queue}")
        except EnvelopeError as exc:
            await self._dead_letter(message, exc.reason, str(exc), queue, body=body)
            return False
        try:
            await handler(envelope, event)
        except (asyncio.CancelledError, NotOwner):
            raise
        except Exception as exc:
            log.exception("handler failed on %s in %s", envelope.type, queue)
            await self._dead_letter(
                message, "handler_error", f"{type(exc).__name__}: {exc}", queue, body=body
            )
            return False
        return True

    async def declare_mailbox(self, session: str, tier: Tier, direction: Direction) -> None:
        if not self.partitions(tier):
            await self._declare_mailbox(session, tier, direction)

    async def open_mailbox(
        self, session: str, tier: Tier, direction: Direction, handler: Handler
    ) -> Subscription:
        """The consumer is not restored by aio-pika after a reconnect (one session's queue that
        failed to restore would stop the others'): :attr:`Subscription.alive` says when its owner
        must subscribe again."""
        name = await self._declare_mailbox(session, tier, direction)
        if tier == TIER_EDGE:  # a caller of its own (a test's): what it says in is heard here
            self._session_routes[session] = name
        channel = await self._need(self._consume).get_underlay_channel()
        consumer = _Consumer(channel.basic_cancel, "", channel, self._abandoned)
        on_message = self._mailbox_consumer(channel, name, session, handler, consumer)
        consuming = await channel.basic_consume(name, on_message)
        consumer._tag = consuming.consumer_tag
        return consumer

    def _mailbox_consumer(
        self,
        channel: aiormq.abc.AbstractChannel,
        queue: str,
        session: str,
        handler: Handler,
        consumer: _Consumer,
    ) -> Callable[[aiormq.abc.DeliveredMessage], Awaitable[None]]:
        """Handle, then acknowledge (prefetch 1: the next comes only then)."""

        async def on_message(delivered: aiormq.abc.DeliveredMessage) -> None:
            message = _Delivery(delivered)
            self._heard_on(session, message.reply_to)
            try:
                await self._handle(message, queue, session, handler)
            except asyncio.CancelledError:
                raise  # unacknowledged: redelivered to the next consumer
            except NotOwner:  # back to the mailbox, for the owner; this consumer stops here
                if consumer.closing:
                    # its owner is closing the session: put back once the cancel has got through,
                    # or the message comes straight back to this consumer, over and over (every
                    # closing session's leftovers in a mass hang-up, the broker busy with them)
                    await consumer.cancel()
                else:  # a process that lost the session: put back at once, for the owner behind it
                    consumer.refused()
                with contextlib.suppress(*BROKER_GONE):  # its channel closed: put back by the broker
                    await channel.basic_nack(message.tag, requeue=True)
                await consumer.cancel()  # (done already when its owner was closing it)
                return
            await channel.basic_ack(message.tag)

        return on_message

    async def delete_mailbox(self, session: str, tier: Tier) -> None:
        self._routes.pop(session, None)
        if self.partitions(tier):
            return  # what is left of the session in its partition is dropped by its owner
        if tier == TIER_EDGE:
            self._session_routes.pop(session, None)
        channel = self._need(self._topology)
        try:
            await channel.queue_delete(mailbox_queue(tier, session))
        except Exception as exc:
            log.debug("deleting mailbox %s/%s: %s", tier, session, exc)

    async def mailbox_exists(self, session: str, tier: Tier) -> bool:
        """A passive declare, on a channel of its own: RabbitMQ closes the channel that asks about
        a queue it does not have (or whose node is gone)."""
        if self.partitions(tier):
            return True
        channel = await self._need(self._connection).channel(publisher_confirms=False)
        try:
            await channel.declare_queue(mailbox_queue(tier, session), passive=True, robust=False)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return False
        finally:
            with contextlib.suppress(Exception):
                await channel.close()
        return True

    async def _reject(self, message: AbstractIncomingMessage, reason: str, error: str, queue: str) -> None:
        """Dead-letter with a reason and acknowledge."""
        try:
            await self._dead_letter(message, reason, error, queue)
        finally:
            await message.ack()

    async def _dead_letter(
        self,
        message: _Received,
        reason: str,
        error: str,
        queue: str,
        *,
        body: bytes | None = None,
    ) -> None:
        """Put a copy in the dead-letter queue with a reason, count it, log the first of each kind.
        ``body``: the envelope of a bundle that is refused, rather than the whole message."""
        content_type = message.content_type if body is None else CONTENT_TYPE
        body = message.body if body is None else body
        self.counters[f"dead:{reason}"] += 1
        if self.counters[f"dead:{reason}"] == 1 or self.counters[f"dead:{reason}"] % 1000 == 0:
            log.warning(
                "dead-lettering a message from %s (%s, %d so far): %s",
                queue,
                reason,
                self.counters[f"dead:{reason}"],
                error[:300],
            )
        headers: dict[str, Any] = {
            DEAD_REASON_HEADER: reason,
            "x-bargein-error": error[:1000],
            "x-bargein-queue": queue,
            "x-bargein-routing-key": message.routing_key or "",
            "x-bargein-body-bytes": len(body),
        }
        head = body[:DEAD_BODY_HEAD]  # enough to see what it was; a huge body is not kept
        await self._need(self._dead).publish(
            aio_pika.Message(head, headers=headers, content_type=content_type), ""
        )

    # --- session starts --------------------------------------------------------------------------

    async def _work_queue(self, channel: AbstractRobustChannel, tier: Tier) -> AbstractQueue:
        name = session_work_queue(tier)
        return await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "classic"})

    async def publish_session_start(self, tier: Tier, info: bytes) -> None:
        """One publish and its confirm, no declaration: a start used to cost a round trip more (a
        declaration, or a passive one for the partitions' exchange). The work queue is declared
        on this process's first start only, and again should the broker return a start as
        unroutable (the queue was deleted, or lost with its node)."""
        channel = self._need(self._data)
        partitioned = bool(self.partitions(tier))
        headers = None
        if partitioned:  # down the session's partition, ahead of what it is sent
            headers = {**self._partition_headers(SessionInfo.decode(info).session_id), START_HEADER: "1"}
        message = aio_pika.Message(
            info,
            content_type=CONTENT_TYPE,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            headers=headers,
            message_id=new_message_id(),
        )
        if partitioned:
            assert headers is not None
            publish = functools.partial(self._publish_start, tier, message)
            async with asyncio.timeout(self.broker_wait_s):
                while True:
                    try:
                        await self._publish_to_partition(publish, headers, control=False)
                        return
                    except QueueFull:
                        await asyncio.sleep(QUEUE_FULL_RETRY_S)
        if tier not in self._work_queues_declared:
            await self._work_queue(channel, tier)
            self._work_queues_declared.add(tier)
        try:
            await channel.default_exchange.publish(message, session_work_queue(tier), mandatory=True)
        except PublishError:
            self.counters["work_queue_declared_again"] += 1
            await self._work_queue(channel, tier)
            await channel.default_exchange.publish(message, session_work_queue(tier), mandatory=True)

    async def _publish_start(self, tier: Tier, message: aio_pika.Message) -> None:
        # the partitions' exchange is declared at start-up by every process (_declare_partitions)
        starts = partitions_exchange(tier, partition_kinds(tier)[0])
        exchange = await self._need(self._data).get_exchange(starts, ensure=False)
        try:
            await exchange.publish(message, "", mandatory=True)
        except PublishError as exc:
            raise UnroutableError(f"the start of a {tier} session reached no partition") from exc
        except DeliveryError as exc:  # refused (nack): the partition is full, or see _publish_to_partition
            self.counters["refused_data"] += 1
            raise QueueFull(f"the start of a {tier} session was refused") from exc

    async def consume_session_starts(self, tier: Tier, handler: StartHandler) -> Subscription:
        queue = await self._work_queue(self._need(self._starts), tier)

        async def on_start(message: AbstractIncomingMessage) -> None:
            try:
                accepted = await handler(message.body)
            except EnvelopeError as exc:
                await self._reject(message, exc.reason, str(exc), queue.name)
                return
            except Exception as exc:
                log.exception("session start failed")
                await self._reject(message, "start_failed", f"{type(exc).__name__}: {exc}", queue.name)
                return
            if accepted:
                await message.ack()
            else:  # no room here: give another worker the chance
                await asyncio.sleep(0.2)
                await message.nack(requeue=True)

        tag = await queue.consume(on_start)
        return _Consumer(queue.cancel, tag, None)
