"""``bargein bench stt``: how well and how fast the speech tier's engine hears, and how many callers
one speech process can serve.

Three measurements, with the engine ``BARGEIN_STT`` names and the corpus of
:mod:`bargein.tools.corpus` (its speech clips; the words said are known):

1. **Accuracy**: the word error rate of the engine on the corpus's speech, each clip transcribed
   whole, and on the demo's call (``data/barge_in.wav``, whose words are beside it); the words are
   compared as :func:`bargein.agent.words.spoken_words` normalises them.
2. **Latency**: clips played one at a time, at the pace of real time and with the agent silent,
   into a speech session of the service's own code (:class:`~bargein.tools.bench_decisions.Judge`):
   the time from the end of the caller's speech to the transcript reaching the agent (it includes
   ``min_silence_ms``, the silence that says the turn is over), and the engine's own time per call.
3. **Capacity**: N callers at once, each speaking one clip after another (a turn every 2-3 s: a
   busy caller), for each N of ``--sessions``; the largest N at which no transcription fell behind
   and the p95 latency stayed within ``LATENCY_BOUND_S`` is the real-time sessions one speech
   process serves on this machine with its ``BARGEIN_STT_WORKERS``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from bargein.agent.words import spoken_words
from bargein.settings import SpeechSettings, TranscriptionSettings, load
from bargein.speech.transcriber import Transcriber, engine_name, transcriber_from_settings
from bargein.tools.bench_decisions import Judge, Played
from bargein.tools.benchkit import BenchError, percentile, run_main, say
from bargein.tools.corpus import Clip, CorpusSize, sized
from bargein.tools.synth import RATE, demo_recording

LATENCY_BOUND_S = 2.0  # words after the end of speech, p95, for a load to count as served


def word_errors(said: str, heard: str | None) -> tuple[int, int]:
    """(edit distance over words, words said)."""
    ref, hyp = spoken_words(said), spoken_words(heard)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[-1], len(ref)


def demo_call() -> tuple[str, bytes]:
    """The words and samples of the call ``bargein demo`` plays (``data/barge_in.wav``, made with
    its marks by ``scripts/make_fixtures.py``)."""
    marks, pcm = demo_recording()
    return " ".join(marks["text"]), pcm


class Timed:
    """The engine, with the time of each call kept."""

    def __init__(self, engine: Transcriber) -> None:
        self.engine = engine
        self.seconds: list[float] = []

    async def transcribe(self, audio: bytes, *, session_id: str, sample_rate: int) -> str | None:
        started = time.perf_counter()
        try:
            return await self.engine.transcribe(audio, session_id=session_id, sample_rate=sample_rate)
        finally:
            self.seconds.append(time.perf_counter() - started)


def _ms(values: list[float], q: float) -> float:
    return percentile(sorted(values), q) * 1000


async def accuracy(clips: Sequence[Clip], engine: Transcriber, out: TextIO) -> float:
    errors = words = 0
    for i, clip in enumerate(clips, 1):
        heard = await engine.transcribe(clip.audio, session_id="bench", sample_rate=RATE)
        e, n = word_errors(clip.text, heard)
        errors, words = errors + e, words + n
        if i % 20 == 0:
            say(out, f"    {i}/{len(clips)} transcribed")
    return errors / max(words, 1)


async def load_level(judge: Judge, clips: Sequence[Clip], callers: int, per_caller: int) -> list[Played]:
    """``callers`` at once, each playing ``per_caller`` clips back to back (agent silent)."""
    plays: list[Played] = []

    async def caller(k: int) -> None:
        for n in range(per_caller):
            clip = clips[(k * per_caller + n) % len(clips)]
            plays.append(await judge.play(clip, agent_speaking=False))

    await asyncio.gather(*(caller(k) for k in range(callers)))
    return plays


async def bench(
    out: TextIO, *, sessions: Sequence[int], clips_per_test: int, corpus: CorpusSize | None = None
) -> None:
    stt = load(TranscriptionSettings)
    engine_kind = engine_name(stt)
    if engine_kind == "none":
        raise BenchError(
            "no speech-to-text engine: set BARGEIN_STT (whisper, openai) or install bargein[stt]"
        )
    say(out, f"bargein bench stt: engine {engine_kind}, {stt.stt_workers} at a time; making the corpus ...")
    try:
        speech = [c for c in sized(*(corpus or CorpusSize())) if c.kind != "noise"]
    except (OSError, RuntimeError) as exc:
        raise BenchError(f"cannot make the corpus: {exc}") from exc
    engine = Timed(transcriber_from_settings(stt))
    settings = load(SpeechSettings)

    say(out, f"  1. accuracy: {len(speech)} clips of the corpus, and the demo's call, transcribed whole")
    wer = await accuracy(speech, engine, out)
    said, audio = demo_call()
    errors, words = word_errors(said, await engine.transcribe(audio, session_id="bench", sample_rate=RATE))
    say(out, f"     word error rate {wer:.1%} on the corpus, {errors / max(words, 1):.1%} on the demo's call")

    sample = speech[:: max(1, len(speech) // clips_per_test)][:clips_per_test]
    say(out, f"  2. latency: {len(sample)} turns, one at a time, at the pace of real time")
    engine.seconds.clear()
    async with Judge(engine, settings) as judge:
        plays = await load_level(judge, sample, 1, len(sample))
    waits = [t for p in plays if (heard := p.transcript()) is not None for t in [heard[0]]]
    calls = list(engine.seconds)
    say(
        out,
        f"     words after the end of speech: p50 {_ms(waits, 50):.0f} ms, p95 {_ms(waits, 95):.0f} ms "
        f"(of which {settings.min_silence_ms:.0f} ms is the silence that ends a turn); "
        f"{len(waits)}/{len(plays)} turns had words",
    )
    say(out, f"     the engine's own time per call: p50 {_ms(calls, 50):.0f} ms, p95 {_ms(calls, 95):.0f} ms")

    say(out, "  3. capacity: callers at once, each speaking a turn every 2-3 s")
    served = 0
    for n in sessions:
        async with Judge(engine, settings) as judge:
            plays = await load_level(judge, sample, n, max(2, clips_per_test // max(n, 1)))
        waits = [heard[0] for p in plays if (heard := p.transcript()) is not None]
        behind = sum(p.behind for p in plays)
        p95 = _ms(waits, 95)
        ok = behind == 0 and len(waits) == len(plays) and p95 <= LATENCY_BOUND_S * 1000
        served = n if ok else served
        say(
            out,
            f"     {n:>3} callers: words after speech p95 {p95:.0f} ms, {behind} fell behind, "
            f"{len(plays) - len(waits)} without words: {'served' if ok else 'NOT served'}",
        )
        if not ok:
            break
    floor = " at least" if served and served == max(sessions) else ""  # it served the most it was given
    say(
        out,
        f"  real-time sessions one speech process serves here:{floor} {served} "
        f"(p95 words within {LATENCY_BOUND_S:.1f} s, none behind; BARGEIN_STT_WORKERS={stt.stt_workers})",
    )


def stt_main(
    sessions: Sequence[int] = (1, 2, 4, 8), clips: int = 24, corpus: CorpusSize | None = None
) -> int:
    async def go() -> None:
        await bench(sys.stdout, sessions=sessions, clips_per_test=clips, corpus=corpus)

    return run_main(go, "stt")
