"""The in-process transport and state store, for the SDK's tests, ``LocalSession`` and the demo.

They implement :mod:`bargein.transport.abc` with the same semantics the RabbitMQ and Redis
implementations have (``tests/contract`` runs one suite against both), so everything above them is
exercised for real: messages are encoded to bytes and decoded again (bad ones, and ones for another
session, are dead-lettered with a reason), mailboxes outlive their consumers, delivery is one
message at a time per mailbox in publish order except that control overtakes the data still
waiting, an interrupt nobody would receive is an error, audio mailboxes keep only their newest
frames, leases lapse and epochs fence stale writers.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import math
import re
import time
from collections.abc import Callable, Collection, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from bargein.errors import (
    BrokerUnavailable,
    EnvelopeError,
    InvalidSessionId,
    NotOwner,
    QueueFull,
    StaleEpochError,
    UnroutableError,
)
from bargein.metrics import Counted
from bargein.tasks import cancel_and_wait
from bargein.transport.abc import (
    AUDIO_PARTITION_MAILBOXES,
    NO_LOG_CHANGE,
    PUT_BACK_AFTER_S,
    EdgeQueue,
    Handler,
    Heartbeat,
    LogChange,
    Renewal,
    StartHandler,
    StateStore,
    Subscription,
    Subscriptions,
    Transport,
    offer_start,
)
from bargein.wire.envelope import DEFAULT_MAX_BYTES, Envelope, decode, encode
from bargein.wire.names import (
    AUDIO,
    CONTROL,
    DATA,
    EVENTS_EXCHANGE,
    PARTITIONED_TIERS,
    TIER_SPEECH,
    Direction,
    Kind,
    PartitionKind,
    Tier,
    edge_bindings,
    edge_queue,
    lane_exchange,
    mailbox_binding,
    mailbox_extra_bindings,
    mailbox_queue,
    partition_kinds,
    partition_of,
    partition_queue,
    partition_sources,
    routing_key,
    tier_exchange,
)
from bargein.wire.session_info import SessionInfo

log = logging.getLogger("bargein.transport.memory")


@functools.lru_cache(maxsize=8192)
def _topic_regex(pattern: str) -> re.Pattern[str]:
    regex = "^" + r"\.".join(
        {"*": r"[^.]+", "#": r".*"}.get(word, re.escape(word)) for word in pattern.split(".")
    )
    return re.compile(regex.replace(r"\..*", r"(\..*)?") + "$")


def topic_matches(pattern: str, key: str) -> bool:
    """AMQP topic semantics: ``*`` is one word, ``#`` is zero or more."""
    return _topic_regex(pattern).match(key) is not None


class _Mailboxes(dict[str, "_Mailbox"]):
    """The broker's mailboxes by name, counting changes: :meth:`MemoryBroker.route` remembers
    where each routing key goes until a mailbox or a binding changes (``bindings_changed``)."""

    version = 0

    def __setitem__(self, name: str, box: _Mailbox) -> None:
        super().__setitem__(name, box)
        self.version += 1

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self.version += 1

    def pop(self, name: str, *default: Any) -> Any:
        self.version += 1
        return super().pop(name, *default)

    def bindings_changed(self) -> None:
        self.version += 1


@dataclass
class DeadLetter:
    reason: str
    error: str
    body: bytes
    queue: str = ""  # the mailbox it came from (RabbitMQ's x-bargein-queue header)


class _Item(NamedTuple):
    serial: int  # publish order across the broker
    body: bytes
    control: bool
    start: bool = False  # a session start down its partition (body: SessionInfo)


@dataclass
class _Mailbox:
    name: str
    patterns: list[tuple[str, str]]  # (exchange, topic pattern)
    session: str | None = None  # a session's mailbox takes only that session's envelopes
    priority: bool = True  # control overtakes waiting data (RabbitMQ: x-max-priority); audio: FIFO
    max_length: int | None = None  # keep only the newest (RabbitMQ: x-max-length, drop-head)
    refuse_when_full: int | None = None  # refuse more (RabbitMQ: x-max-length, reject-publish)
    items: collections.deque[_Item] = field(default_factory=collections.deque)
    # what the consumer awaits while the mailbox is empty (a bare future on the consumer's loop:
    # an asyncio.Event asks for the running loop at every wait, a system call on Python 3.11)
    waiter: asyncio.Future[None] | None = None
    consumer: asyncio.Task[None] | None = None
    # consumers waiting for the one consuming now to stop (NotOwner, cancel), first come first
    # served: an adopter subscribed while the old owner still consumed. RabbitMQ hands a mailbox's
    # messages to all its consumers in turn (no single-active-consumer: amqp.py says why), but the
    # old one takes one at most, refuses it and stops; in one process nothing pauses a consumer
    standby: collections.deque[_MemorySubscription] = field(default_factory=collections.deque)

    def put(self, item: _Item) -> bool:
        """Queue ``item``; False if the oldest waiting item was dropped to make room."""
        dropped = False
        if self.max_length is not None and len(self.items) >= self.max_length:
            # drop-head, as RabbitMQ's x-overflow does for audio (never the one in flight)
            del self.items[1 if self.consumer is not None and len(self.items) > 1 else 0]
            dropped = True
        if item.control and self.priority:
            # ahead of the data waiting, behind the one being handled (prefetch 1) and earlier control
            i = 1 if self.consumer is not None and self.items else 0
            while i < len(self.items) and self.items[i].control:
                i += 1
            self.items.insert(i, item)
        else:
            self.items.append(item)
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        return not dropped

    def promote(self) -> None:
        """The active consumer stopped: the first one waiting takes over, from the head."""
        if self.consumer is None and self.standby:
            self.standby.popleft().activate()

    async def stop(self) -> None:
        """The broker's side: every consumer of the mailbox is gone (deleted, closed)."""
        self.standby.clear()
        task, self.consumer = self.consumer, None
        await cancel_and_wait(task)

    async def arrival(self, loop: asyncio.AbstractEventLoop) -> None:
        """Return once there is an item."""
        while not self.items:
            self.waiter = loop.create_future()
            await self.waiter


class MemoryBroker:
    """One process-wide 'broker': a topic exchange in front of named mailboxes."""

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_message_bytes = max_message_bytes
        self.mailboxes = _Mailboxes()
        self._routes: dict[tuple[str, str], list[_Mailbox]] = {}  # (exchange, key) → mailboxes
        self._routes_version = -1
        self.dead: list[DeadLetter] = []
        self.starts: dict[str, collections.deque[bytes]] = collections.defaultdict(collections.deque)
        self.start_wakeup: dict[str, asyncio.Event] = collections.defaultdict(asyncio.Event)
        self.counters: collections.Counter[str] = Counted("memory")
        self._serial = itertools.count(1)
        self._last_serial = 0

    def route(self, exchange: str, key: str, body: bytes, *, control: bool = False) -> int:
        """Put the message in every mailbox bound to ``key``; as RabbitMQ does, a full mailbox that
        refuses it does not keep it from the others, and the publisher hears :class:`QueueFull`."""
        serial = next(self._serial)
        self._last_serial = serial
        delivered = refused = 0
        for box in self._bound(exchange, key):
            if box.refuse_when_full is not None and len(box.items) >= box.refuse_when_full:
                refused += 1
                continue
            if not box.put(_Item(serial, body, control)):
                self.counters["dropped_oldest"] += 1
            delivered += 1
        if refused:
            self.counters["refused"] += 1
            raise QueueFull(f"message {key}: {refused} queue(s) it goes to are full")
        if not delivered:
            self.counters["unroutable"] += 1
            if control:
                raise UnroutableError(f"control message {key} reached no queue")
        return delivered

    def put(self, box: _Mailbox, body: bytes, *, control: bool = False, start: bool = False) -> None:
        """Put a message in ``box`` itself (a partition's queue, which RabbitMQ reaches by a
        header, not a topic); :class:`QueueFull` if it refuses more."""
        if box.refuse_when_full is not None and len(box.items) >= box.refuse_when_full:
            self.counters["refused"] += 1
            raise QueueFull(f"{box.name} is full")
        serial = self._last_serial = next(self._serial)
        box.put(_Item(serial, body, control, start))

    def _bound(self, exchange: str, key: str) -> list[_Mailbox]:
        """The mailboxes a message with ``key`` on ``exchange`` goes to (looked up once per key
        between binding changes: a scan of every binding per message grew with the sessions)."""
        if self._routes_version != self.mailboxes.version:
            self._routes.clear()
            self._routes_version = self.mailboxes.version
        boxes = self._routes.get((exchange, key))
        if boxes is None:
            boxes = self._routes[(exchange, key)] = [
                box
                for box in self.mailboxes.values()
                if any(ex == exchange and topic_matches(p, key) for ex, p in box.patterns)
            ]
        return boxes

    def dead_letter(self, reason: str, error: str, body: bytes, queue: str = "") -> None:
        self.dead.append(DeadLetter(reason, error, body, queue))
        self.counters[f"dead:{reason}"] += 1
        if self.counters[f"dead:{reason}"] == 1:
            log.warning("dead-lettered a message (%s): %s", reason, error)

    async def settle(self, rounds: int = 2, timeout: float = 10.0) -> None:
        """Wait until every consumed mailbox has handled what was published before each round.

        Two rounds cover a message and whatever its handler published in turn (an interrupt and the
        TurnInterrupted it causes), which makes in-process tests deterministic.
        """
        deadline = time.monotonic() + timeout
        for _ in range(rounds):
            target = self._last_serial
            # a message leaves its mailbox only after its handler returned; control may have
            # overtaken older data, so look at every item, not only the head
            while any(
                box.consumer is not None and any(item.serial <= target for item in box.items)
                for box in self.mailboxes.values()
            ):
                if time.monotonic() > deadline:
                    raise TimeoutError("in-memory broker did not settle")
                await asyncio.sleep(0.001)


class _TaskSubscription(Subscription):
    def __init__(self, task: asyncio.Task[None]) -> None:
        self._task = task

    @property
    def alive(self) -> bool:
        return not self._task.done()

    async def cancel(self) -> None:
        await cancel_and_wait(self._task)


class _MemoryEdgeQueue(EdgeQueue):
    """Two mailboxes, as on RabbitMQ: data and control, each with a consumer of its own."""

    def __init__(self, broker: MemoryBroker, boxes: dict[Kind, _Mailbox]) -> None:
        self._broker = broker
        self._boxes = boxes

    async def add_session(self, session: str) -> None:
        for kind, key in edge_bindings(session):
            patterns = self._boxes[kind].patterns
            if (EVENTS_EXCHANGE, key) not in patterns:
                patterns.append((EVENTS_EXCHANGE, key))
        self._broker.mailboxes.bindings_changed()

    async def remove_session(self, session: str) -> None:
        keys = {key for _, key in edge_bindings(session)}
        for box in self._boxes.values():
            box.patterns = [(ex, p) for ex, p in box.patterns if p not in keys]
        self._broker.mailboxes.bindings_changed()

    async def backlog(self) -> int:
        return len(self._boxes[DATA].items)

    @property
    def alive(self) -> bool:
        return all(box.consumer is not None and not box.consumer.done() for box in self._boxes.values())

    async def cancel(self) -> None:
        for box in self._boxes.values():
            await box.stop()
            self._broker.mailboxes.pop(box.name, None)


class _MemorySubscription(Subscription):
    """One consumer of a session's mailbox: the one consuming, or one waiting for it to stop."""

    def __init__(self, box: _Mailbox, consume: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._box = box
        self._consume = consume
        self._task: asyncio.Task[None] | None = None

    def activate(self) -> None:
        self._task = self._box.consumer = asyncio.create_task(
            self._consume(), name=f"consume:{self._box.name}"
        )

    @property
    def alive(self) -> bool:
        if self in self._box.standby:
            return True
        return self._task is not None and self._box.consumer is self._task and not self._task.done()

    async def cancel(self) -> None:
        box, task = self._box, self._task
        if self in box.standby:
            box.standby.remove(self)
            return
        if task is None or box.consumer is not task:
            return  # stopped already (NotOwner, or the mailbox went)
        box.consumer = None
        await cancel_and_wait(task)
        box.promote()


def _subscribe(box: _Mailbox, consume: Callable[[], Coroutine[Any, Any, None]]) -> _MemorySubscription:
    """A consumer of ``box``: consuming at once, or waiting until the one consuming stops (one at a
    time, as a quorum queue with a single active consumer, or a mailbox a thawed owner still holds)."""
    subscription = _MemorySubscription(box, consume)
    if box.consumer is None:
        subscription.activate()
    else:
        box.standby.append(subscription)
    return subscription


class MemoryTransport(Transport):
    def __init__(
        self,
        broker: MemoryBroker | None = None,
        *,
        audio_mailbox_frames: int = 500,
        queue_max_messages: int | None = None,
        broker_wait_s: float = 15.0,
        partitions: int = 0,
    ) -> None:
        self.broker = broker or MemoryBroker()
        self.partition_count = partitions
        self.audio_mailbox_frames = audio_mailbox_frames
        self.queue_max_messages = queue_max_messages  # None: unbounded, as tests mostly want
        self.broker_wait_s = broker_wait_s

    async def publish(self, envelope: Envelope, direction: Direction) -> None:
        key = routing_key(envelope.session, direction, envelope.type)
        body, exchange, control = encode(envelope), lane_exchange(envelope.lane), envelope.control
        partitions = list(self._partitions_hearing(exchange, key)) if self.partition_count else []
        deadline = None
        while True:
            try:
                while partitions:  # its partitions take it first: a control message is routed then
                    tier, kind = partitions[0]
                    self.broker.put(self._partition_box(envelope.session, kind, tier), body, control=control)
                    partitions.pop(0)  # (not again if a queue after it is full)
                    control = False
                if envelope.lane == "audio" and self.partitions(TIER_SPEECH):
                    return  # nothing else hears the caller's audio
                self.broker.route(exchange, key, body, control=control)
                return
            except QueueFull:  # the consumer is behind: wait for it (backpressure)
                if deadline is None:
                    deadline = time.monotonic() + self.broker_wait_s
                elif time.monotonic() > deadline:
                    raise BrokerUnavailable(
                        f"a queue on the way stayed full for {self.broker_wait_s:.0f} s"
                    ) from None
                await asyncio.sleep(0.005)

    async def publish_raw(
        self,
        session: str,
        direction: Direction,
        event_name: str,
        body: bytes,
        *,
        exchange: str = EVENTS_EXCHANGE,
    ) -> None:
        """Publish bytes as they are: how tests put malformed messages on the bus."""
        self.broker.route(exchange, routing_key(session, direction, event_name), body)

    async def open_mailbox(
        self, session: str, tier: Tier, direction: Direction, handler: Handler
    ) -> Subscription:
        name = mailbox_queue(tier, session)
        await self.declare_mailbox(session, tier, direction)
        box = self.broker.mailboxes[name]
        return _subscribe(box, functools.partial(self._consume, box, handler))

    async def _consume(self, box: _Mailbox, handler: Handler) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not box.items:
                await box.arrival(loop)
            item = box.items[0]
            try:
                await self._hand(box, item, handler)
            except NotOwner:
                box.consumer = None  # the message stays at the head; this consumer is done
                box.promote()
                return
            box.items.remove(item)  # not popleft: control may have been put ahead of it meanwhile

    async def _hand(self, box: _Mailbox, item: _Item, handler: Handler) -> None:
        """Decode ``item`` and hand it to ``handler``; what fails to decode, is for another session
        or makes the handler fail is dead-lettered. Raises :class:`NotOwner` (and cancellation):
        the item stays at the head."""
        broker = self.broker
        try:
            envelope, event = decode(item.body, max_bytes=broker.max_message_bytes)
            if box.session is not None and envelope.session != box.session:
                raise InvalidSessionId(f"message for session {envelope.session!r} in {box.name}")
        except EnvelopeError as exc:
            broker.dead_letter(exc.reason, str(exc), item.body, box.name)
            return
        try:
            await handler(envelope, event)
        except (asyncio.CancelledError, NotOwner):
            raise
        except Exception as exc:
            log.exception("handler failed on %s", envelope.type)
            broker.dead_letter("handler_error", f"{type(exc).__name__}: {exc}", item.body, box.name)

    # --- partitioned mailboxes ----------------------------------------------------------------------

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def _partitions_hearing(exchange: str, key: str) -> tuple[tuple[Tier, PartitionKind], ...]:
        """The partitioned tiers' queues (tier, kind) a message reaches (RabbitMQ: through their
        headers exchanges, ``partition_sources``)."""
        return tuple(
            (tier, kind)
            for tier in PARTITIONED_TIERS
            for kind in partition_kinds(tier)
            if any(ex == exchange and topic_matches(p, key) for ex, p in partition_sources(tier, kind))
        )

    def _partition_box(self, session: str, kind: PartitionKind, tier: Tier) -> _Mailbox:
        return self._partition(tier, partition_of(session, self.partition_count), kind)

    def _partition(self, tier: Tier, partition: int, kind: PartitionKind) -> _Mailbox:
        """A partition's queue of ``kind`` (made on first use: RabbitMQ's are declared at start-up),
        bounded as AmqpTransport's are."""
        name = partition_queue(tier, partition, kind)
        box = self.broker.mailboxes.get(name)
        if box is None:
            audio = kind == AUDIO
            box = self.broker.mailboxes[name] = _Mailbox(
                name,
                [],
                priority=False,
                max_length=self.audio_mailbox_frames * AUDIO_PARTITION_MAILBOXES if audio else None,
                refuse_when_full=None if audio else self.queue_max_messages,
            )
        return box

    async def open_partition(
        self, tier: Tier, partition: int, handler: Handler, on_start: StartHandler
    ) -> Subscription:
        subscriptions: list[Subscription] = []
        for kind in partition_kinds(tier):
            box = self._partition(tier, partition, kind)
            consume = functools.partial(self._consume_partition, box, handler, on_start)
            subscriptions.append(_subscribe(box, consume))
        return Subscriptions(subscriptions)

    async def _consume_partition(self, box: _Mailbox, handler: Handler, on_start: StartHandler) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not box.items:
                await box.arrival(loop)
            item = box.items[0]
            try:
                if item.start:
                    taken = await self._start(box, item, on_start)
                else:
                    await self._hand(box, item, handler)
                    taken = True
            except NotOwner:
                taken = False
            if not taken:  # tried again a little later, the rest waiting behind it
                self.broker.counters["partition_tried_again"] += 1
                await asyncio.sleep(PUT_BACK_AFTER_S)
                continue
            box.items.remove(item)

    async def _start(self, box: _Mailbox, item: _Item, on_start: StartHandler) -> bool:

        async def dead_letter(exc: EnvelopeError) -> None:
            self.broker.dead_letter(exc.reason, str(exc), item.body, box.name)

        taken = await offer_start(item.body, box.name, on_start, dead_letter)
        if taken is None:
            self.broker.counters["partition_start_failed"] += 1
        return bool(taken)

    async def open_edge_queue(self, owner: str, handler: Handler) -> EdgeQueue:
        boxes: dict[Kind, _Mailbox] = {}
        for kind in (DATA, CONTROL):
            name = edge_queue(owner, kind)
            box = self.broker.mailboxes[name] = _Mailbox(name, [], refuse_when_full=self.queue_max_messages)
            box.consumer = asyncio.create_task(self._consume(box, handler), name=f"consume:{name}")
            boxes[kind] = box
        return _MemoryEdgeQueue(self.broker, boxes)

    async def declare_mailbox(self, session: str, tier: Tier, direction: Direction) -> None:
        name = mailbox_queue(tier, session)
        if name not in self.broker.mailboxes and not self.partitions(tier):
            audio = tier == TIER_SPEECH
            self.broker.mailboxes[name] = _Mailbox(
                name,
                [
                    (tier_exchange(tier), mailbox_binding(session, direction)),
                    *mailbox_extra_bindings(tier, session),
                ],
                session=session,
                priority=not audio,
                max_length=self.audio_mailbox_frames if audio else None,
                refuse_when_full=None if audio else self.queue_max_messages,
            )

    async def publish_session_start(self, tier: Tier, info: bytes) -> None:
        if self.partitions(tier):
            box = self._partition_box(SessionInfo.decode(info).session_id, partition_kinds(tier)[0], tier)
            self.broker.put(box, info, start=True)
            return
        self.broker.starts[tier].append(info)
        self.broker.start_wakeup[tier].set()

    async def consume_session_starts(self, tier: Tier, handler: StartHandler) -> Subscription:
        task = asyncio.create_task(self._consume_starts(tier, handler), name=f"starts:{tier}")
        return _TaskSubscription(task)

    async def _consume_starts(self, tier: Tier, handler: StartHandler) -> None:
        queue, wakeup = self.broker.starts[tier], self.broker.start_wakeup[tier]
        while True:
            while not queue:
                wakeup.clear()
                await wakeup.wait()
            info = queue.popleft()
            if not await handler(info):
                queue.append(info)  # no room here: back to the queue
                await asyncio.sleep(0.05)

    async def delete_mailbox(self, session: str, tier: Tier) -> None:
        if self.partitions(tier):
            return
        box = self.broker.mailboxes.pop(mailbox_queue(tier, session), None)
        if box is not None:
            await box.stop()

    async def mailbox_exists(self, session: str, tier: Tier) -> bool:
        return bool(self.partitions(tier)) or mailbox_queue(tier, session) in self.broker.mailboxes

    async def close(self) -> None:
        for box in list(self.broker.mailboxes.values()):
            await box.stop()


class _MemoryHeartbeat(Heartbeat):
    def __init__(self, alive: set[tuple[str, str]], key: tuple[str, str]) -> None:
        self._alive = alive
        self._key = key
        self.alive_until = math.inf  # nothing pauses a process in a test
        self.alive_since = -math.inf

    def stop(self) -> None:
        self._alive.discard(self._key)


@dataclass
class _Lease:
    owner: str
    epoch: int
    expires: float


class MemoryStateStore(StateStore):
    def __init__(self) -> None:
        self._leases: dict[tuple[str, str], _Lease] = {}
        self._epochs: collections.Counter[tuple[str, str]] = collections.Counter()
        self._state: dict[tuple[str, str], tuple[bytes, float]] = {}
        self._logs: dict[tuple[str, str], dict[bytes, bytes]] = {}  # the checkpoints' logs
        self._directory: dict[str, dict[str, bytes]] = collections.defaultdict(dict)
        self._workers: dict[str, set[str]] = {}
        self._alive: set[tuple[str, str]] = set()  # in one process a heartbeat lasts until stopped
        self._owned: dict[tuple[str, str], set[str]] = {}
        self._partition_counts: dict[str, int] = {}
        self._callers: dict[str, float] = {}  # session -> deadline (wall clock)
        self._calls: dict[tuple[str, str], tuple[str, float]] = {}  # (carrier, call) -> session, expiry

    async def acquire_lease(
        self, tier: Tier, session: str, owner: str, ttl_ms: int, *, replacing: str | None = None
    ) -> int | None:
        key = (tier, session)
        now = time.monotonic()
        lease = self._leases.get(key)
        if lease is not None and lease.expires > now and (replacing is None or lease.owner != replacing):
            return None
        self._epochs[key] += 1
        self._leases[key] = _Lease(owner, self._epochs[key], now + ttl_ms / 1000)
        return self._epochs[key]

    async def renew_lease(self, tier: Tier, session: str, owner: str, epoch: int, ttl_ms: int) -> Renewal:
        key = (tier, session)
        now = time.monotonic()
        lease = self._leases.get(key)
        if lease is not None and lease.expires > now:
            if lease.owner != owner or lease.epoch != epoch:
                return Renewal.LOST
            lease.expires = now + ttl_ms / 1000
            return Renewal.RENEWED
        if self._epochs[key] > epoch:  # it lapsed, and a later owner was handed a later epoch
            return Renewal.LOST
        self._epochs[key] = epoch
        self._leases[key] = _Lease(owner, epoch, now + ttl_ms / 1000)
        return Renewal.RESTORED

    async def release_lease(self, tier: Tier, session: str, owner: str, epoch: int) -> None:
        lease = self._leases.get((tier, session))
        if lease is not None and lease.owner == owner and lease.epoch == epoch:
            del self._leases[(tier, session)]

    async def save_state(
        self, tier: Tier, session: str, epoch: int, data: bytes, ttl_ms: int, log: LogChange = NO_LOG_CHANGE
    ) -> None:
        if epoch != self._epochs[(tier, session)]:
            raise StaleEpochError(f"epoch {epoch} is not current for {tier}/{session}")
        self._state[(tier, session)] = (data, time.monotonic() + ttl_ms / 1000)
        items = self._logs.setdefault((tier, session), {})
        for name in log.removed():
            items.pop(name, None)
        items.update(log.written())

    async def load_state(self, tier: Tier, session: str) -> bytes | None:
        entry = self._state.get((tier, session))
        if entry is None or entry[1] <= time.monotonic():
            return None
        return entry[0]

    async def load_log(self, tier: Tier, session: str) -> dict[bytes, bytes]:
        if await self.load_state(tier, session) is None:  # the log expires with its record
            return {}
        return dict(self._logs.get((tier, session), {}))

    async def current_epoch(self, tier: Tier, session: str) -> int:
        return self._epochs.get((tier, session), 0)

    async def delete_state(self, tier: Tier, session: str) -> None:
        """The checkpoint and the epoch counter go (the next acquire starts at epoch 1 again)."""
        self._state.pop((tier, session), None)
        self._logs.pop((tier, session), None)
        self._epochs.pop((tier, session), None)

    async def register_session(self, tier: Tier, session: str, info: bytes) -> None:
        self._directory[tier][session] = info

    async def unregister_session(self, tier: Tier, session: str) -> None:
        self._directory[tier].pop(session, None)

    async def session_info(self, tier: Tier, session: str) -> bytes | None:
        return self._directory[tier].get(session)

    async def absent_sessions(self, tier: Tier, sessions: Collection[str]) -> list[str]:
        return [s for s in sessions if s not in self._directory[tier]]

    async def restore_sessions(
        self, tier: Tier, records: Mapping[str, bytes], epochs: Mapping[str, int] | None = None
    ) -> list[str]:
        directory = self._directory[tier]
        restored = [s for s in records if s not in directory]
        directory.update({s: records[s] for s in restored})
        for session in restored:
            floor = (epochs or {}).get(session, 0)
            self._epochs[(tier, session)] = max(self._epochs[(tier, session)], floor)
        return restored

    async def orphaned_sessions(
        self, tier: Tier, limit: int = 100, wanted: Callable[[str], bool] | None = None
    ) -> list[tuple[str, bytes]]:
        now = time.monotonic()
        out: list[tuple[str, bytes]] = []
        for session, info in self._directory[tier].items():
            if len(out) >= limit:
                break
            if wanted is not None and not wanted(session):
                continue
            lease = self._leases.get((tier, session))
            if lease is None or lease.expires <= now:
                out.append((session, info))
        return out

    def keep_alive(self, tier: Tier, owner: str, ttl_ms: int) -> Heartbeat:
        self._workers.setdefault(tier, set()).add(owner)
        self._alive.add((tier, owner))
        return _MemoryHeartbeat(self._alive, (tier, owner))

    async def dead_workers(self, tier: Tier) -> list[str]:
        return sorted(o for o in self._workers.get(tier, set()) if (tier, o) not in self._alive)

    async def live_workers(self, tier: Tier) -> list[str]:
        return sorted(o for o in self._workers.get(tier, set()) if (tier, o) in self._alive)

    async def claim_partition_count(self, tier: Tier, count: int) -> int:
        return self._partition_counts.setdefault(tier, count)

    async def note_owned(self, tier: Tier, owner: str, session: str, owned: bool) -> None:
        sessions = self._owned.setdefault((tier, owner), set())
        if owned:
            sessions.add(session)
        else:
            sessions.discard(session)

    async def owned_sessions(self, tier: Tier, owner: str) -> list[str]:
        return sorted(self._owned.get((tier, owner), set()))

    async def forget_worker(self, tier: Tier, owner: str) -> None:
        self._workers.get(tier, set()).discard(owner)
        self._alive.discard((tier, owner))
        self._owned.pop((tier, owner), None)

    async def expect_callers(self, deadlines: Mapping[str, float]) -> None:
        for session, deadline in deadlines.items():
            self._callers[session] = max(deadline, self._callers.get(session, deadline))

    async def callers_gone(self, now: float, limit: int = 100) -> list[str]:
        due = [s for s, deadline in self._callers.items() if deadline <= now][: max(limit, 0)]
        for session in due:
            del self._callers[session]
        return due

    async def caller_deadline(self, session: str) -> float | None:
        return self._callers.get(session)

    async def forget_callers(self, session: str) -> None:
        self._callers.pop(session, None)

    async def note_call(self, carrier: str, call_id: str, session: str, ttl_ms: int) -> None:
        if ttl_ms <= 0:
            raise ValueError(f"ttl_ms must be positive, got {ttl_ms}")
        self._calls[(carrier, call_id)] = (session, time.monotonic() + ttl_ms / 1000)

    async def session_of_call(self, carrier: str, call_id: str) -> str | None:
        session, expires = self._calls.get((carrier, call_id), (None, 0.0))
        return session if expires > time.monotonic() else None

    def expire_lease(self, tier: Tier, session: str) -> None:
        """Test hook: the owner died and its lease ran out."""
        self._leases.pop((tier, session), None)

    def heartbeat_missing(self, tier: Tier, owner: str, missing: bool = True) -> None:
        """Test hook: Redis lost this live worker's heartbeat (or, ``missing=False``, its next beat
        wrote it back): the others do not count it meanwhile."""
        if missing:
            self._workers.get(tier, set()).discard(owner)
        else:
            self._workers.setdefault(tier, set()).add(owner)

    def lose_everything(self) -> None:
        """Test hook: the store restarted empty (Redis without persistence)."""
        for records in (
            self._leases,
            self._epochs,
            self._state,
            self._logs,
            self._directory,
            self._owned,
            self._callers,
            self._calls,
        ):
            records.clear()

    async def close(self) -> None:
        return None
