"""Partitioned mailboxes, held by MemoryTransport and AmqpTransport alike.

A partitioned tier's sessions share a fixed set of partitions: a partition's consumer gets what its
sessions are sent ``in`` (and nothing of the other partitions'), each kind in order, control
overtaking the data still waiting; a session's start comes down its partition ahead of what it is
sent; what the consumer cannot take yet comes again and the consumer goes on; a partition has one
consumer at a time; and the tier's sessions have no mailbox of their own to declare or delete.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bargein import Event, SessionInfo, UserStartedSpeaking, UserTranscriptionReceived
from bargein.agent.events import AudioFrame, EndCall
from bargein.errors import NotOwner
from bargein.transport.abc import AUDIO_PARTITION_MAILBOXES
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN, TIER_REASONING, TIER_SPEECH, partition_of

from .harness import AUDIO_FRAMES, Bus, until

PARTITIONS = 4
Session = Callable[[str], str]


def in_partition(session: Session, partition: int, name: str) -> str:
    """A session id of this test that hashes to ``partition``."""
    return next(
        sid for i in range(1000) if partition_of(sid := session(f"{name}{i}"), PARTITIONS) == partition
    )


def text(i: int | str) -> UserTranscriptionReceived:
    return UserTranscriptionReceived(content=str(i))


def what(event: Event) -> str:
    return str(getattr(event, "content", type(event).__name__))


async def never_starts(info: bytes) -> bool:
    raise AssertionError("no session start was expected")


async def test_a_partition_gets_its_sessions_in_events_control_overtaking_waiting_data(
    bus: Bus, session: Session
) -> None:
    mine, also_mine, other = (
        in_partition(session, 1, "a"),
        in_partition(session, 1, "b"),
        in_partition(session, 2, "c"),
    )
    consumer, publisher = (
        await bus.transport(partitions=PARTITIONS),
        await bus.transport(partitions=PARTITIONS),
    )
    release = asyncio.Event()
    seen: list[tuple[str, str]] = []

    async def slow(envelope: Envelope, event: Event) -> None:
        if not isinstance(event, UserStartedSpeaking):
            await release.wait()
        seen.append((envelope.session, what(event)))

    await consumer.open_partition(TIER_REASONING, 1, slow, never_starts)
    for i in range(10):
        await publisher.publish(Envelope.wrap(mine if i % 2 else also_mine, text(i)), IN)
        await publisher.publish(Envelope.wrap(other, text(f"other {i}")), IN)
    await asyncio.sleep(0.3)  # the first is being handled, the rest wait in the broker
    await publisher.publish(Envelope.wrap(mine, UserStartedSpeaking()), IN)
    await until(lambda: len(seen) == 1)
    assert seen == [(mine, "UserStartedSpeaking")]  # past the data waiting
    release.set()
    await until(lambda: len(seen) == 11)
    await asyncio.sleep(0.2)
    assert [content for _, content in seen[1:]] == [
        str(i) for i in range(10)
    ]  # in order, none of the other's
    assert all(sid in (mine, also_mine) for sid, _ in seen)


async def test_a_sessions_start_comes_down_its_partition_ahead_of_what_it_is_sent(
    bus: Bus, session: Session
) -> None:
    s = in_partition(session, 3, "s")
    publisher = await bus.transport(partitions=PARTITIONS)
    await publisher.publish_session_start(TIER_REASONING, SessionInfo(s).encode())
    await publisher.publish(Envelope.wrap(s, text("hello")), IN)
    consumer = await bus.transport(partitions=PARTITIONS)
    order: list[str] = []

    async def start(info: bytes) -> bool:
        order.append(f"start {SessionInfo.decode(info).session_id}")
        return True

    async def handle(envelope: Envelope, event: Event) -> None:
        order.append(what(event))

    await consumer.open_partition(TIER_REASONING, 3, handle, start)
    await until(lambda: len(order) == 2)
    assert order == [f"start {s}", "hello"]


async def test_a_start_its_worker_failed_to_take_is_offered_again_before_what_follows(
    bus: Bus, session: Session
) -> None:
    """A start that fails (Redis away as the worker records the session) is not lost, nor
    overtaken by the session's messages."""
    s = in_partition(session, 0, "s")
    publisher, consumer = (
        await bus.transport(partitions=PARTITIONS),
        await bus.transport(partitions=PARTITIONS),
    )
    order: list[str] = []

    async def flaky(info: bytes) -> bool:
        order.append("offered")
        if order.count("offered") == 1:
            raise ConnectionError("Redis is away")
        return True

    async def handle(envelope: Envelope, event: Event) -> None:
        order.append(what(event))

    await publisher.publish_session_start(TIER_REASONING, SessionInfo(s).encode())
    await publisher.publish(Envelope.wrap(s, text("hello")), IN)
    await consumer.open_partition(TIER_REASONING, 0, handle, flaky)
    await until(lambda: len(order) == 3)
    assert order == ["offered", "offered", "hello"]


async def test_what_the_consumer_cannot_take_yet_comes_again_and_the_consumer_goes_on(
    bus: Bus, session: Session
) -> None:
    s = in_partition(session, 0, "s")
    consumer, publisher = (
        await bus.transport(partitions=PARTITIONS),
        await bus.transport(partitions=PARTITIONS),
    )
    refusals, offers = [1], []
    seen: list[str] = []

    async def handle(envelope: Envelope, event: Event) -> None:
        if refusals[0]:  # the session's previous owner still holds it, this once
            refusals[0] -= 1
            raise NotOwner("not yet")
        seen.append(what(event))

    async def start(info: bytes) -> bool:
        offers.append(info)
        return len(offers) > 1  # no room the first time

    subscription = await consumer.open_partition(TIER_REASONING, 0, handle, start)
    await publisher.publish_session_start(TIER_REASONING, SessionInfo(s).encode())
    for i in range(3):
        await publisher.publish(Envelope.wrap(s, text(i)), IN)
    await until(lambda: len(seen) == 3)
    assert seen == ["0", "1", "2"]  # the refused one again, first, then the rest
    assert len(offers) == 2
    assert subscription.alive


async def test_a_partition_has_one_consumer_at_a_time(bus: Bus, session: Session) -> None:
    s = in_partition(session, 2, "s")
    first_t, second_t, publisher = (
        await bus.transport(partitions=PARTITIONS),
        await bus.transport(partitions=PARTITIONS),
        await bus.transport(partitions=PARTITIONS),
    )
    first: list[str] = []
    second: list[str] = []

    def recorder(seen: list[str]) -> Callable[[Envelope, Event], object]:
        async def handle(envelope: Envelope, event: Event) -> None:
            seen.append(what(event))

        return handle

    one = await first_t.open_partition(TIER_REASONING, 2, recorder(first), never_starts)  # type: ignore[arg-type]
    await second_t.open_partition(TIER_REASONING, 2, recorder(second), never_starts)  # type: ignore[arg-type]
    for i in range(3):
        await publisher.publish(Envelope.wrap(s, text(i)), IN)
    await until(lambda: len(first) == 3)
    await one.cancel()
    for i in range(3, 6):
        await publisher.publish(Envelope.wrap(s, text(i)), IN)
    await until(lambda: len(second) == 3)
    assert (first, second) == (["0", "1", "2"], ["3", "4", "5"])


async def test_a_partitioned_tier_has_no_mailbox_per_session(bus: Bus, session: Session) -> None:
    s = session("s")
    transport = await bus.transport(partitions=PARTITIONS)
    await transport.declare_mailbox(s, TIER_REASONING, IN)
    await transport.delete_mailbox(s, TIER_REASONING)
    assert await transport.mailbox_exists(s, TIER_REASONING)  # its partition: always there
    assert transport.partitions(TIER_REASONING) == PARTITIONS
    assert not (await bus.transport()).partitions(TIER_REASONING)


# --- the speech tier: the caller's audio, in partitions of its own ---------------------------------


def frame(i: int) -> AudioFrame:
    return AudioFrame(data=i.to_bytes(2, "little") * 160)


def frame_number(event: Event) -> int:
    assert isinstance(event, AudioFrame)
    return int.from_bytes(event.data[:2], "little")


async def test_a_speech_partition_hears_its_sessions_audio_and_hang_up_and_their_starts(
    bus: Bus, session: Session
) -> None:
    """What a speech mailbox heard: the caller's audio and the hang-up; none of other partitions'."""
    mine, other = in_partition(session, 1, "a"), in_partition(session, 2, "b")
    consumer, publisher = (
        await bus.transport(partitions=PARTITIONS),
        await bus.transport(partitions=PARTITIONS),
    )
    seen: list[tuple[str, str]] = []
    started: list[str] = []

    async def record(envelope: Envelope, event: Event) -> None:
        seen.append(
            (
                envelope.session,
                f"frame {frame_number(event)}" if isinstance(event, AudioFrame) else type(event).__name__,
            )
        )

    async def start(info: bytes) -> bool:
        started.append(SessionInfo.decode(info).session_id)
        return True

    await consumer.open_partition(TIER_SPEECH, 1, record, start)
    await publisher.publish_session_start(TIER_SPEECH, SessionInfo(mine).encode())
    await publisher.publish_session_start(TIER_SPEECH, SessionInfo(other).encode())
    for i in range(3):
        await publisher.publish(Envelope.wrap(mine, frame(i), seq=i, source="user"), IN)
        await publisher.publish(Envelope.wrap(other, frame(i), seq=i, source="user"), IN)
    await publisher.publish(Envelope.wrap(mine, text("not for the speech tier")), IN)
    await publisher.publish(Envelope.wrap(mine, EndCall(reason="hung up")), IN)
    await until(lambda: len(seen) == 4)
    await asyncio.sleep(0.2)
    assert started == [mine]
    assert seen == [
        (mine, "frame 0"),
        (mine, "frame 1"),
        (mine, "frame 2"),
        (mine, "EndCall"),
    ]


async def test_a_speech_partition_keeps_its_newest_audio_when_full(bus: Bus, session: Session) -> None:
    """Bounded at AUDIO_PARTITION_MAILBOXES speech mailboxes' frames, the oldest dropped (audio
    is worthless late); the publisher is never held back by it."""
    mine = in_partition(session, 3, "a")
    publisher = await bus.transport(partitions=PARTITIONS)
    bound = AUDIO_FRAMES * AUDIO_PARTITION_MAILBOXES
    for i in range(bound + 5):
        await publisher.publish(Envelope.wrap(mine, frame(i), seq=i, source="user"), IN)
    seen: list[int] = []

    async def record(envelope: Envelope, event: Event) -> None:
        seen.append(frame_number(event))

    consumer = await bus.transport(partitions=PARTITIONS)
    await consumer.open_partition(TIER_SPEECH, 3, record, never_starts)
    await until(lambda: len(seen) == bound)
    assert seen == list(range(5, bound + 5))
