"""``bargein bench bargein-decisions``: does a barge-in cut the agent off when, and only when, it should?

Every clip of the corpus (:mod:`bargein.tools.corpus`: real interruptions, backchannels and noises,
each over a faint echo of the agent) is played, at the pace of real time, into a speech session that
has been told the agent is speaking, exactly as the edge tells it (``AgentPlayback``). The session is
the service's own (:class:`~bargein.speech.session.SpeechSession`, the process's VAD batcher and its
speech-to-text engine) on the in-memory transport; what it publishes toward the reasoning tier is the
decision: a ``UserStartedSpeaking`` cut the agent off, anything else did not.

It prints, per kind, how many clips cut the agent off; the recall of real interruptions (target
≥ 95 %), the share of backchannels and noises that left the agent alone (target ≥ 90 %), the
precision of the decision, how long after the caller began the decision came (in audio time: the
cost of listening for words; a decision by timing alone comes ``min_interruption_ms`` after), and
every clip judged wrongly with what the engine heard.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bargein.agent.events import (
    AgentPlayback,
    AudioFrame,
    EndCall,
    Event,
    UserBackchannel,
    UserStartedSpeaking,
    UserTranscriptionReceived,
)
from bargein.hosting.host import SessionHost
from bargein.hosting.sessions import create_session
from bargein.hosting.worker import Worker
from bargein.settings import SpeechSettings, TranscriptionSettings, load
from bargein.speech.batcher import VadBatcher
from bargein.speech.session import SpeechSession, SpeechSessions
from bargein.speech.transcriber import Transcriber, engine_name, transcriber_from_settings
from bargein.speech.turns import Emission
from bargein.speech.vad import WINDOW_BYTES, shared_model
from bargein.tools.benchkit import BenchError, percentile, run_main, say, verdict
from bargein.tools.call import FRAME_MS, frames_of
from bargein.tools.corpus import Clip, CorpusSize, sized
from bargein.transport.memory import MemoryBroker, MemoryStateStore, MemoryTransport
from bargein.wire.envelope import Envelope, new_session_id
from bargein.wire.names import IN, TIER_REASONING, TIER_SPEECH
from bargein.wire.session_info import SessionInfo

FRAMES_PER_SLEEP = 5  # paced in 100 ms steps of 20 ms frames (what a client sends)
RECALL_TARGET = 0.95
REJECTION_TARGET = 0.90
CLIP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Decision:
    clip: Clip
    interrupted: bool
    transcript: str | None  # what the barge-in or the backchannel carried
    delay_ms: float | None  # audio time from the caller's first sound to the barge-in


@dataclass
class Played:
    clip: Clip
    events: list[tuple[float, Event]] = field(default_factory=list)  # (monotonic time, event) to the agent
    emissions: list[Emission] = field(default_factory=list)
    speech_ended_at: float | None = None  # when the frame holding the end of the speech was sent
    behind: int = 0  # times the engine said it was behind

    def transcript(self) -> tuple[float, str] | None:
        """(seconds after the speech ended, text) of the turn's transcript, if one came."""
        for at, event in self.events:
            if isinstance(event, UserTranscriptionReceived) and self.speech_ended_at is not None:
                return at - self.speech_ended_at, event.content
        return None


class Judge:
    """One speech process in miniature: a host, its worker and its batcher on the in-memory bus."""

    def __init__(self, transcriber: Transcriber, settings: SpeechSettings) -> None:
        self.broker = MemoryBroker()
        self.transport = MemoryTransport(self.broker)
        self.store = MemoryStateStore()
        self.batcher = VadBatcher(
            shared_model(), tick_ms=settings.vad_tick_ms, max_batch=settings.vad_max_batch
        )
        factory = SpeechSessions(settings, batcher=self.batcher, transcriber=transcriber)
        self.host = SessionHost(self.transport, self.store, factory, owner="judge", tier=TIER_SPEECH)
        self.worker = Worker(self.host, adopt_interval_s=0.05, status_interval_s=3600)

    async def __aenter__(self) -> Judge:
        await self.worker.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.worker.drain()
        await self.batcher.close()

    async def play(self, clip: Clip, *, agent_speaking: bool = True, realtime: bool = True) -> Played:
        """``clip`` into a session of its own, as a caller's microphone (20 ms frames, at the pace of
        real time unless ``realtime`` is false), with the agent speaking or not; what the session
        published toward the agent, and when."""
        sid = new_session_id()
        played = Played(clip)

        async def to_agent(_: Envelope, event: Event) -> None:
            played.events.append((time.monotonic(), event))

        mailbox = await self.transport.open_mailbox(sid, TIER_REASONING, IN, to_agent)
        try:
            return await self._play(sid, clip, played, agent_speaking=agent_speaking, realtime=realtime)
        finally:
            await mailbox.cancel()

    async def _play(
        self, sid: str, clip: Clip, played: Played, *, agent_speaking: bool, realtime: bool
    ) -> Played:
        await create_session(self.transport, self.store, SessionInfo(sid, {}), tier=TIER_SPEECH)
        async with asyncio.timeout(CLIP_TIMEOUT_S):
            while sid not in self.host.sessions:  # noqa: ASYNC110 - the worker takes the start
                await asyncio.sleep(0.005)
            session = self.host.sessions[sid].runtime
            assert isinstance(session, SpeechSession)
            seq = 0

            async def send(event: Event) -> None:
                nonlocal seq
                seq += 1
                await self.transport.publish(Envelope.wrap(sid, event, seq=seq, source="edge"), IN)

            # the edge says so as the agent's first chunk goes out
            await send(AgentPlayback(speaking=agent_speaking))
            start, end_frame = time.monotonic(), int(clip.end_ms // FRAME_MS)
            for i, frame in enumerate(frames_of(clip.audio)):
                if i % FRAMES_PER_SLEEP == 0:  # paced in steps (or only yielding, faster than real time)
                    due = start + i * FRAME_MS / 1000
                    await asyncio.sleep(max(0.0, due - time.monotonic()) if realtime else 0)
                if i == end_frame:  # the frame holding the end of the caller's speech
                    played.speech_ended_at = time.monotonic()
                await send(AudioFrame(data=frame))
            windows = len(clip.audio) // WINDOW_BYTES
            while session.policy.windows < windows:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            silence = bytes(len(frames_of(clip.audio)[0]))
            while not session.idle:  # a microphone goes on sending silence until the turn is over
                await send(AudioFrame(data=silence))
                await asyncio.sleep(FRAME_MS / 1000)
            await self.broker.settle()
            played.emissions = list(session.policy.emissions)
            played.behind = session.counters["stt_behind"]
            await send(EndCall(reason="clip over"))
            while sid in self.host.sessions:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
        return played

    async def decide(self, clip: Clip, *, realtime: bool = True) -> Decision:
        played = await self.play(clip, realtime=realtime)
        barge = next((e for e in played.emissions if isinstance(e.event, UserStartedSpeaking)), None)
        said = next(
            (e for _, e in played.events if isinstance(e, UserBackchannel | UserStartedSpeaking)), None
        )
        transcript = said.content if isinstance(said, UserBackchannel) else said.transcript if said else None
        return Decision(
            clip,
            interrupted=any(isinstance(e, UserStartedSpeaking) for _, e in played.events),
            transcript=transcript,
            delay_ms=None if barge is None else barge.at_ms - clip.event_ms,
        )


async def decide_all(
    clips: Sequence[Clip],
    transcriber: Transcriber,
    *,
    settings: SpeechSettings | None = None,
    concurrency: int = 2,
    realtime: bool = True,
    progress: TextIO | None = None,
) -> list[Decision]:
    """Each clip through its own session, ``concurrency`` at a time (callers of one process)."""
    settings = settings or load(SpeechSettings)
    decisions: list[Decision | None] = [None] * len(clips)
    queue = list(enumerate(clips))
    started = time.monotonic()
    async with Judge(transcriber, settings) as judge:

        async def caller() -> None:
            while queue:
                i, clip = queue.pop(0)
                decisions[i] = await judge.decide(clip, realtime=realtime)
                done = sum(d is not None for d in decisions)
                if progress is not None and (done % 10 == 0 or done == len(clips)):
                    say(progress, f"  {done}/{len(clips)} clips judged ({time.monotonic() - started:.0f} s)")

        await asyncio.gather(*(caller() for _ in range(concurrency)))
    return [d for d in decisions if d is not None]


@dataclass(frozen=True)
class Scores:
    recall: float  # real interruptions that cut the agent off
    rejection: float  # backchannels and noises that did not
    precision: float  # of the cuts, the share that were real interruptions
    delay_p50_ms: float
    delay_p95_ms: float

    @property
    def met(self) -> bool:
        return self.recall >= RECALL_TARGET and self.rejection >= REJECTION_TARGET


def score(decisions: Sequence[Decision]) -> Scores:
    real = [d for d in decisions if d.clip.should_interrupt]
    other = [d for d in decisions if not d.clip.should_interrupt]
    hits = sum(d.interrupted for d in real)
    false_cuts = sum(d.interrupted for d in other)
    delays = sorted(d.delay_ms for d in real if d.delay_ms is not None)
    return Scores(
        recall=hits / len(real) if real else math.nan,
        rejection=1 - false_cuts / len(other) if other else math.nan,
        precision=hits / (hits + false_cuts) if hits + false_cuts else math.nan,
        delay_p50_ms=percentile(delays, 50),
        delay_p95_ms=percentile(delays, 95),
    )


def report(decisions: Sequence[Decision], out: TextIO) -> Scores:
    scores = score(decisions)
    for kind in ("interruption", "backchannel", "noise"):
        mine = [d for d in decisions if d.clip.kind == kind]
        cut = sum(d.interrupted for d in mine)
        say(out, f"  {kind + 's':<14} {len(mine):>4} clips, {cut:>4} cut the agent off")
    say(
        out,
        f"  real interruptions that interrupted   {scores.recall:7.1%}  (target ≥ {RECALL_TARGET:.0%}: "
        f"{verdict(scores.recall >= RECALL_TARGET)})",
    )
    say(
        out,
        f"  backchannels and noises that did not  {scores.rejection:7.1%}  (target ≥ {REJECTION_TARGET:.0%}: "
        f"{verdict(scores.rejection >= REJECTION_TARGET)})",
    )
    say(out, f"  precision of the interrupt decision   {scores.precision:7.1%}")
    say(
        out,
        f"  decision after the caller began: p50 {scores.delay_p50_ms:.0f} ms, "
        f"p95 {scores.delay_p95_ms:.0f} ms (audio time)",
    )
    wrong = [d for d in decisions if d.interrupted != d.clip.should_interrupt]
    if wrong:
        say(out, "  judged wrongly:")
        for d in wrong:
            what = "cut the agent off" if d.interrupted else "did not cut in"
            say(out, f"    {d.clip.name}: {what}; heard {d.transcript!r}")
    return scores


async def bench(out: TextIO, *, concurrency: int, corpus: CorpusSize | None = None) -> list[Decision]:
    settings = load(TranscriptionSettings)
    if engine_name(settings) == "none":
        raise BenchError("it judges barge-ins by words: set BARGEIN_STT (whisper, openai)")
    say(out, "bargein bench bargein-decisions: making the corpus (espeak-ng, sox) ...")
    try:
        clips = sized(*(corpus or CorpusSize()))
    except (OSError, RuntimeError) as exc:
        raise BenchError(f"cannot make the corpus: {exc}") from exc
    transcriber = transcriber_from_settings(settings)
    speech = load(SpeechSettings)
    say(
        out,
        f"  {len(clips)} clips; engine {engine_name(settings)}; interrupt_words {speech.interrupt_words}, "
        f"max_backchannel_ms {speech.max_backchannel_ms:.0f}; {concurrency} callers at a time, real time",
    )
    decisions = await decide_all(clips, transcriber, settings=speech, concurrency=concurrency, progress=out)
    report(decisions, out)
    return decisions


def write_json(path: str, decisions: Sequence[Decision]) -> None:
    rows: list[dict[str, Any]] = [
        {"clip": d.clip.name, "kind": d.clip.kind, "interrupted": d.interrupted,
         "transcript": d.transcript, "delay_ms": d.delay_ms}
        for d in decisions
    ]  # fmt: skip
    Path(path).write_text(json.dumps({"scores": score(decisions).__dict__, "clips": rows}, indent=2))


def decisions_main(
    concurrency: int = 2, json_path: str | None = None, corpus: CorpusSize | None = None
) -> int:
    results: list[Decision] = []

    async def go() -> None:
        results.extend(await bench(sys.stdout, concurrency=concurrency, corpus=corpus))

    code = run_main(go, "bargein-decisions")
    if json_path and results:
        write_json(json_path, results)
    return code
