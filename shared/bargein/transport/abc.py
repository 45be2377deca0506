"""The seams between the runtime and the outside world, and what a host runs per session.

Everything above these interfaces (routes, nodes, the session runtime, the session host, the test
harness) is shared by the in-process runtime (:mod:`bargein.transport.memory`) and the distributed
one (:mod:`~bargein.transport.amqp` and :mod:`~bargein.transport.redis_store`). A transport moves
envelopes; a state store keeps what must outlive a process and decides, through leases with fencing
epochs, which process owns a session. ``tests/contract`` holds both implementations of each to the
same behaviour.
"""

from __future__ import annotations

import enum
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Final

from bargein.agent.events import Event
from bargein.errors import EnvelopeError
from bargein.wire.envelope import Envelope
from bargein.wire.names import PARTITIONED_TIERS, Direction, Tier
from bargein.wire.session_info import SessionInfo

log = logging.getLogger("bargein.transport")

Handler = Callable[[Envelope, Event], Awaitable[None]]
StartHandler = Callable[[bytes], Awaitable[bool]]

# A partition's message its handler could not take yet (NotOwner: the session's previous owner
# still holds it) is tried again after this long, while the partition waits behind it.
PUT_BACK_AFTER_S: Final = 0.1


async def offer_start(
    body: bytes, queue: str, on_start: StartHandler, dead_letter: Callable[[EnvelopeError], Awaitable[None]]
) -> bool | None:
    """Offer a session start found in a partition to ``on_start``: whether it was taken, or None
    when it failed (Redis away, say: it is tried again, as one not taken is). One that cannot be
    read goes to ``dead_letter`` and counts as taken (nothing would ever take it)."""
    try:
        SessionInfo.decode(body)
        return await on_start(body)
    except EnvelopeError as exc:
        await dead_letter(exc)
        return True
    except Exception as exc:
        log.warning("a session start in %s failed (%s: %s); trying it again", queue, type(exc).__name__, exc)
        return None


# A speech partition holds at most this many speech mailboxes' worth of audio frames
# (BARGEIN_AUDIO_MAILBOX_FRAMES each), the oldest dropped first: its sessions' audio comes in turn.
AUDIO_PARTITION_MAILBOXES: Final = 16


class Subscription(ABC):
    """A consumer attached to a mailbox. Cancelling stops delivery; the mailbox itself stays, so a
    later owner (possibly another process) consumes whatever arrived meanwhile."""

    @abstractmethod
    async def cancel(self) -> None: ...

    @property
    @abstractmethod
    def alive(self) -> bool:
        """Whether it still consumes: False once cancelled, once the broker cancelled it (its queue
        crashed or vanished), once the connection was lost, or once its handler said
        :class:`~bargein.errors.NotOwner`. Its owner then subscribes again, or lets the session go."""


class Subscriptions(Subscription):
    """Several consumers as one (a partition's control and data queues)."""

    def __init__(self, members: list[Subscription]) -> None:
        self._members = members

    @property
    def alive(self) -> bool:
        return all(member.alive for member in self._members)

    async def cancel(self) -> None:
        for member in self._members:
            await member.cancel()


class EdgeQueue(Subscription):
    @abstractmethod
    async def add_session(self, session: str) -> None: ...

    @abstractmethod
    async def remove_session(self, session: str) -> None: ...

    @abstractmethod
    async def backlog(self) -> int:
        """How many data messages wait for this edge process in the broker (not counting the few it
        has taken ahead, up to its prefetch): how far behind it is."""


class Transport(ABC):
    @abstractmethod
    async def publish(self, envelope: Envelope, direction: Direction) -> None:
        """Route ``envelope`` to every mailbox bound to its session and direction. Control events
        (``Event.control``) overtake data waiting in the broker; one that no queue would receive
        raises :class:`~bargein.errors.UnroutableError` (data is allowed to go nowhere). While a
        queue it goes to is full, or the broker is away, it waits (up to a bound set by the
        implementation), then raises :class:`~bargein.errors.BrokerUnavailable`."""

    @abstractmethod
    async def open_mailbox(
        self, session: str, tier: Tier, direction: Direction, handler: Handler
    ) -> Subscription:
        """Declare ``tier``'s mailbox for ``session`` (idempotently) and consume it in order.

        ``handler`` is awaited for one message at a time; a message is acknowledged when it returns
        (a handler that raises costs that message only: it is dead-lettered; one that raises
        :class:`~bargein.errors.NotOwner` puts it back in the mailbox and stops the consumer).
        Messages that fail to decode, or belong to another session, never reach the handler: they
        are dead-lettered with a reason and counted. The speech tier's mailbox keeps only its newest
        audio frames.
        """

    @abstractmethod
    async def open_edge_queue(self, owner: str, handler: Handler) -> EdgeQueue:
        """Queues of the process ``owner``'s own (gone when the process is), consumed in order, that
        hear the sessions added to them (:func:`bargein.wire.names.edge_bindings`); control
        overtakes the data still waiting. Every broadcast process has them, so each gets the whole
        output of the sessions it has clients for. They are bounded: a publisher waits while they
        are full (backpressure)."""

    @abstractmethod
    async def declare_mailbox(self, session: str, tier: Tier, direction: Direction) -> None:
        """Make sure ``tier``'s mailbox for ``session`` exists, so events published before its owner
        starts consuming wait there instead of being dropped."""

    @abstractmethod
    async def delete_mailbox(self, session: str, tier: Tier) -> None:
        """Remove a finished session's mailbox."""

    @abstractmethod
    async def mailbox_exists(self, session: str, tier: Tier) -> bool:
        """Whether ``tier``'s mailbox for ``session`` is there: a session whose side ended on purpose
        has had it deleted; one whose records Redis lost still has it."""

    # --- partitioned mailboxes (BARGEIN_MAILBOXES=partitioned) --------------------------------------

    partition_count: int = 0  # set by implementations that run partitioned tiers

    def partitions(self, tier: Tier) -> int:
        """How many partitions ``tier``'s mailboxes are: 0 when each session has its own. Then
        :meth:`declare_mailbox` and :meth:`delete_mailbox` do nothing for the tier, and
        :meth:`mailbox_exists` says yes: a partition outlives its sessions."""
        return self.partition_count if tier in PARTITIONED_TIERS else 0

    @abstractmethod
    async def open_partition(
        self, tier: Tier, partition: int, handler: Handler, on_start: StartHandler
    ) -> Subscription:
        """Consume one partition of ``tier``: what its sessions are sent ``in``, control overtaking
        data, each kind in order, and the starts of its sessions (:meth:`publish_session_start`),
        which go to ``on_start``. ``handler`` and ``on_start`` are awaited for one message of each
        kind at a time. A message the handler says :class:`~bargein.errors.NotOwner` to (or a
        start ``on_start`` returns False for, or fails on) is tried again after
        :data:`PUT_BACK_AFTER_S`, the partition's other messages of its kind waiting behind it, for
        as long as the consumer lasts; cancelled, it puts the message back for the next one (on
        RabbitMQ 3.10 behind the rest of the queue: a quorum queue returns it to its tail there). The
        rest is as :meth:`open_mailbox`. A partition's queues take one consumer at a time: a second one
        waits until the first is gone."""

    # --- session starts: a shared work queue per tier (competing consumers) ----------------------

    @abstractmethod
    async def publish_session_start(self, tier: Tier, info: bytes) -> None:
        """Offer a new session to ``tier``'s workers; for a partitioned tier, to the owner of its
        partition (down the partition, ahead of anything sent to the session after it)."""

    @abstractmethod
    async def consume_session_starts(self, tier: Tier, handler: StartHandler) -> Subscription:
        """Deliver session starts one at a time. ``handler`` returns False when this process has no
        room: the start goes back to the queue for another worker."""

    @abstractmethod
    async def close(self) -> None: ...


class Renewal(enum.IntEnum):
    """What renewing a lease found. Falsy only when the lease is lost."""

    LOST = 0  # another process holds it, or a later epoch was handed out: stop working the session
    RENEWED = 1
    RESTORED = 2  # it was gone (Redis lost it, or it lapsed) and nobody took it: it is ours again,
    #               and so is the epoch; what else Redis lost must be written again


class Heartbeat(ABC):
    """A worker's liveness, kept up until :meth:`stop` (or until the process dies or is paused).

    ``alive_until`` (``time.monotonic()``) is how long the others surely still see this worker as
    alive: past it (the process was paused, or Redis was unreachable), they may have taken its
    sessions, and it must not act on them before it has checked its leases. ``alive_since`` is when
    the others last began to see it alive without a break: a lease confirmed before that may have
    been taken over during the break, though the heartbeat beats again now."""

    alive_until: float
    alive_since: float

    @abstractmethod
    def stop(self) -> None: ...


# --- the checkpoint's log (bargein.runtime.journal): long lists, written by what changed ---------


@dataclass(frozen=True)
class ListChange:
    """List ``path``: its first ``keep`` items stay, ``items`` (packed) come after them, and the
    positions from ``keep`` to ``was`` that ``items`` does not cover are gone."""

    path: int
    keep: int
    was: int
    items: tuple[bytes, ...]


@dataclass(frozen=True)
class LogChange:
    """What one checkpoint changes in the log: one entry per list that changed."""

    lists: tuple[ListChange, ...] = ()

    def removed(self) -> list[bytes]:
        """The log's names this change deletes: each list's positions past its new items, up to
        where the list ended before."""
        return [
            log_field(change.path, position)
            for change in self.lists
            for position in range(change.keep + len(change.items), change.was)
        ]

    def written(self) -> list[tuple[bytes, bytes]]:
        """The log's names this change sets, each with its packed item."""
        return [
            (log_field(change.path, position), item)
            for change in self.lists
            for position, item in enumerate(change.items, change.keep)
        ]

    @property
    def size(self) -> int:
        """The bytes of the items it writes (what a checkpoint costs beyond its record)."""
        return sum(len(item) for change in self.lists for item in change.items)


NO_LOG_CHANGE: Final = LogChange()  # a checkpoint with nothing for the log


def log_field(path: int, position: int) -> bytes:
    """The log's name for item ``position`` of list ``path`` (what the stores key it by)."""
    return f"{path}:{position}".encode()


def parse_field(name: bytes) -> tuple[int, int]:
    path, _, position = name.decode().partition(":")
    return int(path), int(position)


class StateStore(ABC):
    """Leases with fencing epochs, and the session's checkpoint.

    ``acquire_lease`` hands out a strictly increasing epoch per (tier, session); ``save_state``
    accepts a write only from the current epoch, so a worker that lost its lease (paused, partitioned)
    cannot overwrite the state of the worker that adopted the session.
    """

    @abstractmethod
    async def acquire_lease(
        self, tier: Tier, session: str, owner: str, ttl_ms: int, *, replacing: str | None = None
    ) -> int | None:
        """Take the lease if it is free or lapsed (or, with ``replacing``, held by that worker, which
        is dead); return the new epoch, or None if another holds it."""

    @abstractmethod
    async def renew_lease(self, tier: Tier, session: str, owner: str, epoch: int, ttl_ms: int) -> Renewal:
        """Extend a lease we hold, or take it again (with its epoch) if it is gone and no later
        epoch was handed out since; LOST means another process may own it: stop working it."""

    async def renew_leases(
        self, tier: Tier, owner: str, leases: Mapping[str, int], ttl_ms: int
    ) -> dict[str, Renewal]:
        """:meth:`renew_lease` for every ``session -> epoch`` of ``leases`` (one round trip where
        the store can: a process with a thousand sessions renews them all at once)."""
        return {s: await self.renew_lease(tier, s, owner, epoch, ttl_ms) for s, epoch in leases.items()}

    @abstractmethod
    async def release_lease(self, tier: Tier, session: str, owner: str, epoch: int) -> None: ...

    @abstractmethod
    async def save_state(
        self, tier: Tier, session: str, epoch: int, data: bytes, ttl_ms: int, log: LogChange = NO_LOG_CHANGE
    ) -> None:
        """Store the checkpoint record ``data`` and apply ``log`` to its log, both or neither;
        :class:`~bargein.errors.StaleEpochError` if ``epoch`` is not current."""

    @abstractmethod
    async def load_state(self, tier: Tier, session: str) -> bytes | None: ...

    @abstractmethod
    async def load_log(self, tier: Tier, session: str) -> dict[bytes, bytes]:
        """The checkpoint's log: item name (:func:`log_field`) → packed item."""

    @abstractmethod
    async def current_epoch(self, tier: Tier, session: str) -> int:
        """The latest epoch handed out for ``session`` (0 if none): how the edge tells a real new
        owner from a message that merely claims a higher epoch."""

    @abstractmethod
    async def delete_state(self, tier: Tier, session: str) -> None:
        """Forget a finished session's checkpoint and epoch counter."""

    # --- the directory of live sessions, which is how orphans are found ---------------------------

    @abstractmethod
    async def register_session(self, tier: Tier, session: str, info: bytes) -> None:
        """Record that ``session`` exists for ``tier`` (``info``: its encoded SessionInfo)."""

    @abstractmethod
    async def unregister_session(self, tier: Tier, session: str) -> None: ...

    @abstractmethod
    async def session_info(self, tier: Tier, session: str) -> bytes | None:
        """The registered SessionInfo of a live session, or None (how the edge knows a session)."""

    @abstractmethod
    async def orphaned_sessions(
        self, tier: Tier, limit: int = 100, wanted: Callable[[str], bool] | None = None
    ) -> list[tuple[str, bytes]]:
        """Registered sessions of ``tier`` whose lease is not held by anyone: candidates for adoption.
        Only those ``wanted`` (a worker's own partitions) count toward ``limit``: filtered after,
        a worker could be handed ``limit`` orphans of other partitions and never see its own."""

    @abstractmethod
    async def absent_sessions(self, tier: Tier, sessions: Collection[str]) -> list[str]:
        """Those of ``sessions`` the directory of ``tier`` does not hold, in one round trip."""

    @abstractmethod
    async def restore_sessions(
        self, tier: Tier, records: Mapping[str, bytes], epochs: Mapping[str, int] | None = None
    ) -> list[str]:
        """Register each session of ``records`` (session -> encoded SessionInfo) that the directory
        does not hold, never overwriting one it does; the sessions written. How an edge gives
        back a session whose records Redis lost together with its owner. ``epochs``: the highest
        owner epoch the edge has seen of each; a written session's next owner gets a later one
        (Redis lost the counter too, and the edge's fence drops what an earlier epoch says)."""

    # --- worker liveness: a dead worker's sessions are taken over without waiting for each lease ---

    @abstractmethod
    def keep_alive(self, tier: Tier, owner: str, ttl_ms: int) -> Heartbeat:
        """Say, until stopped, that ``owner`` is alive; it reads as dead within ``ttl_ms`` of
        stopping (or of the process dying or being paused). It must not depend on the event loop
        being free: a busy worker is alive."""

    @abstractmethod
    async def dead_workers(self, tier: Tier) -> list[str]:
        """Workers of ``tier`` that started a heartbeat and whose heartbeat has lapsed."""

    @abstractmethod
    async def live_workers(self, tier: Tier) -> list[str]:
        """Workers of ``tier`` whose heartbeat holds: those that share its partitions."""

    @abstractmethod
    async def claim_partition_count(self, tier: Tier, count: int) -> int:
        """Record that ``tier`` runs with ``count`` partitions, unless a count is recorded already;
        the count recorded. Every process must hash sessions to the same partitions."""

    @abstractmethod
    async def note_owned(self, tier: Tier, owner: str, session: str, owned: bool) -> None:
        """Record that ``owner`` took (or let go of) ``session``."""

    @abstractmethod
    async def owned_sessions(self, tier: Tier, owner: str) -> list[str]:
        """The sessions ``owner`` recorded as its own."""

    @abstractmethod
    async def forget_worker(self, tier: Tier, owner: str) -> None:
        """``owner`` is gone for good (drained, or its sessions taken over): drop its records."""

    # --- whether a session's caller is still there: a call that ends without a hang-up ends too ---

    @abstractmethod
    async def expect_callers(self, deadlines: Mapping[str, float]) -> None:
        """Each session of ``deadlines`` (session -> wall-clock time) is over at that time unless a
        caller is seen before: :meth:`callers_gone` then hands it out. A deadline only ever moves
        later (an edge that still has the caller outbids one whose caller left)."""

    @abstractmethod
    async def callers_gone(self, now: float, limit: int = 100) -> list[str]:
        """Take the sessions whose deadline is ``now`` or earlier, at most ``limit``: each goes to
        exactly one caller of this method, which ends it."""

    @abstractmethod
    async def caller_deadline(self, session: str) -> float | None:
        """When ``session`` is over unless a caller is seen (None: no edge tracks its callers)."""

    @abstractmethod
    async def forget_callers(self, session: str) -> None:
        """The session ended: nothing more to wait for."""

    @abstractmethod
    async def note_call(self, carrier: str, call_id: str, session: str, ttl_ms: int) -> None:
        """Phone call ``call_id`` of ``carrier`` is answered by ``session`` (for ``ttl_ms``)."""

    @abstractmethod
    async def session_of_call(self, carrier: str, call_id: str) -> str | None: ...

    @abstractmethod
    async def close(self) -> None: ...


class SessionProcessor(ABC):
    """What a tier runs for each session it owns (the reasoning tier's is the agent's
    :class:`~bargein.runtime.session.SessionRuntime`; the speech tier's is its VAD state machine). The
    :class:`~bargein.hosting.host.SessionHost` holds the lease and feeds the mailbox to it."""

    epoch: int
    fenced: bool  # set when the lease was lost: write nothing more
    last_activity: float  # time.monotonic() of the last message handled: the host ends quiet sessions
    # Set by the host: the processor handles a message only before both (else NotOwner), so a
    # process thawed after a pause acts on nothing another process may own by now.
    lease_deadline: float  # time.monotonic() until which the lease surely holds
    lease_confirmed_at: float  # time.monotonic() when the lease was last asked for, and held
    liveness: Heartbeat | None  # this worker's heartbeat

    def surely_owned(self, now: float) -> bool:
        """Whether to act on a message now. Not once the lease is lost or may have run out; nor
        while this worker's heartbeat has had a break since the lease was last confirmed: a
        process paused past its liveness TTL is taken over, and the heartbeat's thread beats again
        the moment it thaws, before the event loop has renewed a lease and heard it lost."""
        if self.fenced or now >= self.lease_deadline:
            return False
        beat = self.liveness
        return beat is None or (now < beat.alive_until and beat.alive_since <= self.lease_confirmed_at)

    @abstractmethod
    async def start(self) -> None:
        """Restore the checkpoint (if any) and get ready for the mailbox."""

    @abstractmethod
    async def handle(self, envelope: Envelope, event: Event) -> None:
        """One message from the mailbox (the transport calls it directly); it is acknowledged when
        this returns. Implementations note ``last_activity``."""

    @abstractmethod
    async def close(self, *, checkpoint: bool = True) -> None: ...

    @abstractmethod
    async def checkpoint(self) -> None:
        """Write what must outlive this process to the state store (under the owner's epoch)."""

    async def write_back(self) -> None:
        """The state store lost this session's records (Redis restarted without persistence):
        write them again, all of them, not only what changed since the last checkpoint."""
        await self.checkpoint()

    @abstractmethod
    def hold(self) -> None:
        """Start no new turns (the process is draining): what runs may finish, the rest waits to be
        handed over with the checkpoint. Interrupts keep working."""

    @property
    @abstractmethod
    def active_turns(self) -> int:
        """Work in progress, for status lines and drains."""
