"""The speech tier over RabbitMQ and Redis, with real processes: a barge-in from audio, end to end.

One ``python -m services.speech`` and one ``python -m services.reasoning`` process serve the tests.
The test process plays the caller and the client edge (:class:`bargein.caller.Caller` on its own
RabbitMQ connection): it creates each session for both tiers, streams fixture audio as 20 ms
AudioFrames (faster than real time: the policy counts windows, so timing does not depend on the
wall clock), and watches what a client would receive. The reasoning process runs
``tests.integration.agents:probe``, which notes in Redis when its generation sees CancelledError.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import pytest
import redis.asyncio as aioredis

from bargein.amqp import AmqpTransport
from bargein.caller import Caller
from bargein.envelope import Envelope, encode, new_session_id
from bargein.events import AgentResponse, AudioFrame, SessionError
from bargein.names import (
    AUDIO_EXCHANGE,
    IN,
    TIER_REASONING,
    TIER_SPEECH,
    lease_key,
    routing_key,
)
from bargein.redis_store import RedisStateStore
from bargein.runtime import SessionInfo
from bargein.sessions import create_session, forget_session
from tests.speech import frames, pcm, speech_marks

from .agents import notes_key
from .cluster import Cluster, cluster_env, reset_shared_queues

T = 20.0  # generous time-out for anything that should take about a second
FRAME_PERIOD_S = 0.005  # 20 ms frames sent every 5 ms: four times real time
PROBE = {"agent": "tests.integration.agents:probe", "tail": 300, "word_delay": 0.02}


@pytest.fixture(scope="module")
def cluster(rabbitmq_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reset_shared_queues(rabbitmq_url, redis_url)
    c = Cluster(cluster_env(rabbitmq_url, redis_url), Path(tmp_path_factory.mktemp("speech")))
    try:
        c.start(module="services.speech")
        c.start(module="services.reasoning")
        yield c
    finally:
        c.stop_all()


class Client:
    def __init__(
        self,
        transport: AmqpTransport,
        store: RedisStateStore,
        redis_client: aioredis.Redis,
        audio: aio_pika.abc.AbstractExchange,
    ) -> None:
        self.transport = transport
        self.store = store
        self.redis = redis_client
        self.audio = audio
        self.callers: list[Caller] = []
        self._seq = itertools.count()

    async def open(self) -> Caller:
        """What the edge does when a caller arrives: the session exists for speech and reasoning."""
        sid = new_session_id()
        caller = Caller(self.transport, sid)
        await caller.attach()
        info = SessionInfo(sid, dict(PROBE), edge_reports_delivery=True)
        await create_session(self.transport, self.store, info, tier=TIER_SPEECH)
        await create_session(self.transport, self.store, info, tier=TIER_REASONING)
        self.callers.append(caller)
        return caller

    async def send_audio(self, caller: Caller, data: bytes) -> None:
        """Publish one AudioFrame as the edge does, on the audio lane (``bargein.audio``, key
        ``<session>.in.AudioFrame``). Published here directly rather than with ``caller.emit``
        because ``AmqpTransport.publish`` still sends every lane to ``bargein.events``."""
        envelope = Envelope.wrap(caller.session_id, AudioFrame(data=data), seq=next(self._seq), source="user")
        key = routing_key(caller.session_id, IN, envelope.type)
        await self.audio.publish(aio_pika.Message(encode(envelope), content_type="application/msgpack"), key)

    async def stream(self, caller: Caller, audio: bytes) -> None:
        for frame in frames(audio):
            await self.send_audio(caller, frame)
            await asyncio.sleep(FRAME_PERIOD_S)

    async def wait_note(self, caller: Caller, prefix: str, timeout: float = T) -> str:
        async with asyncio.timeout(timeout):
            while True:
                for raw in await self.redis.lrange(notes_key(caller.session_id), 0, -1):
                    note = raw.decode().split("|pid=")[0]
                    if note.startswith(prefix):
                        return note
                await asyncio.sleep(0.02)

    async def open_owned(self, cluster: Cluster, attempts: int = 8) -> Caller:
        """A session whose two leases are held by this module's processes.

        The work queues are shared by every process on the broker: when another test run's
        processes are up at the same time (other engineers share this machine), they compete for
        session starts and may take ours. Such a session is forgotten and another one opened;
        this never masks a failure of our processes to take sessions (that times out below).
        """
        ours = {p.pid for p in cluster.processes}
        foreign: list[str] = []
        for _ in range(attempts):
            caller = await self.open()
            owners = [await self.owner(caller, tier) for tier in ("speech", "reasoning")]
            if all(int(o.rsplit(":", 1)[0].split("-")[-2]) in ours for o in owners):
                return caller
            foreign.extend(owners)
            self.callers.remove(caller)
            await caller.detach()
            for tier in (TIER_SPEECH, TIER_REASONING):
                await forget_session(self.transport, self.store, caller.session_id, tier=tier)
        raise AssertionError(f"processes outside this test keep taking our sessions: {foreign}")

    async def owner(self, caller: Caller, tier: str) -> str:
        async with asyncio.timeout(T):
            while True:
                value = await self.redis.get(
                    lease_key(TIER_SPEECH if tier == "speech" else TIER_REASONING, caller.session_id)
                )
                if value:
                    return str(value.decode())
                await asyncio.sleep(0.05)


@pytest.fixture
async def client(cluster: Cluster, rabbitmq_url: str, redis_url: str) -> AsyncIterator[Client]:
    transport = await AmqpTransport.connect(rabbitmq_url, name="test-speech-client")
    store = RedisStateStore.from_url(redis_url)
    redis_client = aioredis.Redis.from_url(redis_url)
    connection = await aio_pika.connect_robust(rabbitmq_url)
    channel = await connection.channel(publisher_confirms=False)
    audio = await channel.declare_exchange(AUDIO_EXCHANGE, aio_pika.ExchangeType.TOPIC, durable=True)
    c = Client(transport, store, redis_client, audio)
    try:
        yield c
    finally:
        for caller in c.callers:
            await caller.detach()
        await connection.close()
        await transport.close()
        await store.close()
        await redis_client.aclose()


def split_between_utterances(name: str) -> tuple[bytes, bytes]:
    """The fixture cut in the middle of the pause between its two utterances (on a frame boundary)."""
    (_, first_end), (second_start, _) = speech_marks(name)
    cut_ms = (first_end + second_start) / 2
    cut = int(cut_ms * 16) * 2 // 640 * 640
    audio = pcm(name)
    return audio[:cut], audio[cut:]


async def test_barge_in_from_audio_cancels_the_generation_in_the_reasoning_process(
    client: Client, cluster: Cluster
) -> None:
    caller = await client.open_owned(cluster)
    first, second = split_between_utterances("barge_in.wav")
    await client.stream(caller, first)  # speech, then 750 ms of silence: UserStoppedSpeaking
    event = await caller.next(timeout=T)  # the agent answers: its chunks reach the caller
    assert isinstance(event, AgentResponse), event
    await client.stream(caller, second)  # the caller talks over the answer: UserStartedSpeaking
    note = await client.wait_note(caller, "cancelled")  # the generation saw CancelledError
    await caller.wait_interrupted(1, timeout=T)  # and the edge saw turn 1 cut off
    assert note.startswith("cancelled") and caller.interrupted_turns[0] == 1
    speech = cluster.processes[0]
    assert "UserStartedSpeaking" in speech.log() and "UserStoppedSpeaking" in speech.log()


async def test_bad_frames_reach_the_client_as_errors_and_the_service_carries_on(
    client: Client, cluster: Cluster
) -> None:
    caller = await client.open_owned(cluster)
    await client.send_audio(caller, b"\x00" * 641)  # not whole samples
    await client.send_audio(caller, b"\x00" * 64_002)  # over BARGEIN_MAX_FRAME_BYTES (64000)
    errors = [await caller.next(timeout=T) for _ in range(2)]
    assert [e.code for e in errors if isinstance(e, SessionError)] == ["bad_audio_frame", "frame_too_large"]
    first, _ = split_between_utterances("barge_in.wav")
    await client.stream(caller, first)  # good audio after the bad: the turn still happens
    event = await caller.next(timeout=T)
    assert isinstance(event, AgentResponse), event
    assert all(p.alive() for p in cluster.processes)
