"""The speech service in process: SpeechSession + the shared VadBatcher under a SessionHost and a
Worker, on the in-memory transport and state store (the same code runs over RabbitMQ and Redis in
tests/integration/test_speech.py).

Audio goes in as AudioFrame envelopes published ``in`` (the transport routes them to the session's
speech mailbox on the audio lane); what the service publishes is read from the session's reasoning
mailbox (``in``: the turn events) and edge mailbox (``out``: SessionError), exactly where the
reasoning service and the client edge would receive it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from bargein.agent.events import (
    SAMPLE_RATE,
    AudioFrame,
    Event,
    FalseInterruption,
    SessionError,
    SessionErrorCode,
    UserStartedSpeaking,
    UserTranscriptionReceived,
)
from bargein.errors import SettingsError
from bargein.hosting.host import SessionHost
from bargein.hosting.sessions import create_session
from bargein.hosting.worker import Worker
from bargein.settings import CoreSettings, SpeechSettings, load
from bargein.speech.batcher import VadBatcher
from bargein.speech.session import SpeechSession, SpeechSessions, speech_factory
from bargein.speech.transcriber import NullTranscriber, Transcriber
from bargein.speech.turns import Emission
from bargein.speech.vad import WINDOW_BYTES, shared_model
from bargein.transport.memory import MemoryBroker, MemoryStateStore, MemoryTransport
from bargein.wire.envelope import Envelope, new_session_id
from bargein.wire.names import IN, OUT, TIER_EDGE, TIER_REASONING, TIER_SPEECH, mailbox_queue
from bargein.wire.session_info import SessionInfo

from . import TOLERANCE_MS, pcm, speech_marks

T = 20.0  # generous: the in-process path takes well under a second per fixture


async def wait_until(condition: Callable[[], bool], timeout: float = T) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - polling in-process state
            await asyncio.sleep(0.005)


class Session:
    """One session as the rest of the system sees it: what the speech tier published, by mailbox."""

    def __init__(self, sid: str, rig: Rig) -> None:
        self.sid = sid
        self.rig = rig
        self.to_agent: list[tuple[Envelope, Event]] = []  # the reasoning mailbox (in)
        self.to_edge: list[tuple[Envelope, Event]] = []  # the edge mailbox (out)
        self.sent_windows = 0
        self._seq = 0
        self._pending = b""

    async def _on_in(self, envelope: Envelope, event: Event) -> None:
        self.to_agent.append((envelope, event))

    async def _on_out(self, envelope: Envelope, event: Event) -> None:
        self.to_edge.append((envelope, event))

    @property
    def runtime(self) -> SpeechSession:
        runtime = self.rig.host.sessions[self.sid].runtime
        assert isinstance(runtime, SpeechSession)
        return runtime

    def kinds(self) -> list[str]:
        return [event.type_name() for _, event in self.to_agent]

    async def send(self, frame: bytes) -> None:
        envelope = Envelope.wrap(self.sid, AudioFrame(data=frame), seq=self._seq, source="user")
        self._seq += 1
        await self.rig.transport.publish(envelope, IN)
        if len(frame) % 2 == 0 and len(frame) <= self.rig.settings.max_frame_bytes:
            total = len(self._pending) + len(frame)
            self.sent_windows += total // WINDOW_BYTES
            self._pending = b"\0" * (total % WINDOW_BYTES)

    async def stream(self, audio: bytes, sizes: Callable[[], int] | None = None) -> None:
        position = 0
        while position < len(audio):
            size = sizes() if sizes else 640
            await self.send(audio[position : position + size])
            position += size
            if self._seq % 25 == 0:
                await asyncio.sleep(0)  # let the service run, as a real sender's pacing would

    async def processed(self) -> None:
        """Wait until every full window sent so far went through the VAD and the policy, and what
        that published has arrived."""
        await wait_until(lambda: self.runtime.policy.windows >= self.sent_windows)
        await self.rig.broker.settle()

    async def expect(self, kinds: list[str]) -> None:
        await wait_until(lambda: len(self.to_agent) >= len(kinds))
        await self.processed()
        assert self.kinds() == kinds


class Rig:
    def __init__(
        self,
        settings: SpeechSettings | None = None,
        transcriber: Transcriber | None = None,
        idle_end_s: float | None = None,
        max_batch: int = 256,
    ) -> None:
        self.settings = settings or load(SpeechSettings)
        self.broker = MemoryBroker()
        self.transport = MemoryTransport(self.broker)
        self.store = MemoryStateStore()
        self.batcher = VadBatcher(shared_model(), tick_ms=self.settings.vad_tick_ms, max_batch=max_batch)
        self.factory = SpeechSessions(self.settings, batcher=self.batcher, transcriber=transcriber)
        self.idle_end_s = idle_end_s
        self.host = self.new_host("speech-1")
        self.worker = Worker(self.host, adopt_interval_s=0.05, status_interval_s=60)

    def new_host(self, owner: str) -> SessionHost:
        # with an idle limit, a short lease: the host checks for silence when it renews
        return SessionHost(
            MemoryTransport(self.broker),
            self.store,
            self.factory,
            owner=owner,
            tier=TIER_SPEECH,
            idle_end_s=self.idle_end_s,
            lease_ttl_ms=600 if self.idle_end_s else 10_000,
        )

    async def open(self, options: dict[str, Any] | None = None) -> Session:
        """What the edge does (create_session for the speech tier); a worker takes the start."""
        sid = new_session_id()
        session = Session(sid, self)
        await self.transport.open_mailbox(sid, TIER_REASONING, IN, session._on_in)
        await self.transport.open_mailbox(sid, TIER_EDGE, OUT, session._on_out)
        await create_session(self.transport, self.store, SessionInfo(sid, options or {}), tier=TIER_SPEECH)
        await wait_until(lambda: sid in self.host.sessions)
        return session

    async def close(self) -> None:
        await self.worker.drain()
        await self.batcher.close()


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    r = Rig()
    await r.worker.start()
    yield r
    await r.close()


def emissions(session: Session) -> list[Emission]:
    return list(session.runtime.policy.emissions)


def check_marks(name: str, found: list[Emission]) -> None:
    """Starts: where the burst that led to UserStartedSpeaking began; ends: where the silence that
    led to UserStoppedSpeaking began (see test_turns.py); each within ±100 ms of the script's marks."""
    starts = [e.speech_start_ms for e in found if isinstance(e.event, UserStartedSpeaking)]
    ends = [e.speech_end_ms for e in found if e.speech_end_ms is not None]
    marks = speech_marks(name)
    assert len(starts) == len(ends) == len(marks)
    for (mark_start, mark_end), start, end in zip(marks, starts, ends, strict=True):
        assert abs(start - mark_start) <= TOLERANCE_MS, (name, start, mark_start)
        assert end is not None and abs(end - mark_end) <= TOLERANCE_MS, (name, end, mark_end)


# --- the fixtures through the service -------------------------------------------------------------


@pytest.mark.parametrize("name", ["one_utterance.wav", "two_utterances.wav"])
async def test_turn_events_reach_the_agent_within_100_ms_of_the_marks(rig: Rig, name: str) -> None:
    session = await rig.open()
    await session.stream(pcm(name))
    turns = len(speech_marks(name))
    await session.expect(["UserStartedSpeaking", "UserStoppedSpeaking"] * turns)
    check_marks(name, emissions(session))
    envelopes = [env for env, _ in session.to_agent]
    assert all(env.source == "speech" and env.epoch == session.runtime.epoch >= 1 for env in envelopes)
    assert [env.seq for env in envelopes] == sorted({env.seq for env in envelopes})  # increasing
    assert envelopes[0].control  # the barge-in is a control event: published at high priority
    assert session.runtime.active_turns == 0


async def test_a_short_burst_is_a_false_interruption(rig: Rig) -> None:
    session = await rig.open()
    await session.stream(pcm("short_burst.wav"))
    await session.expect(["UserStartedSpeaking", "FalseInterruption"])
    event = session.to_agent[1][1]
    ((start, end),) = speech_marks("short_burst.wav")
    assert isinstance(event, FalseInterruption) and abs(event.duration_ms - (end - start)) <= 2 * TOLERANCE_MS
    check_marks("short_burst.wav", emissions(session))


async def test_noise_emits_nothing(rig: Rig) -> None:
    session = await rig.open()
    await session.stream(pcm("noise_burst.wav"))
    await session.processed()
    assert session.to_agent == [] and session.to_edge == []


async def test_any_frame_sizes_give_the_same_events_at_the_same_offsets(rig: Rig) -> None:
    audio = pcm("two_utterances.wav")
    regular, ragged = await rig.open(), await rig.open()
    rng = random.Random(5)
    await asyncio.gather(
        regular.stream(audio), ragged.stream(audio, sizes=lambda: 2 * rng.randrange(1, 2500))
    )
    await regular.expect(["UserStartedSpeaking", "UserStoppedSpeaking"] * 2)
    await ragged.expect(regular.kinds())
    assert [(e.at_ms, e.speech_start_ms, e.speech_end_ms) for e in emissions(regular)] == [
        (e.at_ms, e.speech_start_ms, e.speech_end_ms) for e in emissions(ragged)
    ]


async def test_many_sessions_share_batches_and_each_gets_its_own_events(rig: Rig) -> None:
    names = ["one_utterance.wav", "two_utterances.wav", "short_burst.wav", "noise_burst.wav"] * 3
    sessions = [await rig.open() for _ in names]
    await asyncio.gather(*(s.stream(pcm(n)) for s, n in zip(sessions, names, strict=True)))
    expected = {
        "one_utterance.wav": ["UserStartedSpeaking", "UserStoppedSpeaking"],
        "two_utterances.wav": ["UserStartedSpeaking", "UserStoppedSpeaking"] * 2,
        "short_burst.wav": ["UserStartedSpeaking", "FalseInterruption"],
        "noise_burst.wav": [],
    }
    for session, name in zip(sessions, names, strict=True):
        await session.expect(expected[name])
        check_marks(name, emissions(session)) if expected[name] else None
    assert rig.batcher.max_seen_batch > 1  # sessions really did share inference calls


# --- bad frames -----------------------------------------------------------------------------------


async def test_bad_frames_are_reported_and_the_session_carries_on() -> None:
    rig = Rig(settings=load(SpeechSettings, max_frame_bytes=4000))
    await rig.worker.start()
    try:
        session, other = await rig.open(), await rig.open()
        audio = pcm("one_utterance.wav")
        half = len(audio) // 2 // 640 * 640  # in the middle of the utterance
        await session.send(b"\x01" * 641)  # not whole 16-bit samples
        await session.stream(audio[:half])
        await session.send(b"\0" * 4002)  # over max_frame_bytes
        await session.send(b"\0" * 3)
        await session.stream(audio[half:])  # later good audio still produces speech events
        await other.stream(pcm("short_burst.wav"))  # and other sessions never noticed
        await session.expect(["UserStartedSpeaking", "UserStoppedSpeaking"])
        await other.expect(["UserStartedSpeaking", "FalseInterruption"])
        errors = [event for _, event in session.to_edge]
        assert all(isinstance(e, SessionError) for e in errors)
        assert [e.code for e in errors if isinstance(e, SessionError)] == [
            SessionErrorCode.BAD_AUDIO_FRAME,
            SessionErrorCode.FRAME_TOO_LARGE,
            SessionErrorCode.BAD_AUDIO_FRAME,
        ]
        assert "641 bytes" in errors[0].message if isinstance(errors[0], SessionError) else False
        assert session.runtime.counters["bad_frames"] == 3
        check_marks("one_utterance.wav", emissions(session))  # dropped frames shift nothing
        assert session.sid in rig.host.sessions and not rig.broker.dead  # nothing was rejected
    finally:
        await rig.close()


# --- per-session settings -------------------------------------------------------------------------


async def test_turn_taking_options_apply_per_session(rig: Rig) -> None:
    strict = await rig.open({"turn_taking": {"min_interruption_ms": 600}})
    default = await rig.open()
    await asyncio.gather(strict.stream(pcm("short_burst.wav")), default.stream(pcm("short_burst.wav")))
    await default.expect(["UserStartedSpeaking", "FalseInterruption"])
    await strict.processed()
    assert strict.to_agent == []  # 350 ms of "hmm" is not a barge-in when 600 ms are needed


async def test_bad_turn_taking_options_are_reported_and_defaults_used(rig: Rig) -> None:
    session = await rig.open({"turn_taking": {"min_silence_ms": 5, "speed": 2}})
    await session.stream(pcm("one_utterance.wav"))
    await session.expect(["UserStartedSpeaking", "UserStoppedSpeaking"])
    ((_, error),) = session.to_edge
    assert isinstance(error, SessionError) and error.code == SessionErrorCode.BAD_TURN_TAKING
    assert "min_silence_ms" in error.message or "speed" in error.message


# --- transcripts ----------------------------------------------------------------------------------


class FixedTranscriber:
    """A stand-in STT: says ``text`` for every turn and records what audio it was given."""

    def __init__(self, text: str | None, fail: bool = False) -> None:
        self.text = text
        self.fail = fail
        self.calls: list[int] = []

    async def transcribe(self, audio: bytes, *, session_id: str, sample_rate: int) -> str | None:
        assert sample_rate == SAMPLE_RATE
        self.calls.append(len(audio))
        await asyncio.sleep(0.01)
        if self.fail:
            raise RuntimeError("the STT server is down")
        return self.text


async def test_a_transcript_makes_a_short_burst_a_turn_and_arrives_before_the_stop() -> None:
    transcriber = FixedTranscriber("hm, yes")
    assert isinstance(transcriber, Transcriber) and isinstance(NullTranscriber(), Transcriber)
    rig = Rig(transcriber=transcriber)
    await rig.worker.start()
    try:
        session = await rig.open({"turn_taking": {"speculative_turns": False}})  # its words, no more
        await session.stream(pcm("short_burst.wav"))
        await session.expect(["UserStartedSpeaking", "UserTranscriptionReceived", "UserStoppedSpeaking"])
        transcript = session.to_agent[1][1]
        assert isinstance(transcript, UserTranscriptionReceived) and transcript.content == "hm, yes"
        ((start, end),) = speech_marks("short_burst.wav")
        (length,) = transcriber.calls  # once, with the burst's audio (plus pre-roll and silence)
        assert length / 2 / SAMPLE_RATE * 1000 >= end - start
    finally:
        await rig.close()


async def test_a_failing_transcriber_loses_nothing() -> None:
    rig = Rig(transcriber=FixedTranscriber(None, fail=True))
    await rig.worker.start()
    try:
        session = await rig.open()
        await session.stream(pcm("two_utterances.wav"))
        await session.expect(["UserStartedSpeaking", "UserStoppedSpeaking"] * 2)
        counters = session.runtime.counters  # each failed (at the turns' ends, and the pauses
        assert counters["transcriber_errors"] == counters["transcriptions"] >= 2  # the judge heard)
        check_marks("two_utterances.wav", emissions(session))
    finally:
        await rig.close()


# --- ownership ------------------------------------------------------------------------------------


async def test_an_adopter_starts_from_silence_and_consumes_what_waited(rig: Rig) -> None:
    session = await rig.open()
    await session.stream(pcm("one_utterance.wav"))
    await session.expect(["UserStartedSpeaking", "UserStoppedSpeaking"])
    first_epoch = session.runtime.epoch
    await rig.worker.abandon()  # the owner dies: nothing released
    rig.store.expire_lease(TIER_SPEECH, session.sid)
    await session.stream(pcm("short_burst.wav"))  # meanwhile the audio waits in the mailbox
    adopter = rig.new_host("speech-2")
    worker = Worker(adopter, adopt_interval_s=0.05, status_interval_s=60)
    rig.host, rig.worker = adopter, worker
    await worker.start()
    await wait_until(lambda: session.sid in adopter.sessions)
    session.sent_windows = len(pcm("short_burst.wav")) // WINDOW_BYTES  # the adopter counts from 0
    await session.expect(
        ["UserStartedSpeaking", "UserStoppedSpeaking", "UserStartedSpeaking", "FalseInterruption"]
    )
    late = [env for env, _ in session.to_agent[2:]]
    assert all(env.epoch == session.runtime.epoch > first_epoch for env in late)
    check_marks("short_burst.wav", emissions(session))  # offsets count from the adopter's first window


async def test_a_fenced_session_handles_nothing_and_leaves_the_audio_for_its_next_owner(rig: Rig) -> None:
    session = await rig.open()
    session.runtime.fenced = True  # what SessionHost does when a lease renewal fails
    await session.stream(pcm("one_utterance.wav"))
    await rig.broker.settle()
    assert session.to_agent == [] and session.runtime.policy.windows == 0
    assert session.runtime.counters["not_owner"] == 1  # the first frame went back; it consumes no more
    box = rig.broker.mailboxes[mailbox_queue(TIER_SPEECH, session.sid)]
    assert box.consumer is None and len(box.items) > 0


async def test_active_turns_is_one_while_the_user_speaks(rig: Rig) -> None:
    session = await rig.open()
    audio = pcm("one_utterance.wav")
    cut = int(2.0 * SAMPLE_RATE) * 2  # 2 s in: the utterance runs from 1.0 s to 4.0 s
    await session.stream(audio[:cut])
    await session.expect(["UserStartedSpeaking"])
    assert session.runtime.active_turns == 1 and rig.worker.active_turns() == 1
    await session.stream(audio[cut:])
    await session.expect(["UserStartedSpeaking", "UserStoppedSpeaking"])
    assert session.runtime.active_turns == 0


async def test_a_session_whose_audio_stopped_ends_itself() -> None:
    rig = Rig(idle_end_s=0.3)
    await rig.worker.start()
    try:
        session = await rig.open()
        await session.stream(pcm("short_burst.wav"))
        await session.expect(["UserStartedSpeaking", "FalseInterruption"])
        await wait_until(lambda: session.sid not in rig.host.sessions)
        assert await rig.store.orphaned_sessions(TIER_SPEECH) == []  # forgotten, not orphaned
    finally:
        await rig.close()


# --- the service's factory ------------------------------------------------------------------------


def test_speech_factory_fails_at_start_up_naming_the_bad_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BARGEIN_VAD_TICK_MS", "-1")
    with pytest.raises(SettingsError, match="BARGEIN_VAD_TICK_MS"):
        speech_factory(load(CoreSettings))
    monkeypatch.setenv("BARGEIN_VAD_TICK_MS", "5")
    monkeypatch.setenv("BARGEIN_VAD_MAX_BATCH", "32")
    factory = speech_factory(load(CoreSettings))
    assert isinstance(factory, SpeechSessions)
    assert factory.batcher.tick_s == 0.005 and factory.batcher.max_batch == 32
