"""The distributed runtime: real reasoning processes, real RabbitMQ, real Redis.

Two ``python -m services.reasoning`` processes serve every test here (they run
``tests.integration.agents:by_option``, which builds the agent each session start names). The test
process plays the caller and the client edge through :class:`bargein.testing.caller.Caller` on its own
RabbitMQ connection. Failures are real: processes are killed with SIGKILL or stopped with SIGTERM.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import msgspec
import pytest

from bargein import (
    AgentGenerationComplete,
    AgentHandoff,
    CustomReceived,
    EmergencyStop,
    Event,
    OutputMissed,
    TurnInterrupted,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.events import SpeculationDropped, SpeculativeTurn
from bargein.testing.caller import Caller
from bargein.wire.envelope import Envelope, decode, encode, new_session_id
from bargein.wire.names import (
    DATA,
    EVENTS_EXCHANGE,
    IN,
    PARTITION_HEADER,
    START_HEADER,
    TIER_REASONING,
    mailbox_binding,
    partition_of,
    partition_queue,
    partition_tag,
    partitions_exchange,
    routing_key,
    session_work_queue,
)
from bargein.wire.session_info import SessionInfo

from ..contract.harness import RabbitBus
from ..sdk.helpers import wait_for
from .cluster import Cluster, cluster_env, reset_shared_queues
from .support import Client, T, ask, chunks, connected_client, in_headers, text_of

SEED = "bargein.examples.seed"


@pytest.fixture(scope="module")
def cluster(rabbitmq_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reset_shared_queues(rabbitmq_url, redis_url)
    with Cluster(cluster_env(rabbitmq_url, redis_url), Path(tmp_path_factory.mktemp("reasoning"))) as c:
        c.start()
        c.start()
        yield c


@pytest.fixture
async def client(cluster: Cluster, rabbitmq_url: str, redis_url: str) -> AsyncIterator[Client]:
    async with connected_client(rabbitmq_url, redis_url, "test-client") as c:
        yield c


async def start(client: Client, agent: str = "tests.integration.agents:probe", **options: Any) -> Caller:
    return await client.open({"agent": agent, **options})


async def dead_letter_reasons(rabbitmq_url: str, count: int, queue_part: str) -> list[str]:
    """The reason headers of the next ``count`` dead letters from queues whose name has ``queue_part``."""
    return await RabbitBus(rabbitmq_url).dead_letter_reasons(queue_part, count)


# --- every seed form, over RabbitMQ ---------------------------------------------------------------


@pytest.mark.parametrize(
    "agent, interrupt",
    [
        (f"{SEED}:basic", UserStartedSpeaking()),
        (f"{SEED}:custom_handler", UserStartedSpeaking()),
        (f"{SEED}:interrupt_aware", UserStartedSpeaking()),
        (f"{SEED}:multiple_events", UserStartedSpeaking()),
        (f"{SEED}:multiple_events", EmergencyStop()),
        (f"{SEED}:multiple_events", AgentHandoff(target_agent="billing")),
        (f"{SEED}:stateful", UserStartedSpeaking()),
    ],
    ids=["basic", "async-handler", "node-handler", "list-user", "list-emergency", "list-handoff", "stateful"],
)
async def test_seed_form_interrupts_over_rabbitmq(client: Client, agent: str, interrupt: Event) -> None:
    caller = await start(client, agent, tokens_per_s=50)
    await ask(caller, "tell me something")
    heard = await chunks(caller, 2)
    await caller.emit(interrupt)
    await caller.wait_interrupted(1, timeout=T)
    assert await caller.quiet(0.3) == []
    await ask(caller, "and now?")
    events = await caller.collect_turn(timeout=T)
    assert len(text_of(events).split()) >= 20
    assert heard and caller.interrupted_turns == [1]


async def test_seed_condition_declines_then_allows_over_rabbitmq(client: Client) -> None:
    # seed.MIN_SPEAK_TIME is 1 s: a barge-in after 2 chunks is declined...
    caller = await start(client, f"{SEED}:condition", tokens_per_s=20)
    await ask(caller, "one")
    await chunks(caller, 2)
    await caller.emit(UserStartedSpeaking())
    rest = await caller.collect_turn(timeout=T)
    assert isinstance(rest[-1], AgentGenerationComplete) and caller.interrupted_turns == []
    # ...and one after 1.5 s of speaking is honoured
    await ask(caller, "two")
    await chunks(caller, 2)
    await asyncio.sleep(1.5)
    await caller.emit(UserStartedSpeaking())
    await caller.wait_interrupted(2, timeout=T)


async def test_sessions_are_spread_over_both_processes(client: Client, cluster: Cluster) -> None:
    callers = [await start(client, word_delay=0.01) for _ in range(8)]
    pids = {await client.owner_pid(c) for c in callers}
    alive = {p.pid for p in cluster.processes if p.alive()}
    assert pids <= alive and len(pids) == 2, (pids, alive)


# --- order, one generation at a time --------------------------------------------------------------


async def test_per_session_order_with_many_sessions(client: Client) -> None:
    callers = [await start(client, word_delay=0.001) for _ in range(30)]
    for caller in callers:  # back to back, without waiting: 30 sessions x 20 events in flight
        for i in range(20):
            await caller.transport.publish(
                Envelope.wrap(caller.session_id, UserTranscriptionReceived(content=f"w{i} "), seq=i), IN
            )
        await caller.transport.publish(Envelope.wrap(caller.session_id, UserStoppedSpeaking(), seq=20), IN)

    async def check(caller: Caller) -> None:
        events = await caller.collect_turn(timeout=30)
        assert text_of(events) == " ".join(f"w{i}" for i in range(20))

    await asyncio.gather(*(check(c) for c in callers))


async def test_one_generation_per_session_turns_run_one_after_another(client: Client) -> None:
    caller = await start(client, word_delay=0.01)
    await caller.emit(UserTranscriptionReceived(content="a b c d e"))
    for _ in range(3):
        await caller.emit(UserStoppedSpeaking())
    turns = [await caller.collect_turn(timeout=T) for _ in range(3)]
    assert [text_of(t) for t in turns] == ["a b c d e"] * 3
    order = [(env.turn, env.seq) for env, _ in caller.received]
    assert order == sorted(order)  # every chunk of turn 1, then of turn 2, then of turn 3
    notes = await client.notes(caller)
    assert notes.count("completed") == 3 and not any(n.startswith("cancelled") for n in notes)


# --- interrupts across processes ------------------------------------------------------------------


async def test_interrupt_cancels_the_generation_in_the_owning_process(client: Client) -> None:
    caller = await start(client, tail=200, word_delay=0.02)
    await ask(caller, "go")
    await chunks(caller, 3)
    await caller.emit(UserStartedSpeaking())
    await client.wait_note(caller, "cancelled")  # the owner's generator saw CancelledError
    await caller.wait_interrupted(1)
    assert await caller.quiet(0.3) == []


async def test_interrupt_overtakes_a_backlog(client: Client) -> None:
    caller = await start(client, tail=500, word_delay=0.02, custom_delay=0.01)
    await ask(caller, "go")
    await chunks(caller, 2)
    backlog = 400  # each takes the owner 10 ms: about 4 s of queued work
    # published at once (their confirms awaited together): one after another, on a busy machine,
    # took as long as the owner took to handle them, and there was no backlog left to overtake
    await asyncio.gather(
        *(
            caller.transport.publish(
                Envelope.wrap(caller.session_id, CustomReceived(metadata={"i": i}), seq=100 + i), IN
            )
            for i in range(backlog)
        )
    )
    await caller.emit(UserStartedSpeaking())
    note = await client.wait_note(caller, "cancelled", timeout=T)
    seen = int(note.split("custom_seen=")[1])
    assert seen < backlog / 2, f"the interrupt waited behind the backlog ({seen} of {backlog} handled)"


async def test_interrupt_does_not_wait_for_another_routes_slow_map(client: Client) -> None:
    caller = await start(client, tail=500, word_delay=0.02, custom_delay=1.0)
    await ask(caller, "go")
    await chunks(caller, 2)
    await caller.emit(CustomReceived(metadata={"slow": True}))  # the owner's .map() sleeps 1 s
    await asyncio.sleep(0.05)
    await caller.emit(UserStartedSpeaking())
    note = await client.wait_note(caller, "cancelled", timeout=T)
    assert note == "cancelled:custom_seen=0", "the interrupt waited for the slow .map() to finish"
    await caller.wait_interrupted(1)


async def test_owner_publishes_nothing_of_an_interrupted_turn(client: Client, rabbitmq_url: str) -> None:
    """Watch the raw output stream: after TurnInterrupted(1), no chunk of turn 1 made after it is
    ever published. (One made before it may reach the broker after it: chunks go out in bundles on
    the data channel, the interrupt on the control channel, and the broker orders two channels as
    they arrive; the edge's fence drops such a chunk. Seen in about one run in ten.)"""
    caller = await start(client, tail=300, word_delay=0.005)
    connection = await aio_pika.connect(rabbitmq_url)
    raw: list[tuple[str, int, float]] = []
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)  # FIFO: the order the broker took them in
        await queue.bind(EVENTS_EXCHANGE, mailbox_binding(caller.session_id, "out"))

        async def record(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            envelope, _ = decode(message.body)
            raw.append((envelope.type, envelope.turn, envelope.ts))
            await message.ack()

        await queue.consume(record)
        await ask(caller, "go")
        await chunks(caller, 5)
        await caller.emit(UserStartedSpeaking())
        await caller.wait_interrupted(1)
        await asyncio.sleep(0.5)
    cut = next(i for i, (kind, turn, _) in enumerate(raw) if (kind, turn) == (TurnInterrupted.__name__, 1))
    assert cut > 0
    interrupted_at = raw[cut][2]
    assert [item for item in raw[cut + 1 :] if item[1] == 1 and item[2] > interrupted_at] == [], raw


# --- state follows the session to another process -------------------------------------------------


async def test_stateful_node_state_reaches_the_next_turn_in_another_process(
    client: Client, cluster: Cluster
) -> None:
    caller = await start(client, f"{SEED}:stateful", tokens_per_s=50)
    await ask(caller, "tell me a story")
    await chunks(caller, 3)
    await caller.emit(UserStartedSpeaking())
    await caller.wait_interrupted(1)
    first = await client.owner_pid(caller)
    owner = cluster.by_pid(first)
    async with asyncio.timeout(T):  # the handler has run and checkpointed
        while "Saved generation state for recovery" not in owner.log():  # noqa: ASYNC110 - a log file
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    owner.kill()
    cluster.start()  # keep two processes for the other tests
    resuming = "Resuming from previous interruption"
    before = {p.pid: p.log().count(resuming) for p in cluster.processes}
    await ask(caller, "go on")
    events = await caller.collect_turn(timeout=T)
    assert isinstance(events[-1], AgentGenerationComplete)
    second = await client.owner_pid(caller)
    assert second != first
    # the owner that took the session from the dead one resumed it; with partitions, the session may
    # have moved on since (the new process takes its share of the partitions): any survivor's log
    survivors = [p for p in cluster.processes if p.pid != first]
    assert any(p.log().count(resuming) > before[p.pid] for p in survivors), [p.log() for p in survivors]


async def test_crash_mid_turn_the_answer_arrives_whole(client: Client, cluster: Cluster) -> None:
    caller = await start(client, tail=60, word_delay=0.03)
    await ask(caller, "start")
    heard = await chunks(caller, 10)
    cluster.by_pid(await client.owner_pid(caller)).kill()
    cluster.start()
    rest = await caller.collect_turn(timeout=30)
    full = "start " + " ".join(f"tail{i}" for i in range(60))
    assert heard + text_of(rest) == full  # nothing repeated, nothing missing
    assert caller.fence.dropped["duplicate"] >= 0


async def test_sigterm_drains_and_another_process_resumes_the_turn(client: Client, cluster: Cluster) -> None:
    caller = await start(client, tail=60, word_delay=0.03)
    await ask(caller, "start")
    heard = await chunks(caller, 10)
    owner = cluster.by_pid(await client.owner_pid(caller))
    cluster.start()
    assert owner.terminate() == 0
    assert "drained" in owner.log()
    rest = await caller.collect_turn(timeout=30)
    assert heard + text_of(rest) == "start " + " ".join(f"tail{i}" for i in range(60))
    assert caller.interrupted_turns == []


# --- bad input ------------------------------------------------------------------------------------


async def test_bad_messages_are_dead_lettered_and_good_traffic_flows(
    client: Client, rabbitmq_url: str
) -> None:
    caller = await start(client, word_delay=0.005)
    sid = caller.session_id
    key = routing_key(sid, IN, "UserTranscriptionReceived")
    good = Envelope.wrap(sid, UserTranscriptionReceived(content="fine"))
    other = Envelope.wrap(new_session_id(), UserTranscriptionReceived(content="x")).as_dict()
    bad: dict[str, bytes] = {
        "undecodable": b"\xc1\xc1 not msgpack",
        "unknown_type": encode(msgspec.structs.replace(good, type="os.system")),
        "too_large": encode(msgspec.structs.replace(good, payload={"content": "x" * 70_000})),
        "bad_session": encode(Envelope(**{**other, "session": "bad.id"})),
        "bad_envelope": encode(msgspec.structs.replace(good, payload={"content": 42})),
    }
    await ask(caller, "before")
    assert text_of(await caller.collect_turn(timeout=T)) == "before"
    for body in bad.values():  # as a broken process of the deployment would: to the session's partition
        await client.transport.publish_raw(key, body, headers=in_headers(client, sid))
    await ask(caller, "after")
    assert text_of(await caller.collect_turn(timeout=T)) == "before after"

    reasons = await dead_letter_reasons(rabbitmq_url, len(bad), mailbox_of(client, sid))
    assert sorted(reasons) == sorted(bad)


def mailbox_of(client: Client, session: str) -> str:
    """The name (or a part of it) of the queue ``session``'s messages to the reasoning tier wait in."""
    count = client.transport.partition_count
    return partition_queue(TIER_REASONING, partition_of(session, count), DATA) if count else session


async def test_bad_session_start_is_dead_lettered_and_workers_carry_on(
    client: Client, rabbitmq_url: str
) -> None:
    bad_id = SessionInfo("ok").encode().replace(b"ok", b"o.")  # a start whose session id is not valid
    partitions = client.transport.partition_count
    if partitions:  # our transport will not send them: as a broken process would, down every partition
        await publish_bad_starts_to_partitions(rabbitmq_url, partitions, (b"\x00garbage", bad_id))
    else:
        for body in (b"\x00garbage", bad_id):
            await client.transport.publish_session_start(TIER_REASONING, body)
    caller = await start(client, word_delay=0.005)  # a good start right behind the bad ones
    await ask(caller, "still working")
    assert text_of(await caller.collect_turn(timeout=T)) == "still working"

    queues = "bargein.partition.reasoning." if partitions else session_work_queue(TIER_REASONING)
    reasons = await dead_letter_reasons(rabbitmq_url, 2 * max(partitions, 1), queues)
    assert sorted(reasons) == sorted(["bad_envelope", "bad_session"] * max(partitions, 1))


async def publish_bad_starts_to_partitions(
    rabbitmq_url: str, partitions: int, bodies: tuple[bytes, ...]
) -> None:
    connection = await aio_pika.connect(rabbitmq_url)
    async with connection:
        channel = await connection.channel()
        starts = await channel.get_exchange(partitions_exchange(TIER_REASONING, DATA))
        for partition in range(partitions):
            headers: dict[str, Any] = {PARTITION_HEADER: partition_tag(partition), START_HEADER: "1"}
            for body in bodies:
                await starts.publish(aio_pika.Message(body, headers=headers), routing_key="")


# --- speculative turns over RabbitMQ (tests/sdk/test_speculation.py holds the rest in process) ---


async def user_words(client: Client, caller: Caller) -> list[str]:
    """The caller's words in the probe's checkpointed history."""
    state = await client.node_state(caller, "ProbeNode")
    return [e.content for e in state["conversation_events"] if isinstance(e, UserTranscriptionReceived)]


async def test_a_speculative_turn_dropped_over_rabbitmq_leaves_no_trace(client: Client) -> None:
    caller = await start(client, tail=40, word_delay=0.02)
    await ask(caller, "first")
    await caller.collect_turn(timeout=T)
    await caller.emit(SpeculativeTurn(transcript="my account number is"))
    # the owner answers it: the words are in its history (with the first turn's two events)
    await client.wait_note(caller, "start:3")
    assert await caller.quiet(0.6) == []  # ... and nothing of the answer reaches the edge
    await caller.emit(SpeculationDropped())
    await client.wait_note(caller, "cancelled")  # the generation was given up
    assert await caller.quiet(0.4) == []  # no chunk, no TurnInterrupted, no clear
    assert await user_words(client, caller) == ["first"]  # the checkpoint never held it
    await ask(caller, "second")
    events = await caller.collect_turn(timeout=T)
    assert text_of(events).startswith("first second tail0")  # the history as if it never happened
    assert await user_words(client, caller) == ["first", "second"]


async def test_a_speculative_turn_confirmed_over_rabbitmq_is_the_turn(client: Client) -> None:
    caller = await start(client, tail=20, word_delay=0.01)
    await caller.emit(SpeculativeTurn(transcript="hello"))
    await client.wait_note(caller, "completed")  # the whole answer, held at the owner
    assert await caller.quiet(0.3) == []
    await ask(caller, "hello")  # the same words: confirmed
    events = await caller.collect_turn(timeout=T)
    assert text_of(events) == "hello " + " ".join(f"tail{i}" for i in range(20))
    assert [n for n in await client.notes(caller) if n.startswith("start")] == ["start:1"]  # one run
    assert await user_words(client, caller) == ["hello"]


async def test_a_speculative_turn_on_an_owner_killed_over_rabbitmq(client: Client, cluster: Cluster) -> None:
    caller = await start(client, tail=20, word_delay=0.05)
    await ask(caller, "first")
    await caller.collect_turn(timeout=T)
    await caller.emit(SpeculativeTurn(transcript="second"))
    await client.wait_note(caller, "start:3")
    cluster.by_pid(await client.owner_pid(caller)).kill()  # nothing of the speculation was durable
    cluster.start()
    await ask(caller, "second")  # the confirmation reaches the adopter as an ordinary turn
    events = await caller.collect_turn(timeout=30)
    assert text_of(events) == "first second " + " ".join(f"tail{i}" for i in range(20))
    assert await user_words(client, caller) == ["first", "second"]


# --- a chunk the broker lost is sent again (tests/sdk/test_order.py holds the rest in process) -----


async def test_the_owner_sends_again_over_rabbitmq_what_the_edge_says_it_missed(client: Client) -> None:
    caller = await start(client, tail=6, word_delay=0.001)
    await ask(caller, "hello")
    events = await caller.collect_turn(timeout=T)
    turn = caller.received[-1][0].turn
    numbers = [e.seq for e, _ in caller.received if e.turn == turn]
    assert numbers == list(range(len(events)))  # what the caller gets has no gaps
    before = caller.fence.dropped["duplicate"]
    await caller.emit(OutputMissed(turn=turn, first=2, last=4))
    # the owner's process publishes those three again, with their numbers: here, where nothing
    # was lost, the fence drops them as repeats
    await wait_for(lambda: caller.fence.dropped["duplicate"] - before == 3, timeout=T)
    assert await caller.quiet(0.3) == []
    assert caller.fence.dropped["duplicate"] - before == 3
