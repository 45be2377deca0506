"""The speech tier over RabbitMQ and Redis, with real processes: a barge-in from audio, end to end.

One ``python -m services.speech`` and one ``python -m services.reasoning`` process serve the tests.
The test process plays the caller and the client edge (:class:`bargein.testing.caller.Caller` on its own
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
from typing import Any

import aio_pika
import pytest

from bargein.agent.events import AgentResponse, AudioFrame, SessionError
from bargein.testing.caller import Caller
from bargein.tools import benchkit, corpus
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN, TIER_REASONING, TIER_SPEECH, mailbox_queue
from tests.speech import frames, pcm, speech_marks
from tests.speech.test_whisper import heard_the_turn

from .cluster import Cluster, cluster_env, reset_shared_queues
from .support import Client, connected_client, owner_pid

T = 20.0  # generous time-out for anything that should take about a second
FRAME_PERIOD_S = 0.005  # 20 ms frames sent every 5 ms: four times real time
PROBE = {"agent": "tests.integration.agents:probe", "tail": 300, "word_delay": 0.02}


PARTITIONS = 4


@pytest.fixture(scope="module", params=["session", "partitioned"])
def mailboxes(request: pytest.FixtureRequest) -> str:
    """Every test twice: a mailbox per session and tier, and both tiers' mailboxes partitioned
    (the speech tier's audio in a partition of its own, hashed as the reasoning tier's events)."""
    return str(request.param)


@pytest.fixture(scope="module")
def cluster(
    rabbitmq_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory, mailboxes: str
) -> Iterator[Cluster]:
    reset_shared_queues(rabbitmq_url, redis_url)
    partitioned = mailboxes == "partitioned"
    if partitioned:
        asyncio.run(benchkit.forget_partitions(rabbitmq_url, redis_url, PARTITIONS))
    env = cluster_env(
        rabbitmq_url, redis_url, BARGEIN_MAILBOXES=mailboxes, BARGEIN_PARTITIONS=str(PARTITIONS)
    )
    c = Cluster(env, Path(tmp_path_factory.mktemp("speech")))
    try:
        c.start(module="services.speech")
        c.start(module="services.reasoning")
        yield c
    finally:
        c.stop_all()
        if partitioned:
            asyncio.run(benchkit.forget_partitions(rabbitmq_url, redis_url, PARTITIONS))


TIERS = (TIER_SPEECH, TIER_REASONING)


class SpeechClient(Client):
    """The test's side, for sessions that exist in both tiers and are fed audio."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._seq = itertools.count()

    async def send_audio(self, caller: Caller, data: bytes) -> None:
        """One AudioFrame, as the edge publishes it (on the audio lane)."""
        envelope = Envelope.wrap(caller.session_id, AudioFrame(data=data), seq=next(self._seq), source="user")
        await self.transport.publish(envelope, IN)

    async def stream(self, caller: Caller, audio: bytes) -> None:
        for frame in frames(audio):
            await self.send_audio(caller, frame)
            await asyncio.sleep(FRAME_PERIOD_S)

    async def open_owned(
        self, cluster: Cluster, attempts: int = 8, *, report_playback: bool = False
    ) -> Caller:
        """A session whose two leases are held by this module's processes.

        The work queues are shared by every process on the broker: when another test run's
        processes are up at the same time (other engineers share this machine), they compete for
        session starts and may take ours. Such a session is forgotten and another one opened;
        this never masks a failure of our processes to take sessions (that times out below).
        """
        ours = {p.pid for p in cluster.processes}
        foreign: list[bytes] = []
        for _ in range(attempts):
            caller = await self.open(PROBE, tiers=TIERS, report_playback=report_playback)
            leases = [await self.lease(caller, tier) for tier in TIERS]
            if all(owner_pid(lease) in ours for lease in leases):
                return caller
            foreign.extend(leases)
            await self.forget(caller, TIERS)
        raise AssertionError(f"processes outside this test keep taking our sessions: {foreign}")


@pytest.fixture
async def client(
    cluster: Cluster, rabbitmq_url: str, redis_url: str, mailboxes: str
) -> AsyncIterator[SpeechClient]:
    partitions = PARTITIONS if mailboxes == "partitioned" else 0
    async with connected_client(rabbitmq_url, redis_url, "test-speech-client", partitions=partitions) as c:
        speech = SpeechClient(c.transport, c.store, c.redis)
        try:
            yield speech
        finally:  # ended everywhere: no later run's workers adopt what this test left behind
            for caller in list(speech.callers):
                await speech.forget(caller, TIERS)


def split_between_utterances(name: str) -> tuple[bytes, bytes]:
    """The fixture cut in the middle of the pause between its two utterances (on a frame boundary)."""
    (_, first_end), (second_start, _) = speech_marks(name)
    cut_ms = (first_end + second_start) / 2
    cut = int(cut_ms * 16) * 2 // 640 * 640
    audio = pcm(name)
    return audio[:cut], audio[cut:]


async def test_barge_in_from_audio_cancels_the_generation_in_the_reasoning_process(
    client: SpeechClient, cluster: Cluster
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
    client: SpeechClient, cluster: Cluster
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


# --- speech-to-text: the services run the bundled Whisper (BARGEIN_STT=auto, bargein[stt] installed) --


async def test_a_spoken_turn_reaches_the_agents_history_as_words(
    client: SpeechClient, cluster: Cluster, rabbitmq_url: str, mailboxes: str
) -> None:
    caller = await client.open_owned(cluster)
    await client.stream(caller, pcm("one_utterance.wav"))
    turn = await caller.collect_turn(timeout=T)
    answer = "".join(e.content for e in turn if isinstance(e, AgentResponse))
    # the probe agent echoes the user's words from its history before its tail
    said = answer.split("tail0")[0]
    assert heard_the_turn(said), answer[:120]
    # partitioned, the session has no queue of its own at the broker, for either tier
    for tier in TIERS:
        assert await queue_exists(rabbitmq_url, mailbox_queue(tier, caller.session_id)) == (
            mailboxes == "session"
        )


async def queue_exists(rabbitmq_url: str, name: str) -> bool:
    connection = await aio_pika.connect(rabbitmq_url)
    async with connection:
        channel = await connection.channel()
        try:
            await channel.declare_queue(name, passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return False
        return True


async def test_over_the_agent_a_backchannel_does_not_cut_it_off_and_words_do(
    client: SpeechClient, cluster: Cluster
) -> None:
    """The caller reports playback as the edge does; "uh-huh" over the answer is heard as a
    backchannel (the answer goes on), "wait, stop" is a barge-in."""
    clips = {c.text: c for c in corpus.build(voices=("en-us",), rates=(170,), interruptions=("Wait, stop.",),
                                             backchannels=("Uh-huh.",), noises=0)}  # fmt: skip
    caller = await client.open_owned(cluster, report_playback=True)
    first, _ = split_between_utterances("barge_in.wav")
    await client.stream(caller, first)
    assert isinstance(await caller.next(timeout=T), AgentResponse)  # the agent speaks to the caller
    speech = cluster.processes[0]
    heard_before = speech.log().count("UserBackchannel")
    await client.stream(caller, clips["Uh-huh."].audio)
    async with asyncio.timeout(T):
        while speech.log().count("UserBackchannel") == heard_before:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    assert not caller.interrupted_turns  # listened to, not cut off
    assert not any(n.startswith("cancelled") for n in await client.notes(caller))
    await client.stream(caller, clips["Wait, stop."].audio)
    note = await client.wait_note(caller, "cancelled")
    await caller.wait_interrupted(1, timeout=T)
    assert note.startswith("cancelled")
