"""``bargein bench turns``: does the agent wait for a caller who pauses mid-sentence, and answer
one who has finished at once? End to end through the real services, beside the peers' rules.

The bench runs a stack of its own on the configured broker and Redis (``bargein reasoning``,
``bargein speech`` with the ``BARGEIN_STT`` engine, ``bargein broadcast``; the default agent on
its scripted model, 250 ms to its first word) and plays the turn corpus
(:mod:`bargein.tools.turn_corpus`: sentences with a pause of 0.5, 0.8 or 1.2 s after an unfinished
clause, and finished sentences, in several voices and rates, with noise; and the demo call's two
sentences, the speech fixtures' recording) into sessions at real time,
as callers who hear the agent (``audio=pcm16``). Each clip is played once under each of bargein's
ways of ending a turn, as per-session ``turn_taking`` options of the same stack:

* ``text``: the text judge with speculative turns (the defaults);
* ``text, no speculation``: the text judge alone;
* ``smart-turn``: the acoustic model (Pipecat's smart-turn v3.2) as bargein's judge, with
  speculative turns;
* ``silence 500 ms``: a fixed 500 ms of silence (LiveKit Agents' default ``min_endpointing_delay``).

Measured for each: *premature answers* (the agent's voice reached the caller before the end of a
paused sentence) per 100 pauses, and per pause length; *end of speech → first agent audio* (p50,
p95) on finished sentences. The speech and reasoning services' counters give the speculative turns
started, confirmed and dropped. Beside them, offline, the same clips judged by Pipecat 1.14's
smart-turn v3.2 analyzer as Pipecat runs it (a turn ends once its model says complete after 0.2 s
of silence, or after 3 s), with the same Silero VAD: premature decisions, and the decision's delay
after the end of speech (audio time plus the model's own time). It needs the ``peers`` extra
(``pip install 'bargein[peers]'``, which ``make install`` has); without it that row says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from bargein.settings import BrokerSettings, load
from bargein.speech.turns import HYSTERESIS
from bargein.speech.vad import WINDOW_BYTES, WINDOW_MS, VadStream, pcm16_to_float, shared_model
from bargein.tools.audio_caller import AudioCaller
from bargein.tools.benchkit import (
    Processes,
    all_or_stalled,
    forget_sessions,
    free_port,
    percentile,
    run_main,
    say,
    scripted_stack_env,
    start_service,
    verdict,
)
from bargein.tools.turn_corpus import FINISHED, PAUSED, PAUSES_MS, RATES, VOICES, Clip, build


@dataclass(frozen=True)
class Variant:
    """One way of ending a turn: ``key`` picks it (``--judges``), ``name`` reports it, ``options``
    are the session's ``turn_taking``."""

    key: str
    name: str
    options: dict[str, Any]


VARIANTS: tuple[Variant, ...] = (
    Variant("text", "text", {"turn_detector": "text", "speculative_turns": True}),
    Variant("text-alone", "text, no speculation", {"turn_detector": "text", "speculative_turns": False}),
    Variant("smart-turn", "smart-turn", {"turn_detector": "smart-turn", "speculative_turns": True}),
    Variant("silence", "silence 500 ms", {"turn_detector": "silence", "min_silence_ms": 500}),
)
JUDGES = tuple(variant.key for variant in VARIANTS)


def variants(keys: Sequence[str] | None) -> tuple[Variant, ...]:
    """The variants ``keys`` name, in the bench's order (all of them for None); ValueError naming
    an unknown key."""
    if keys is None:
        return VARIANTS
    unknown = sorted(set(keys) - set(JUDGES))
    if unknown:
        raise ValueError(f"unknown turn judges {', '.join(unknown)}: pick from {', '.join(JUDGES)}")
    return tuple(variant for variant in VARIANTS if variant.key in keys)


PREMATURE_TARGET = 5.0  # premature answers per 100 pauses of 0.8 s, at most
LATENCY_TARGET_MS = 500.0  # end of speech → first agent audio, p50
CLIP_TIMEOUT_S = 30.0
ANSWER_WAIT_S = 4.0  # after the caller's speech ends, how long the first audio may take
PIPECAT_VAD_STOP_MS = 200.0  # Pipecat's VAD says the caller stopped after this much silence
SPEECH_THRESHOLD = 0.5


@dataclass
class Played:
    """What a caller saw of one clip, in seconds after the end of their speech (negative: before)."""

    variant: str
    clip: Clip
    first_audio_s: float | None  # the agent's voice
    first_chunk_s: float | None = None  # the agent's text (its first ``agent_chunk``)
    transcripts_s: list[float] = field(default_factory=list)  # the caller's turns (``user_transcript``)

    @property
    def premature(self) -> bool:
        """A paused sentence answered before its end: the agent spoke, or wrote, before the caller
        had finished, or the pause ended a turn of its own (two transcripts for one sentence)."""
        early = [t for t in (self.first_audio_s, self.first_chunk_s) if t is not None and t < 0]
        return self.clip.kind == "paused" and (bool(early) or len(self.transcripts_s) > 1)


@dataclass
class Judged:
    """A peer's offline verdict on one clip: when (audio ms) it decided the turn was over."""

    clip: Clip
    decided_ms: float | None
    model_ms: float = 0.0

    @property
    def premature(self) -> bool:
        return (
            self.clip.kind == "paused" and self.decided_ms is not None and self.decided_ms < self.clip.end_ms
        )

    @property
    def delay_s(self) -> float | None:
        if self.decided_ms is None:
            return None
        return (self.decided_ms - self.clip.end_ms + self.model_ms) / 1000


@dataclass
class Tally:
    """One row of the report."""

    name: str
    premature: dict[float, tuple[int, int]] = field(default_factory=dict)  # pause → (premature, of)
    latencies_s: list[float] = field(default_factory=list)  # finished sentences
    unanswered: int = 0
    words_s: list[float] = field(default_factory=list)  # finished: end of speech → the caller's words
    text_s: list[float] = field(default_factory=list)  # ... → the agent's first text

    def add(self, clip: Clip, premature: bool, after_end_s: float | None) -> None:
        if clip.kind == "paused":
            bad, of = self.premature.get(clip.pause_ms, (0, 0))
            self.premature[clip.pause_ms] = (bad + premature, of + 1)
        elif after_end_s is None:
            self.unanswered += 1
        else:
            self.latencies_s.append(after_end_s)

    def per_100(self, pause: float | None = None) -> float:
        rows = [v for k, v in self.premature.items() if pause is None or k == pause]
        bad, of = sum(r[0] for r in rows), sum(r[1] for r in rows)
        return 100 * bad / of if of else float("nan")

    def latency_ms(self, q: float) -> float:
        return percentile(sorted(s * 1000 for s in self.latencies_s), q)

    def as_dict(self) -> dict[str, Any]:
        return {
            "premature_per_100": self.per_100(),
            "premature_by_pause": {
                f"{k:.0f}": {"premature": v[0], "of": v[1]} for k, v in self.premature.items()
            },
            "first_audio_p50_ms": self.latency_ms(50),
            "first_audio_p95_ms": self.latency_ms(95),
            "finished": len(self.latencies_s) + self.unanswered,
            "unanswered": self.unanswered,
            "words_p50_ms": percentile(sorted(s * 1000 for s in self.words_s), 50),
            "text_p50_ms": percentile(sorted(s * 1000 for s in self.text_s), 50),
        }


# --- bargein, through the services -----------------------------------------------------------------


def _audio_at(caller: AudioCaller, after: float) -> float | None:
    return next((r.at for r in caller.received if r.frame is None and r.audio and r.at > after), None)


async def _first_audio(caller: AudioCaller, after: float, until: float) -> float | None:
    while time.monotonic() < until:
        at = _audio_at(caller, after)
        if at is not None:
            return at
        await asyncio.sleep(0.01)
    return None


async def _quiet(caller: AudioCaller, for_s: float = 0.3) -> None:
    async with asyncio.timeout(CLIP_TIMEOUT_S):
        while True:
            silent = caller.silent_since()
            if silent is not None and time.monotonic() - silent >= for_s:
                return
            await asyncio.sleep(0.02)


async def play(caller: AudioCaller, variant: str, clip: Clip) -> Played:
    """Speak ``clip`` at real time and see what the caller gets; the agent is then stopped, and
    allowed to fall silent, for the next clip."""
    said = caller.say(clip.audio)
    async with asyncio.timeout(CLIP_TIMEOUT_S):
        while said.started == 0.0:  # noqa: ASYNC110 - the sender fills it in
            await asyncio.sleep(0.005)
    end = said.started + clip.end_ms / 1000
    first = await _first_audio(caller, said.started, end + ANSWER_WAIT_S)
    async with asyncio.timeout(CLIP_TIMEOUT_S):
        while said.ended is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    until = end + ANSWER_WAIT_S
    chunks = [r.at for r in caller.frames("agent_chunk", after=said.started) if r.at < until]
    words = [r.at - end for r in caller.frames("user_transcript", after=said.started) if r.at < until]
    await caller.interrupt()  # the stop button: the next clip starts on a silent agent
    await _quiet(caller)
    return Played(
        variant,
        clip,
        None if first is None else first - end,
        chunks[0] - end if chunks else None,
        words,
    )


def _timeline(played: Played) -> str:
    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1000:+.0f}"

    words = ", ".join(ms(t) for t in played.transcripts_s) or "—"
    return f"words at {words}, text at {ms(played.first_chunk_s)}, voice at {ms(played.first_audio_s)} ms"


class _TurnsBench:
    def __init__(
        self,
        *,
        clips: list[Clip],
        ways: tuple[Variant, ...],
        callers: int,
        rabbitmq_url: str,
        redis_url: str,
        out: TextIO,
    ) -> None:
        self.clips = clips
        self.ways = ways
        self.n_callers = callers
        self.rabbitmq_url = rabbitmq_url
        self.redis_url = redis_url
        self.out = out
        self.processes = Processes(out)
        self.probe_ports = {"reasoning": free_port(), "speech": free_port()}
        self.env = scripted_stack_env(rabbitmq_url, redis_url, BARGEIN_TTS="espeak")
        self.session_ids: list[str] = []
        self.done = 0

    def say(self, text: str) -> None:
        say(self.out, text)

    async def caller(
        self, client: httpx.AsyncClient, edge_url: str, work: asyncio.Queue[tuple[str, Clip]]
    ) -> list[Played]:
        """One caller: a session per variant, and the clips handed to it, in turn."""
        callers: dict[str, AudioCaller] = {}
        results: list[Played] = []
        async with contextlib.AsyncExitStack() as stack:
            for way in self.ways:
                created = (
                    await client.post(f"{edge_url}/v1/sessions", json={"turn_taking": way.options})
                ).json()
                self.session_ids.append(created["session_id"])
                callers[way.name] = await stack.enter_async_context(
                    AudioCaller.joined(created["ws_url"], created["token"])
                )
            await asyncio.sleep(1.0)  # the speech tier owns the sessions and hears silence first
            while not work.empty():
                name, clip = work.get_nowait()
                played = await play(callers[name], name, clip)
                results.append(played)
                self.done += 1
                heard = _timeline(played)
                mark = " PREMATURE" if played.premature else ""
                self.say(
                    f"  [{self.done}/{len(self.clips) * len(self.ways)}] {name}: {clip.name}: {heard}{mark}"
                )
        return results

    async def counters(self) -> dict[str, int]:
        """The services' speculative-turn counters, from their /metrics."""
        wanted = {
            "speech": ("speculative_starts", "speculative_hits", "speculative_drops"),
            "reasoning": ("speculations", "speculations_confirmed", "speculations_dropped"),
        }
        found: dict[str, int] = {}
        async with httpx.AsyncClient(timeout=5) as client:
            for service, names in wanted.items():
                text = (await client.get(f"http://127.0.0.1:{self.probe_ports[service]}/metrics")).text
                for name in names:
                    match = re.search(
                        rf'bargein_events_total{{[^}}]*event="{name}"[^}}]*}} ([0-9.e+]+)', text
                    )
                    found[name] = int(float(match.group(1))) if match else 0
        return found

    async def run(self) -> tuple[list[Played], dict[str, int]]:
        work: asyncio.Queue[tuple[str, Clip]] = asyncio.Queue()
        for clip in self.clips:  # interleaved, so the variants share the machine's load alike
            for way in self.ways:
                work.put_nowait((way.name, clip))
        try:
            for service in ("reasoning", "speech"):
                env = {**self.env, "BARGEIN_PROBE_PORT": str(self.probe_ports[service])}
                await start_service(self.processes, service, service, env)
            edge = await start_service(self.processes, "broadcast", "edge", self.env)
            async with httpx.AsyncClient(timeout=CLIP_TIMEOUT_S) as client:
                per_caller = await all_or_stalled(
                    self.processes,
                    (self.caller(client, edge.url, work) for _ in range(self.n_callers)),
                    f"a clip did not finish in {CLIP_TIMEOUT_S:.0f} s",
                )
            return [p for caller in per_caller for p in caller], await self.counters()
        finally:
            await self.processes.stop()
            await forget_sessions(self.rabbitmq_url, self.redis_url, self.session_ids, self.out)


# --- the peers, offline ----------------------------------------------------------------------------


def voiced_windows(audio: bytes) -> list[bool]:
    """Each 32 ms window of ``audio``: speech or not, by Silero with the speech tier's hysteresis."""
    stream, model = VadStream(), shared_model()
    voiced, out = False, []
    for start in range(0, len(audio) - WINDOW_BYTES + 1, WINDOW_BYTES):
        probability = stream.probability(pcm16_to_float(audio[start : start + WINDOW_BYTES]), model)
        voiced = probability >= (SPEECH_THRESHOLD - HYSTERESIS if voiced else SPEECH_THRESHOLD)
        out.append(voiced)
    return out


async def smart_turn(clips: Sequence[Clip]) -> list[Judged] | str:
    """Each clip judged as Pipecat 1.14 ends a turn with its smart-turn v3.2 analyzer: the model asked
    once the VAD has heard 0.2 s of silence after speech, its "complete" ending the turn; else the
    analyzer's own 3 s of silence. A string says why it could not run."""
    try:
        from pipecat.audio.turn.base_turn_analyzer import EndOfTurnState
        from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3
    except ImportError as exc:
        return f"not measured: Pipecat is not installed (pip install 'bargein[peers]'): {exc}"
    from loguru import logger

    logger.remove()  # Pipecat logs every verdict at DEBUG; the report has them
    analyzer = LocalSmartTurnAnalyzerV3(sample_rate=16_000)
    analyzer.set_sample_rate(16_000)
    judged: list[Judged] = []
    try:
        for clip in clips:
            analyzer.clear()  # type: ignore[no-untyped-call]  # Pipecat's own
            silence_ms, heard, decided, model_ms = 0.0, False, None, 0.0
            for i, voiced in enumerate(voiced_windows(clip.audio)):
                window = clip.audio[i * WINDOW_BYTES : (i + 1) * WINDOW_BYTES]
                at_ms = (i + 1) * WINDOW_MS
                if analyzer.append_audio(window, voiced) == EndOfTurnState.COMPLETE:
                    decided = at_ms  # the analyzer's own stop_secs
                    break
                heard |= voiced
                silence_ms = 0.0 if voiced else silence_ms + WINDOW_MS
                if heard and not voiced and silence_ms - WINDOW_MS < PIPECAT_VAD_STOP_MS <= silence_ms:
                    started = time.perf_counter()
                    state, _ = await analyzer.analyze_end_of_turn()
                    model_ms = (time.perf_counter() - started) * 1000
                    if state == EndOfTurnState.COMPLETE:
                        decided = at_ms
                        break
            judged.append(Judged(clip, decided, model_ms))
    finally:
        await analyzer.cleanup()  # type: ignore[no-untyped-call]
    return judged


def fixed_silence(clips: Sequence[Clip], silence_ms: float = 500.0) -> list[Judged]:
    """Each clip judged by a fixed silence after speech, offline (the same VAD)."""
    judged = []
    for clip in clips:
        run, heard, decided = 0.0, False, None
        for i, voiced in enumerate(voiced_windows(clip.audio)):
            heard |= voiced
            run = 0.0 if voiced else run + WINDOW_MS
            if heard and run >= silence_ms:
                decided = (i + 1) * WINDOW_MS
                break
        judged.append(Judged(clip, decided))
    return judged


# --- the report ------------------------------------------------------------------------------------


def tally(name: str, rows: Sequence[Played | Judged]) -> Tally:
    out = Tally(name)
    for row in rows:
        after = row.first_audio_s if isinstance(row, Played) else row.delay_s
        out.add(row.clip, row.premature, after)
        if isinstance(row, Played) and row.clip.kind == "finished":
            out.words_s += row.transcripts_s[-1:]
            out.text_s += [row.first_chunk_s] if row.first_chunk_s is not None else []
    return out


def _table(title: str, first: str, pauses: list[float], rows: Sequence[Tally | tuple[str, str]]) -> list[str]:
    """Premature answers per 100 pauses, by pause length and in all; the time after speech."""
    head = "".join(f"{f'{p:.0f} ms':>9}" for p in pauses)
    lines = [f"  {title}", f"  {first:<26}{head}{'all':>8}{'p50':>8}{'p95':>8}"]
    for row in rows:
        if isinstance(row, tuple):  # a judge that could not run, and why
            lines.append(f"  {row[0]:<26}{row[1]}")
            continue
        cells = "".join(f"{row.per_100(p):>9.1f}" for p in pauses)
        times = f"{row.latency_ms(50):>8.0f}{row.latency_ms(95):>8.0f}"
        lines.append(f"  {row.name:<26}{cells}{row.per_100():>8.1f}{times}")
    return lines


def report(
    played: list[Played],
    counters: dict[str, int],
    peers: dict[str, list[Judged] | str],
    out: TextIO,
    ways: tuple[Variant, ...] = VARIANTS,
) -> dict[str, Any]:
    rows = [tally(way.name, [p for p in played if p.variant == way.name]) for way in ways]
    pauses = sorted({c.pause_ms for p in played if (c := p.clip).kind == "paused"})
    lines = [""]
    lines += _table(
        "through the services: premature answers per 100 pauses; end of speech → first agent audio (ms)",
        "turn end",
        pauses,
        rows,
    )
    for row in rows:  # where a finished sentence's wait goes
        words = percentile(sorted(s * 1000 for s in row.words_s), 50)
        text = percentile(sorted(s * 1000 for s in row.text_s), 50)
        lines.append(
            f"  {row.name}: after a finished sentence, p50: its words at the caller {words:.0f} ms,"
            f" the agent's first text {text:.0f} ms, its voice {row.latency_ms(50):.0f} ms"
        )
    starts, hits = counters.get("speculative_starts", 0), counters.get("speculative_hits", 0)
    rate = 100 * hits / starts if starts else float("nan")
    lines.append(
        f"  speculative turns: {starts} started, {hits} confirmed ({rate:.0f}%),"
        f" {counters.get('speculative_drops', 0)} dropped (the reasoning owner:"
        f" {counters.get('speculations', 0)} started, {counters.get('speculations_confirmed', 0)} confirmed,"
        f" {counters.get('speculations_dropped', 0)} dropped)"
    )
    peer_rows = {name: j if isinstance(j, str) else tally(name, j) for name, j in peers.items()}
    lines += _table(
        "offline, the same clips and VAD: premature decisions per 100 pauses; end of speech → decision (ms)",
        "judge",
        pauses,
        [(name, row) if isinstance(row, str) else row for name, row in peer_rows.items()],
    )
    best = rows[0]
    premature_08, p50 = best.per_100(800.0), best.latency_ms(50)
    lines += [
        f"  target: premature answers ≤ {PREMATURE_TARGET:.0f} per 100 pauses of 0.8 s"
        f" ({best.name}: {premature_08:.1f}): {verdict(premature_08 <= PREMATURE_TARGET)}",
        f"  target: end of speech → first agent audio p50 ≤ {LATENCY_TARGET_MS:.0f} ms"
        f" ({best.name}: {p50:.0f} ms): {verdict(p50 <= LATENCY_TARGET_MS)}",
    ]
    for line in lines:
        say(out, line)
    return {
        "variants": {row.name: row.as_dict() for row in rows},
        "speculative": {**counters, "hit_rate": rate},
        "peers": {name: row if isinstance(row, str) else row.as_dict() for name, row in peer_rows.items()},
        "premature_target_met": premature_08 <= PREMATURE_TARGET,
        "latency_target_met": p50 <= LATENCY_TARGET_MS,
    }


async def run_turns_bench(
    *,
    callers: int = 2,
    voices: Sequence[str] = VOICES,
    rates: Sequence[int] = RATES,
    sentences: int | None = None,
    pauses_ms: Sequence[float] = PAUSES_MS,
    judges: Sequence[str] | None = None,
    rabbitmq_url: str | None = None,
    redis_url: str | None = None,
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Run the bench and return its numbers (also printed to ``out``, default stdout)."""
    out = out if out is not None else sys.stdout
    ways = variants(judges)
    n = sentences if sentences is not None else max(len(PAUSED), len(FINISHED))
    clips = build(
        voices=voices,
        rates=rates,
        pauses_ms=pauses_ms,
        paused=PAUSED[:n],
        finished=FINISHED[:n],
        recording=True,
    )
    paused = sum(c.kind == "paused" for c in clips)
    say(
        out,
        f"bench turns: {len(clips)} clips ({paused} paused mid-sentence, {len(clips) - paused} finished),"
        f" {len(voices)} voices by {len(rates)} rates, each under {len(ways)}"
        f" way{'s' if len(ways) != 1 else ''} of ending a turn,"
        f" {callers} callers at a time, at real time",
    )
    broker = load(BrokerSettings)
    bench = _TurnsBench(
        clips=clips,
        ways=ways,
        callers=callers,
        rabbitmq_url=rabbitmq_url or broker.rabbitmq_url,
        redis_url=redis_url or broker.redis_url,
        out=out,
    )
    played, counters = await bench.run()
    say(out, "  judging the same clips offline: Pipecat's smart-turn v3.2, a fixed 500 ms")
    peers: dict[str, list[Judged] | str] = {
        "Pipecat smart-turn v3.2": await smart_turn(clips),
        "fixed 500 ms (LiveKit)": fixed_silence(clips),
    }
    return report(played, counters, peers, out, ways)


def turns_main(
    callers: int,
    voices: Sequence[str] | None,
    rates: Sequence[int] | None,
    sentences: int | None,
    pauses_ms: Sequence[float] | None = None,
    judges: Sequence[str] | None = None,
) -> int:
    """``bargein bench turns``: run the bench, print the report."""
    return run_main(
        lambda: run_turns_bench(
            callers=callers,
            voices=voices or VOICES,
            rates=rates or RATES,
            sentences=sentences,
            pauses_ms=pauses_ms or PAUSES_MS,
            judges=judges,
        ),
        "turns",
    )
