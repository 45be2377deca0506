"""Every exchange, queue, routing key and Redis key bargein uses, in one place.

Routing keys are ``<session>.<direction>.<kind>.<audience>.<EventName>``: ``in`` is toward the
agent (the caller's speech, text, delivery reports), ``out`` is from the agent (its responses, turn
control); ``kind`` is ``control`` for the events that must overtake data (``Event.control``) and
``data`` for the rest, so a consumer can keep the two in queues of their own (the client edge does);
``audience`` is ``edge`` for what the client edge hears (all of ``out``, and :data:`EDGE_HEARS_IN`)
and ``agent`` for the rest, so an edge hears a session with one binding per queue. A tier's
per-session mailbox binds ``<session>.<direction>.#`` and sees both, control first by priority.
Redis keys are hash-tagged by session (``{<session>}``) so that every key of one session lands in
one Redis Cluster slot and the Lua check-and-set scripts can touch them together.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Literal

from bargein.agent.events import event_type, is_control
from bargein.errors import UnknownEventType

Direction = Literal["in", "out"]
Tier = Literal["reasoning", "edge", "speech"]
Kind = Literal["control", "data"]

IN: Direction = "in"
OUT: Direction = "out"

CONTROL: Kind = "control"
DATA: Kind = "data"

EDGE_AUDIENCE = "edge"  # the routing key's audience word: the client edge hears it
AGENT_AUDIENCE = "agent"  # ... only the agent's tiers do

TIER_REASONING: Tier = "reasoning"
TIER_EDGE: Tier = "edge"
TIER_SPEECH: Tier = "speech"

# --- RabbitMQ -------------------------------------------------------------------------------------
EVENTS_EXCHANGE = "bargein.events"  # topic: every session event
AUDIO_EXCHANGE = "bargein.audio"  # topic, transient: client audio frames
DEAD_EXCHANGE = "bargein.dead"  # fanout: messages no consumer could accept, with a reason header
DEAD_QUEUE = "bargein.dead"
DEAD_REASON_HEADER = "x-bargein-reason"

PRIORITY_DATA = 0
PRIORITY_CONTROL = 1  # mailboxes are declared with x-max-priority = PRIORITY_CONTROL


def lane_exchange(lane: str) -> str:
    """The exchange an event lane (``Event.lane``) is published to."""
    return AUDIO_EXCHANGE if lane == "audio" else EVENTS_EXCHANGE


def tier_exchange(tier: Tier) -> str:
    """The exchange a tier's mailboxes are bound to: the speech tier hears audio, the others events."""
    return AUDIO_EXCHANGE if tier == TIER_SPEECH else EVENTS_EXCHANGE


def kind_of(event_name: str) -> Kind:
    """``control`` for events that overtake data; ``data`` for the rest, and for names no event
    type has (a malformed message still needs a key, to be dead-lettered by its consumer)."""
    try:
        return _kind_of_known(event_name)
    except UnknownEventType:
        return DATA


@functools.lru_cache(maxsize=1024)  # asked for every message; only known names are remembered
def _kind_of_known(event_name: str) -> Kind:
    return CONTROL if is_control(event_type(event_name)) else DATA


def routing_key(session: str, direction: Direction, event_name: str) -> str:
    audience = EDGE_AUDIENCE if direction == OUT or event_name in _EDGE_HEARS_IN else AGENT_AUDIENCE
    return f"{session}.{direction}.{kind_of(event_name)}.{audience}.{event_name}"


def mailbox_binding(session: str, direction: Direction) -> str:
    return f"{session}.{direction}.#"


def mailbox_queue(tier: Tier, session: str) -> str:
    return f"bargein.mailbox.{tier}.{session}"


def edge_queue(owner: str, kind: Kind) -> str:
    """Two per broadcast process, one for data (the chunks: many, consumed in bulk) and one for
    control (interrupts: few, never stuck behind data); they hear the sessions that process has
    clients for."""
    return f"bargein.edge.{owner}.{kind}"


VOICE_OPTION = "voice"  # the session option naming the agent's voice (POST /v1/sessions ``voice``)

# the caller-side events the client edge shows clients or acts on (speech start/stop, what the
# caller said, a hang-up from another edge process)
EDGE_HEARS_IN = (
    "UserStartedSpeaking",
    "UserStoppedSpeaking",
    "FalseInterruption",
    "UserTranscriptionReceived",
    "UserBackchannel",
    "UserSpeechOnset",
    "UserOnsetDismissed",
    "EndCall",
)


_EDGE_HEARS_IN = frozenset(EDGE_HEARS_IN)


def edge_bindings(session: str) -> list[tuple[Kind, str]]:
    """(kind, key): what the client edge hears of a session, each in the edge queue of its kind:
    what the routing key's audience says the edge hears (all of its output, and
    :data:`EDGE_HEARS_IN`). Two bindings a session: each costs the broker memory and a round trip
    as the caller comes and goes (there were ten, one for each event the edge hears of ``in``)."""
    return [(kind, f"{session}.*.{kind}.{EDGE_AUDIENCE}.#") for kind in (DATA, CONTROL)]


def mailbox_extra_bindings(tier: Tier, session: str) -> list[tuple[str, str]]:
    """(exchange, key) bindings a tier's mailbox has besides its own lane: the speech tier's audio
    mailbox also hears the hang-up, so its owner lets the session go."""
    if tier == TIER_SPEECH:
        return [(EVENTS_EXCHANGE, routing_key(session, IN, "EndCall"))]
    return []


# --- partitioned mailboxes (BARGEIN_MAILBOXES=partitioned): a fixed set of queues per tier ----------
# Instead of a mailbox per session, a tier has ``BARGEIN_PARTITIONS`` partitions, each two quorum
# queues (control and data: quorum queues have no priorities on RabbitMQ 3.10), and a session's
# messages go to the partition its id hashes to. What a session publishes ``in`` carries its
# partition in a header; ``bargein.events`` passes ``in`` messages to one headers exchange per kind,
# which routes them by that header. A worker owns whole partitions (hosting/partitions.py).
#
# The speech tier's partitions hear what its per-session mailboxes heard: the caller's audio (one
# classic queue per partition, bounded and dropping its oldest frames, as audio is worthless late)
# and the hang-up. The reasoning tier's hear every ``in`` event, control and data apart.
PARTITIONED_TIERS: tuple[Tier, ...] = (TIER_SPEECH, TIER_REASONING)
PartitionKind = Literal["control", "data", "audio"]
AUDIO: PartitionKind = "audio"
# (no "x-" prefix: RabbitMQ's headers exchange leaves such headers out of its match)
PARTITION_HEADER = "bargein-partition"
START_HEADER = "bargein-start"  # a session start, sent down its partition (body: SessionInfo)


def partition_of(session: str, partitions: int) -> int:
    """The partition ``session`` is hashed to: the same in every process (Python's hash() is not)."""
    return int.from_bytes(hashlib.blake2b(session.encode(), digest_size=4).digest(), "big") % partitions


def partition_tag(partition: int) -> str:
    """The partition header's value (a string: RabbitMQ's headers exchange compares a number's
    type as well as its value, and a client library may encode the same int several ways)."""
    return f"p{partition}"


def partition_headers(session: str, partitions: int) -> dict[str, str]:
    """The headers that route a message of ``session``'s ``in`` to its partition."""
    return {PARTITION_HEADER: partition_tag(partition_of(session, partitions))}


def partition_kinds(tier: Tier) -> tuple[PartitionKind, ...]:
    """The queues each of ``tier``'s partitions is; the first takes the tier's session starts."""
    return (AUDIO,) if tier == TIER_SPEECH else (DATA, CONTROL)


def partitions_exchange(tier: Tier, kind: PartitionKind) -> str:
    """Headers exchange: ``tier``'s messages of ``kind``, by partition."""
    return f"bargein.partitions.{tier}.{kind}"


def partition_sources(tier: Tier, kind: PartitionKind) -> list[tuple[str, str]]:
    """(exchange, key): what reaches ``tier``'s partitions of ``kind``, every session's (their
    headers exchange then sends each to its partition): as a per-session mailbox's bindings."""
    if kind == AUDIO:
        return [(AUDIO_EXCHANGE, f"*.{IN}.#"), (EVENTS_EXCHANGE, routing_key("*", IN, "EndCall"))]
    return [(EVENTS_EXCHANGE, f"*.{IN}.{kind}.#")]


def partition_queue(tier: Tier, partition: int, kind: PartitionKind) -> str:
    return f"bargein.partition.{tier}.{partition}.{kind}"


def partition_lease(partition: int) -> str:
    """The name a partition's lease is held under in the state store, beside the sessions' (a
    partition is owned as a session is: a lease with an epoch)."""
    return f"partition-{partition}"


def session_work_queue(tier: Tier) -> str:
    """Session starts waiting for a worker of ``tier`` with room (competing consumers)."""
    return f"bargein.sessions.{tier}"


# --- Redis ----------------------------------------------------------------------------------------
KEY_PREFIX = "bargein"


def lease_key(tier: Tier, session: str) -> str:
    return f"{KEY_PREFIX}:{{{session}}}:lease:{tier}"


def epoch_key(tier: Tier, session: str) -> str:
    return f"{KEY_PREFIX}:{{{session}}}:epoch:{tier}"


def state_key(tier: Tier, session: str) -> str:
    return f"{KEY_PREFIX}:{{{session}}}:state:{tier}"


def state_log_key(tier: Tier, session: str) -> str:
    """Hash of the checkpoint's log (runtime/journal.py): ``<list>:<position>`` → one packed item."""
    return f"{KEY_PREFIX}:{{{session}}}:log:{tier}"


def session_directory_key(tier: Tier) -> str:
    """Hash session -> SessionInfo of every live session of ``tier`` (one key, deliberately global:
    it is how workers find sessions whose owner died)."""
    return f"{KEY_PREFIX}:sessions:{tier}"


# --- which worker processes are alive, and what each owns (fast failover) ---------------------------


def worker_alive_key(tier: Tier, owner: str) -> str:
    """Set by a worker's heartbeat with a short TTL: gone within that TTL of the process dying."""
    return f"{KEY_PREFIX}:alive:{tier}:{owner}"


def workers_key(tier: Tier) -> str:
    """Hash owner -> start time of the workers of ``tier`` (so others notice one whose heartbeat
    stopped)."""
    return f"{KEY_PREFIX}:workers:{tier}"


def partition_count_key(tier: Tier) -> str:
    """How many partitions ``tier`` runs with: the first worker sets it, and one started with
    another count refuses to start (every process must hash sessions alike)."""
    return f"{KEY_PREFIX}:partitions:{tier}"


def owned_key(tier: Tier, owner: str) -> str:
    """Set of the sessions a worker owns: what the others take over when it dies."""
    return f"{KEY_PREFIX}:owned:{tier}:{owner}"


# --- whether a session's caller is still there (sessions that outlive their calls end) -------------


def caller_deadlines_key() -> str:
    """Sorted set session -> the wall-clock time it ends unless a caller is seen before (one key,
    global like the directory: any edge ends a session whose caller left through another)."""
    return f"{KEY_PREFIX}:callers"


def call_key(carrier: str, call_id: str) -> str:
    """A carrier's call id -> the session that answers it (its status callbacks name only the call)."""
    return f"{KEY_PREFIX}:call:{carrier}:{call_id}"
