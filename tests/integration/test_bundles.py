"""Output in bundles over RabbitMQ (transport/amqp.py): what the owner of many sessions publishes at
once to the edge their callers are on goes in few broker messages, routed by every session's key,
and each consumer takes only the entries of the sessions it is for. What the contract suite holds
for both transports (every chunk, once, in order, to the right edge) is not repeated here; this is
what only the broker's side has: that bundles are used at all, how a consumer reads one, what a bad
one costs, and backpressure on them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest

from bargein import AgentResponse, Event, SpeechDelivered
from bargein.transport.abc import Handler
from bargein.transport.amqp import BUNDLE_CONTENT_TYPE, AmqpTransport
from bargein.wire.envelope import Envelope, encode
from bargein.wire.names import EVENTS_EXCHANGE, IN, OUT, TIER_EDGE, TIER_REASONING, routing_key

from ..contract.harness import RabbitBus, until

pytestmark = pytest.mark.timeout(60)

Seen = list[tuple[Envelope, Event]]


def recorder(seen: Seen, delay_s: float = 0.0) -> Handler:
    async def handle(envelope: Envelope, event: Event) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        seen.append((envelope, event))

    return handle


@pytest.fixture
async def bus(rabbitmq_url: str) -> AsyncIterator[RabbitBus]:
    made = RabbitBus(rabbitmq_url)
    try:
        yield made
    finally:
        await made.close()


async def amqp(bus: RabbitBus, **kwargs: Any) -> AmqpTransport:
    transport = await AmqpTransport.connect(bus.url, name="bundle-test", mailbox_expiry_ms=120_000, **kwargs)
    bus.transports.append(transport)
    return transport


async def owned_by(worker: AmqpTransport, edge: AmqpTransport, sessions: list[str], heard: Seen) -> None:
    """``worker`` owns the sessions and has heard from the edge their callers are on."""
    for s in sessions:
        await worker.open_mailbox(s, TIER_REASONING, IN, recorder(heard))
        await edge.publish(Envelope.wrap(s, SpeechDelivered(turn=0, seq=0)), IN)
    await until(lambda: len(heard) >= len(sessions))


def chunk(s: str, seq: int) -> Envelope:
    return Envelope.wrap(s, AgentResponse(content=f"{s}/{seq}"), turn=1, seq=seq)


async def test_output_to_an_edge_the_owner_heard_from_goes_in_bundles(bus: RabbitBus, unique_id: str) -> None:
    worker, edge = await amqp(bus), await amqp(bus)
    sessions = [f"bn-{unique_id}-{i}" for i in range(10)]
    seen: Seen = []
    queue = await edge.open_edge_queue(f"bn-{unique_id}", recorder(seen))
    for s in sessions:
        await queue.add_session(s)
    # before the owner has heard from the edge, each chunk is a message of its own
    await asyncio.gather(*(worker.publish(chunk(s, 0), OUT) for s in sessions))
    assert worker.counters["published_bundles"] == 0
    await owned_by(worker, edge, sessions, [])
    await asyncio.gather(*(worker.publish(chunk(s, seq), OUT) for s in sessions for seq in (1,)))
    for seq in range(2, 6):  # each session's next chunk once its last was confirmed, as a turn does
        await asyncio.gather(*(worker.publish(chunk(s, seq), OUT) for s in sessions))
    await until(lambda: len(seen) == 6 * len(sessions))
    bundles = worker.counters["published_bundles"]
    assert 1 <= bundles < 5 * len(sessions), worker.counters  # fewer broker messages than chunks
    for s in sessions:
        assert [env.seq for env, _ in seen if env.session == s] == list(range(6))
    await queue.cancel()


async def test_a_chunk_cut_off_before_its_bundle_left_is_never_sent(bus: RabbitBus, unique_id: str) -> None:
    """An interrupt cancels the turn while its chunk waits for the next bundle (the last one is on
    its way): the chunk must not go. Found on a 2-core AMD machine: the owner's ``TurnInterrupted``
    (published at once, not through the outlet) reached the broker, and after it the chunk the
    cancelled turn had handed the outlet (tests/integration/test_distributed.py,
    ``test_owner_publishes_nothing_of_an_interrupted_turn``)."""
    worker, edge = await amqp(bus), await amqp(bus)
    s = f"bc-{unique_id}"
    seen: Seen = []
    queue = await edge.open_edge_queue(f"bc-{unique_id}", recorder(seen))
    await queue.add_session(s)
    await owned_by(worker, edge, [s], [])
    first = asyncio.create_task(worker.publish(chunk(s, 0), OUT))
    outlet = None
    while outlet is None or outlet._in_flight == 0:  # its bundle is on its way to the broker
        await asyncio.sleep(0)
        outlet = worker._outlets.get(worker._routes.get(s, ""))
    cut = asyncio.create_task(worker.publish(chunk(s, 1), OUT))
    await asyncio.sleep(0)
    assert len(outlet._entries) == 1 and outlet._in_flight == 1  # waiting for the next bundle
    cut.cancel()
    await first
    await worker.publish(chunk(s, 2), OUT)
    await until(lambda: len(seen) == 2)
    await asyncio.sleep(0.2)
    assert [env.seq for env, _ in seen] == [0, 2]
    await queue.cancel()


async def test_a_session_mailbox_takes_only_its_own_entries_of_a_bundle(
    bus: RabbitBus, unique_id: str
) -> None:
    """A caller of its own (a test's ``Caller``) consumes a session mailbox; a bundle routed to it
    for one of its entries carries the others' too: those are not its to handle, and an entry
    that claims to be its session but is another's is refused as a bad session."""
    consumer, publisher = await amqp(bus), await amqp(bus)
    one, two = f"bm-{unique_id}-1", f"bm-{unique_id}-2"
    seen_one: Seen = []
    seen_two: Seen = []
    await consumer.open_mailbox(one, TIER_EDGE, OUT, recorder(seen_one))
    await consumer.open_mailbox(two, TIER_EDGE, OUT, recorder(seen_two))
    key_one, key_two = (routing_key(s, OUT, "AgentResponse") for s in (one, two))
    forged = encode(chunk(two, 9))  # another session's envelope, filed under this one
    await publisher.publish_bundle(
        [(one, key_one, encode(chunk(one, 0))), (two, key_two, encode(chunk(two, 0))), (one, key_one, forged)]
    )
    await until(lambda: len(seen_one) == 1 and len(seen_two) == 1)
    assert [(env.session, env.seq) for env, _ in seen_one + seen_two] == [(one, 0), (two, 0)]
    assert await bus.dead_letter_reasons(one, 1) == ["bad_session"]
    assert consumer.counters["bundled_for_others"] >= 2  # each mailbox saw the other's entry


async def test_an_unreadable_bundle_is_dead_lettered_and_the_next_message_still_arrives(
    bus: RabbitBus, unique_id: str
) -> None:
    consumer = await amqp(bus)
    s = f"bu-{unique_id}"
    seen: Seen = []
    await consumer.open_mailbox(s, TIER_EDGE, OUT, recorder(seen))
    connection = await aio_pika.connect(bus.url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange(EVENTS_EXCHANGE)
        key = routing_key(s, OUT, "AgentResponse")
        await exchange.publish(aio_pika.Message(b"\xc1 not msgpack", content_type=BUNDLE_CONTENT_TYPE), key)
        await exchange.publish(aio_pika.Message(encode(chunk(s, 1)), content_type="application/msgpack"), key)
    await until(lambda: len(seen) == 1)
    assert seen[0][0].seq == 1
    assert await bus.dead_letter_reasons(s, 1) == ["undecodable"]


async def test_a_full_edge_queue_holds_bundles_back_and_nothing_is_lost(
    bus: RabbitBus, unique_id: str
) -> None:
    """The edge's queue is bounded: while it is full the broker refuses a bundle and its publishers
    wait and try again (backpressure). Every chunk arrives, once, in order."""
    worker, edge = await amqp(bus), await amqp(bus, queue_max_messages=3, edge_prefetch=1)
    sessions = [f"bf-{unique_id}-{i}" for i in range(6)]
    seen: Seen = []
    queue = await edge.open_edge_queue(f"bf-{unique_id}", recorder(seen, delay_s=0.004))
    for s in sessions:
        await queue.add_session(s)
    await owned_by(worker, edge, sessions, [])

    async def stream(s: str) -> None:
        for seq in range(25):
            await worker.publish(chunk(s, seq), OUT)

    await asyncio.gather(*(stream(s) for s in sessions))
    await until(lambda: len(seen) == 25 * len(sessions), timeout=30)
    await asyncio.sleep(0.3)
    assert len(seen) == 25 * len(sessions)
    for s in sessions:
        assert [env.seq for env, _ in seen if env.session == s] == list(range(25))
    assert worker.counters["refused_data"] > 0 and worker.counters["published_bundles"] > 0, worker.counters
    await queue.cancel()
