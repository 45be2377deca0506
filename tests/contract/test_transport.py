"""The Transport contract, held by MemoryTransport and AmqpTransport alike.

What the runtime builds on: a session's mailbox gets that session's events of one direction, in
publish order, one at a time, except that control overtakes data still waiting; it outlives its
consumer, so what arrives during a failover waits; nothing that fails to decode (or belongs to
another session) ever reaches a handler, and a handler's failure costs only that message; an
interrupt nobody would receive is an error; audio mailboxes keep only the newest frames; other
queues are bounded and hold their publishers back when full (backpressure), saying so aloud if that
lasts; an edge queue hears exactly the sessions added to it, and its control is never stuck behind
its data; session starts go to a worker with room.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from bargein import (
    AgentResponse,
    AudioFrame,
    EndCall,
    Event,
    SpeechDelivered,
    TurnInterrupted,
    UserStartedSpeaking,
    UserTranscriptionReceived,
)
from bargein.errors import BrokerUnavailable, NotOwner, UnroutableError
from bargein.transport.abc import Subscription
from bargein.wire.envelope import Envelope, encode
from bargein.wire.names import IN, OUT, TIER_EDGE, TIER_REASONING, TIER_SPEECH, mailbox_queue

from .harness import AUDIO_FRAMES, QUEUE_MAX, Bus, T, until

Session = Callable[[str], str]
Seen = list[tuple[Envelope, Event]]


def recorder(seen: Seen) -> Callable[[Envelope, Event], object]:
    async def handle(envelope: Envelope, event: Event) -> None:
        seen.append((envelope, event))

    return handle


def text(i: int | str) -> UserTranscriptionReceived:
    return UserTranscriptionReceived(content=str(i))


def contents(seen: Seen) -> list[str]:
    return [getattr(event, "content", type(event).__name__) for _, event in seen]


async def test_a_mailbox_gets_its_sessions_events_of_one_direction_in_order(
    bus: Bus, session: Session
) -> None:
    mine, other = session("mine"), session("other")
    consumer, publisher = await bus.transport(), await bus.transport()
    seen: Seen = []
    await consumer.open_mailbox(mine, TIER_REASONING, IN, recorder(seen))
    await consumer.declare_mailbox(other, TIER_REASONING, IN)
    for i in range(50):
        await publisher.publish(Envelope.wrap(mine, text(i), seq=i), IN)
        if i % 10 == 0:
            await publisher.publish(Envelope.wrap(other, text("other session"), seq=i), IN)
            await publisher.publish(Envelope.wrap(mine, AgentResponse(content="other direction")), OUT)
    await until(lambda: len(seen) >= 50)
    await asyncio.sleep(0.2)
    assert contents(seen) == [str(i) for i in range(50)]


async def test_a_mailbox_is_there_from_its_declaration_to_its_deletion(bus: Bus, session: Session) -> None:
    s = session("exists")
    transport = await bus.transport()
    assert not await transport.mailbox_exists(s, TIER_SPEECH)
    await transport.declare_mailbox(s, TIER_SPEECH, IN)
    assert await transport.mailbox_exists(s, TIER_SPEECH)
    assert not await transport.mailbox_exists(s, TIER_REASONING)  # each tier has its own
    await transport.delete_mailbox(s, TIER_SPEECH)
    assert not await transport.mailbox_exists(s, TIER_SPEECH)
    await transport.declare_mailbox(s, TIER_REASONING, IN)  # and the transport still works
    assert await transport.mailbox_exists(s, TIER_REASONING)
    await transport.delete_mailbox(s, TIER_REASONING)


async def test_what_arrives_before_anyone_consumes_waits_and_outlives_a_consumer(
    bus: Bus, session: Session
) -> None:
    s = session()
    publisher = await bus.transport()
    await publisher.declare_mailbox(s, TIER_REASONING, IN)
    for i in range(3):
        await publisher.publish(Envelope.wrap(s, text(i)), IN)
    first, seen = await bus.transport(), []
    subscription = await first.open_mailbox(s, TIER_REASONING, IN, recorder(seen))
    await until(lambda: len(seen) == 3)
    await subscription.cancel()
    for i in range(3, 6):
        await publisher.publish(Envelope.wrap(s, text(i)), IN)  # nobody consumes: it waits
    second, later = await bus.transport(), []
    await second.open_mailbox(s, TIER_REASONING, IN, recorder(later))
    await until(lambda: len(later) == 3)
    assert contents(seen) == ["0", "1", "2"] and contents(later) == ["3", "4", "5"]


async def test_a_message_whose_consumer_dies_mid_handling_goes_to_the_next_one(
    bus: Bus, session: Session
) -> None:
    s = session()
    publisher, doomed = await bus.transport(), await bus.transport()
    started = asyncio.Event()

    async def hang(envelope: Envelope, event: Event) -> None:
        started.set()
        await asyncio.Event().wait()  # the process dies before it acknowledges

    await doomed.open_mailbox(s, TIER_REASONING, IN, hang)
    await publisher.publish(Envelope.wrap(s, text("in flight")), IN)
    await publisher.publish(Envelope.wrap(s, text("next")), IN)
    async with asyncio.timeout(T):
        await started.wait()
    await doomed.close()
    adopter, seen = await bus.transport(), []
    await adopter.open_mailbox(s, TIER_REASONING, IN, recorder(seen))
    await until(lambda: len(seen) == 2)
    assert contents(seen) == ["in flight", "next"]


async def test_undecodable_and_foreign_messages_are_dead_lettered_and_never_handled(
    bus: Bus, session: Session
) -> None:
    s = session()
    consumer, seen = await bus.transport(), []
    await consumer.open_mailbox(s, TIER_REASONING, IN, recorder(seen))
    await bus.publish_raw(s, IN, "UserTranscriptionReceived", b"\xc1 not msgpack")
    stray = Envelope.wrap(session("elsewhere"), text("for another session"))
    await bus.publish_raw(s, IN, "UserTranscriptionReceived", encode(stray))
    publisher = await bus.transport()
    await publisher.publish(Envelope.wrap(s, text("good")), IN)
    assert await bus.dead_letter_reasons(s, 2) == ["undecodable", "bad_session"]
    await until(lambda: len(seen) == 1)
    assert contents(seen) == ["good"]


async def test_a_failing_handler_costs_only_its_message(bus: Bus, session: Session) -> None:
    s = session()
    seen: list[str] = []

    async def handle(envelope: Envelope, event: Event) -> None:
        assert isinstance(event, UserTranscriptionReceived)
        if event.content == "boom":
            raise ValueError("handler exploded")
        seen.append(event.content)

    consumer, publisher = await bus.transport(), await bus.transport()
    await consumer.open_mailbox(s, TIER_REASONING, IN, handle)
    for content in ("a", "boom", "b"):
        await publisher.publish(Envelope.wrap(s, text(content)), IN)
    assert await bus.dead_letter_reasons(s, 1) == ["handler_error"]
    await until(lambda: len(seen) == 2)
    assert seen == ["a", "b"]


async def test_control_overtakes_the_data_still_waiting(bus: Bus, session: Session) -> None:
    s = session()
    release = asyncio.Event()
    seen: list[str] = []

    async def slow(envelope: Envelope, event: Event) -> None:
        await release.wait()
        seen.append(getattr(event, "content", type(event).__name__))

    consumer, publisher = await bus.transport(), await bus.transport()
    await consumer.open_mailbox(s, TIER_REASONING, IN, slow)
    for i in range(20):
        await publisher.publish(Envelope.wrap(s, text(i)), IN)
    await asyncio.sleep(0.3)  # the first is being handled, the rest wait in the broker
    await publisher.publish(Envelope.wrap(s, UserStartedSpeaking()), IN)
    await asyncio.sleep(0.3)
    release.set()
    await until(lambda: len(seen) == 21)
    assert seen.index("UserStartedSpeaking") <= 1  # at most the one in flight went first
    assert [x for x in seen if x != "UserStartedSpeaking"] == [str(i) for i in range(20)]


async def test_an_interrupt_nobody_would_receive_is_an_error_and_data_is_not(
    bus: Bus, session: Session
) -> None:
    publisher = await bus.transport()
    with pytest.raises(UnroutableError):
        await publisher.publish(Envelope.wrap(session("nobody"), UserStartedSpeaking()), IN)
    await publisher.publish(Envelope.wrap(session("nobody"), text("lost, and that is allowed")), IN)


async def test_speech_mailboxes_keep_only_the_newest_audio_and_hear_the_hang_up(
    bus: Bus, session: Session
) -> None:
    s = session()
    publisher = await bus.transport()
    await publisher.declare_mailbox(s, TIER_SPEECH, IN)
    for i in range(AUDIO_FRAMES + 15):
        await publisher.publish(Envelope.wrap(s, AudioFrame(data=bytes([i % 256]) * 64), seq=i), IN)
    # audio goes unconfirmed, on a channel of its own: let it land before the hang-up, which is last
    # in the queue only if it is published last (a busy machine once let it overtake the audio)
    await asyncio.sleep(0.5)
    await publisher.publish(Envelope.wrap(s, EndCall(reason="hung up")), IN)  # events exchange
    consumer, seen = await bus.transport(), []
    await consumer.open_mailbox(s, TIER_SPEECH, IN, recorder(seen))
    last = AUDIO_FRAMES + 14
    # audio and events travel on lanes of their own, in no promised order between them
    await until(
        lambda: (
            any(isinstance(e, EndCall) for _, e in seen)
            and any(env.seq == last for env, e in seen if isinstance(e, AudioFrame))
        )
    )
    frames = [env.seq for env, event in seen if isinstance(event, AudioFrame)]
    assert frames == list(range(16, AUDIO_FRAMES + 15))  # the oldest were dropped for the rest


async def test_an_edge_queue_hears_the_sessions_added_to_it_until_removed(bus: Bus, session: Session) -> None:
    s, other = session("edge"), session("not-mine")
    edge, publisher, seen = await bus.transport(), await bus.transport(), []
    queue = await edge.open_edge_queue(f"edge-{s}", recorder(seen))
    await queue.add_session(s)
    await publisher.declare_mailbox(s, TIER_REASONING, IN)  # so the caller-side events route somewhere
    await publisher.publish(Envelope.wrap(s, AgentResponse(content="output"), turn=1), OUT)
    await publisher.publish(Envelope.wrap(s, UserStartedSpeaking()), IN)
    await publisher.publish(Envelope.wrap(s, SpeechDelivered(turn=1, seq=0)), IN)  # not for the edge
    await publisher.publish(Envelope.wrap(s, text("what the caller said")), IN)  # shown to clients
    await publisher.publish(Envelope.wrap(other, AgentResponse(content="another session")), OUT)
    await publisher.publish(Envelope.wrap(s, TurnInterrupted(turn=1), turn=1), OUT)
    await until(lambda: len(seen) == 4)
    await queue.remove_session(s)
    await publisher.publish(Envelope.wrap(s, AgentResponse(content="after removal")), OUT)
    await asyncio.sleep(0.3)
    # control overtakes what is still waiting; among data, and among control, order holds
    expected = ["output", "UserStartedSpeaking", "what the caller said", "TurnInterrupted"]
    assert sorted(contents(seen)) == sorted(expected)
    await queue.cancel()


async def test_a_session_start_goes_to_a_worker_with_room(bus: Bus, session: Session) -> None:
    s = session("start").encode()
    full, roomy, publisher = await bus.transport(), await bus.transport(), await bus.transport()
    offered_full: list[bytes] = []
    taken: list[bytes] = []

    async def no_room(info: bytes) -> bool:
        offered_full.append(info)
        return False

    async def room(info: bytes) -> bool:
        taken.append(info)
        return True

    first = await full.consume_session_starts(TIER_EDGE, no_room)  # no worker consumes this tier
    await publisher.publish_session_start(TIER_EDGE, s)
    await until(lambda: s in offered_full)
    await roomy.consume_session_starts(TIER_EDGE, room)
    await until(lambda: s in taken)
    await first.cancel()
    await asyncio.sleep(0.5)
    assert taken.count(s) == 1  # taken once, by the worker that had room


async def test_deleting_a_mailbox_drops_what_waited_in_it(bus: Bus, session: Session) -> None:
    s = session()
    transport = await bus.transport()
    await transport.declare_mailbox(s, TIER_REASONING, IN)
    await transport.publish(Envelope.wrap(s, text("stale")), IN)
    await transport.delete_mailbox(s, TIER_REASONING)
    seen: Seen = []
    await transport.open_mailbox(s, TIER_REASONING, IN, recorder(seen))
    await transport.publish(Envelope.wrap(s, text("fresh")), IN)
    await until(lambda: len(seen) == 1)
    await asyncio.sleep(0.2)
    assert contents(seen) == ["fresh"]
    assert mailbox_queue(TIER_REASONING, s).endswith(s)


async def test_a_handler_that_is_not_the_owner_puts_the_message_back_and_stops(
    bus: Bus, session: Session
) -> None:
    s = session()
    publisher, thawed, owner = await bus.transport(), await bus.transport(), await bus.transport()

    async def not_mine(envelope: Envelope, event: Event) -> None:
        raise NotOwner("paused past its lease")

    stale = await thawed.open_mailbox(s, TIER_REASONING, IN, not_mine)
    assert stale.alive
    await publisher.publish(Envelope.wrap(s, text("for the owner")), IN)
    await until(lambda: not stale.alive)
    seen: Seen = []
    current = await owner.open_mailbox(s, TIER_REASONING, IN, recorder(seen))
    await publisher.publish(Envelope.wrap(s, text("and the next")), IN)
    await until(lambda: len(seen) == 2)
    assert contents(seen) == ["for the owner", "and the next"]  # nothing lost, nothing dead-lettered
    assert current.alive
    await current.cancel()
    assert not current.alive


async def test_a_message_put_back_while_its_consumer_is_being_cancelled_is_not_handed_back_to_it(
    bus: Bus, session: Session
) -> None:
    """A session closing (its owner cancels the consumer) while a message for it arrives: the
    handler says NotOwner and the message goes back to the mailbox. Put back before the cancel had
    got through, the broker handed it straight back to the same consumer, again and again (a mass
    hang-up: the leftovers of every closing session went round, and the broker with them)."""
    s = session()
    publisher, closing = await bus.transport(), await bus.transport()
    calls: list[str] = []
    stale: Subscription | None = None

    async def closed_meanwhile(envelope: Envelope, event: Event) -> None:
        calls.append(getattr(event, "content", ""))
        assert stale is not None
        asyncio.get_running_loop().create_task(stale.cancel())  # the owner closes the session
        await asyncio.sleep(0)  # its cancel is on its way when the message is refused
        raise NotOwner("closed")

    stale = await closing.open_mailbox(s, TIER_REASONING, IN, closed_meanwhile)
    await publisher.publish(Envelope.wrap(s, text("late")), IN)
    await until(lambda: not stale.alive and calls)
    await asyncio.sleep(0.5)  # time for the message to come round again, if it did
    assert calls == ["late"]
    seen: Seen = []
    owner = await bus.transport()
    current = await owner.open_mailbox(s, TIER_REASONING, IN, recorder(seen))
    await until(lambda: len(seen) == 1)
    assert contents(seen) == ["late"]  # put back, not lost
    await current.cancel()


async def test_what_a_thawed_consumer_puts_back_reaches_the_owner_already_waiting_behind_it(
    bus: Bus, session: Session
) -> None:
    # the thawed process still consumes the mailbox when a message comes; the adopter subscribed
    # during the pause: it gets that message and the rest, in order
    s = session()
    publisher, thawed, owner = await bus.transport(), await bus.transport(), await bus.transport()
    refused: list[str] = []

    async def not_mine(envelope: Envelope, event: Event) -> None:
        refused.append(getattr(event, "content", ""))
        raise NotOwner("paused past its lease")

    stale = await thawed.open_mailbox(s, TIER_REASONING, IN, not_mine)
    seen: Seen = []
    current = await owner.open_mailbox(s, TIER_REASONING, IN, recorder(seen))
    for i in range(3):
        await publisher.publish(Envelope.wrap(s, text(f"question {i}")), IN)
    await until(lambda: len(seen) == 3)
    assert contents(seen) == ["question 0", "question 1", "question 2"]
    assert not stale.alive and refused and set(refused) <= {"question 0"}
    await current.cancel()


async def test_a_full_mailbox_holds_its_publisher_back_until_there_is_room(
    bus: Bus, session: Session
) -> None:
    s = session("full")
    publisher = await bus.transport()
    await publisher.declare_mailbox(s, TIER_REASONING, IN)
    for i in range(QUEUE_MAX):
        await publisher.publish(Envelope.wrap(s, text(i), seq=i), IN)
    one_more = asyncio.create_task(publisher.publish(Envelope.wrap(s, text("one more")), IN))
    await asyncio.sleep(0.5)
    assert not one_more.done()  # held back: neither dropped nor queued past the bound
    consumer, seen = await bus.transport(), []
    await consumer.open_mailbox(s, TIER_REASONING, IN, recorder(seen))
    await asyncio.wait_for(one_more, T)
    await until(lambda: len(seen) == QUEUE_MAX + 1)
    assert contents(seen) == [*(str(i) for i in range(QUEUE_MAX)), "one more"]


async def test_a_queue_that_stays_full_is_reported_not_lost_in_silence(bus: Bus, session: Session) -> None:
    s = session("stuck")
    publisher = await bus.transport(broker_wait_s=0.5)
    await publisher.declare_mailbox(s, TIER_REASONING, IN)
    for i in range(QUEUE_MAX):
        await publisher.publish(Envelope.wrap(s, text(i), seq=i), IN)
    with pytest.raises(BrokerUnavailable, match="full"):
        await publisher.publish(Envelope.wrap(s, text("nobody reads this mailbox")), IN)


async def test_an_edge_queues_control_passes_while_its_data_is_stuck(bus: Bus, session: Session) -> None:
    """The edge's data may be far behind (a burst of chunks, a slow handler); an interrupt must not
    wait behind it, or the caller hears what they talked over."""
    s = session("edge-busy")
    edge, publisher = await bus.transport(), await bus.transport()
    stuck, seen = asyncio.Event(), []

    async def handle(envelope: Envelope, event: Event) -> None:
        if isinstance(event, AgentResponse):
            await stuck.wait()  # a data handler that cannot keep up
        seen.append((envelope, event))

    queue = await edge.open_edge_queue(f"edge-{s}", handle)
    await queue.add_session(s)
    for i in range(QUEUE_MAX // 2):
        await publisher.publish(Envelope.wrap(s, AgentResponse(content=str(i)), turn=1, seq=i), OUT)
    await publisher.publish(Envelope.wrap(s, TurnInterrupted(turn=1), turn=1), OUT)
    await until(lambda: contents(seen) == ["TurnInterrupted"])
    stuck.set()
    await until(lambda: len(seen) == QUEUE_MAX // 2 + 1)
    assert contents(seen)[1:] == [str(i) for i in range(QUEUE_MAX // 2)]  # and then comes in order
    await queue.cancel()


async def test_the_output_of_many_sessions_reaches_each_edge_serving_them_once_and_in_order(
    bus: Bus, session: Session
) -> None:
    """The owner of many sessions streams them all at once, as a busy worker does, to callers on
    two edge processes. Each edge gets every chunk of its own sessions, once, in order, and nothing
    of the others'. (RabbitMQ carries them in bundles once the owner has heard from each caller's
    edge, which is why each edge reports to the owner first.)"""
    chunks = 20
    worker, edges = await bus.transport(), [await bus.transport(), await bus.transport()]
    served = [[session(f"edge{e}-{i}") for i in range(4)] for e in range(2)]
    seen: list[Seen] = [[], []]
    queues = [await edges[e].open_edge_queue(session(f"edge{e}"), recorder(seen[e])) for e in range(2)]
    heard: Seen = []
    for e, sessions in enumerate(served):
        for s in sessions:
            await queues[e].add_session(s)
            await worker.open_mailbox(s, TIER_REASONING, IN, recorder(heard))
            await edges[e].publish(Envelope.wrap(s, SpeechDelivered(turn=0, seq=0)), IN)
    await until(lambda: len(heard) == 8)

    async def stream(s: str) -> None:
        for seq in range(chunks):
            await worker.publish(Envelope.wrap(s, AgentResponse(content=f"{s}/{seq}"), turn=1, seq=seq), OUT)

    await asyncio.gather(*(stream(s) for sessions in served for s in sessions))
    await until(lambda: all(len(seen[e]) == 4 * chunks for e in range(2)))
    await asyncio.sleep(0.3)  # and nothing more comes
    for e, sessions in enumerate(served):
        assert len(seen[e]) == 4 * chunks
        for s in sessions:
            assert [env.seq for env, _ in seen[e] if env.session == s] == list(range(chunks))
            assert all(event == AgentResponse(content=f"{env.session}/{env.seq}") for env, event in seen[e])
    for queue in queues:
        await queue.cancel()
