"""``bargein bench e2e``: callers who talk over the agent's voice, end to end through the real services.

The bench runs a stack of its own on the configured broker and Redis (``bargein reasoning``,
``bargein speech``, ``bargein broadcast``; the default agent on its scripted model) and
``--callers`` simulated callers at once (:class:`~bargein.tools.audio_caller.AudioCaller`), each in
a session of its own, hearing the agent (``audio=pcm16``) and streaming a microphone at real time.
The callers' words are spoken by eSpeak NG (the embedded engine, a British voice against the
agent's American one). Each of ``--rounds`` rounds:

1. the caller asks a question; measured: the end of its speech → the agent's first audio at the
   caller (the turn latency, which includes the ``min_silence_ms`` that ends a turn);
2. a second into the answer the caller says a backchannel ("uh-huh", "okay", ...); counted: a
   *false cut* if the agent's voice is cleared for it (target 0 per 100 with the soft barge-in),
   whether it paused and resumed, and the *dead air* it cost: the end of the caller's backchannel →
   the agent's voice resuming (``resume``; targets p50 ≤ 300 ms, p95 ≤ 500 ms). The agent is silent
   while the caller speaks too; that part is the caller's turn at talking, not dead air;
3. a second later the caller interrupts ("wait, stop ..."); measured: the caller's speech onset →
   the agent's audio stopped at the caller (the ``pause`` of the soft barge-in or the ``clear``,
   whichever came first; target p50 ≤ 120 ms), and the turn latency of the answer to it.

It also times each engine from synthesis request to audio: eSpeak NG here, and an OpenAI-compatible
server when ``BARGEIN_TTS_BASE_URL`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import secrets
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import httpx

from bargein.agent.events import SAMPLE_RATE, SAMPLE_WIDTH
from bargein.agent.words import content_words
from bargein.edge.tokens import Tokens
from bargein.settings import DEFAULT_BACKCHANNELS, BrokerSettings, VoiceSettings, load
from bargein.tools.audio_caller import AudioCaller, Said
from bargein.tools.benchkit import (
    Child,
    Processes,
    all_or_stalled,
    forget_sessions,
    percentile,
    run_main,
    say,
    scripted_stack_env,
    start_service,
    summarize,
    verdict,
)
from bargein.tools.call import ONSET_DBFS, frame_dbfs
from bargein.tools.phone_caller import PhoneCaller
from bargein.voice.engines import Synthesizer
from bargein.voice.espeak import EspeakSynthesizer
from bargein.voice.openai_tts import OpenAISynthesizer

CALLER_VOICE = "en"  # the callers speak British English; the agent American
QUESTIONS = (
    "What is the weather like this weekend?",
    "Can you tell me something about the ocean?",
    "What should I cook for dinner tonight?",
)
BACKCHANNELS = ("Uh-huh.", "Okay.", "Yeah.", "Mm-hmm.", "Right.")
INTERRUPTIONS = (
    "Wait, stop, tell me about tomorrow instead.",
    "Sorry, can you repeat the first part please?",
    "Hold on, that is not what I asked about.",
)
STOP_TARGET_MS = 120.0
PHONE_GAP_TARGET_MS = 150.0  # the phone's turn latency over the web's (p50), same agent and questions
WEB, PHONE = "web", "phone"
LINES = (WEB, PHONE)
DEAD_AIR_TARGETS_MS = (300.0, 500.0)  # p50, p95: the end of a backchannel → the agent's voice again
ROUND_TIMEOUT_S = 30.0
LISTEN_BEFORE_S = 1.0  # of the agent's voice before the caller says something over it
VERDICT_WAIT_S = 3.0  # a backchannel that has not cut the agent off by then did not


@dataclass
class Utterance:
    pcm: bytes
    onset_s: float  # where the speech begins in ``pcm`` (the engine's first word)


@dataclass
class Round:
    turn_latency_s: list[float] = field(default_factory=list)
    stop_s: float | None = None  # interrupt onset → the agent's audio stopped at the caller
    false_cut: bool = False
    backchannel_paused: bool = False
    backchannel_resumed: bool = False
    dead_air_s: float | None = None  # the backchannel's end → the agent's voice resumed
    backchannel: str = ""  # what was said
    heard: str | None = None  # what speech-to-text made of it (a user_transcript frame), if anything


ONSET_BLOCK = SAMPLE_RATE // 100 * SAMPLE_WIDTH  # 10 ms


async def utterance(engine: Synthesizer, text: str) -> Utterance:
    """``text`` in the callers' voice; its onset is where it first gets loud (-40 dBFS), as a
    listener would hear the caller begin."""
    speech = await engine.synthesize(text, voice=CALLER_VOICE)
    blocks = range(0, len(speech.pcm), ONSET_BLOCK)
    first = next((i for i in blocks if frame_dbfs(speech.pcm[i : i + ONSET_BLOCK]) >= ONSET_DBFS), 0)
    return Utterance(speech.pcm, first / SAMPLE_WIDTH / SAMPLE_RATE)


def _stopped_at(caller: AudioCaller, after: float) -> float | None:
    """When the agent's voice stopped at the caller after ``after``: a pause or clear frame."""
    stops = [
        r.at
        for r in caller.received
        if r.frame and r.frame.get("type") in ("pause", "clear") and r.at > after
    ]
    return min(stops) if stops else None


async def _first_audio_after(caller: AudioCaller, at: float) -> float:
    async with asyncio.timeout(ROUND_TIMEOUT_S):
        while True:
            audio = [r.at for r in caller.received if r.frame is None and r.at > at]
            if audio:
                return audio[0]
            await asyncio.sleep(0.01)


async def _spoken(said: Said) -> float:
    async with asyncio.timeout(ROUND_TIMEOUT_S):
        while said.ended is None:  # noqa: ASYNC110 - the sender fills it in
            await asyncio.sleep(0.01)
    return said.ended


async def _quiet(caller: AudioCaller, for_s: float = 0.5) -> None:
    """Until the agent's voice has been silent at the caller for ``for_s``."""
    async with asyncio.timeout(ROUND_TIMEOUT_S):
        while True:
            silent = caller.silent_since()
            if silent is not None and time.monotonic() - silent >= for_s:
                return
            await asyncio.sleep(0.05)


class _E2EBench:
    def __init__(
        self,
        *,
        callers: int,
        rounds: int,
        soft_pause_ms: float | None,
        lines: tuple[str, ...],
        rabbitmq_url: str,
        redis_url: str,
        out: TextIO,
    ) -> None:
        self.n_callers = callers
        self.soft_pause_ms = soft_pause_ms
        self.n_rounds = rounds
        self.lines = lines
        self.rabbitmq_url = rabbitmq_url
        self.redis_url = redis_url
        self.out = out
        self.processes = Processes(out)
        self.twilio_token = secrets.token_hex(16)  # the simulated carrier's, for this run only
        edge_secret = secrets.token_hex(16)  # the edge's, so that the bench may listen to a call
        self.tokens = Tokens(edge_secret, 3600)
        self.env = scripted_stack_env(
            rabbitmq_url,
            redis_url,
            BARGEIN_TTS="espeak",
            BARGEIN_TWILIO_AUTH_TOKEN=self.twilio_token,
            BARGEIN_EDGE_SECRET=edge_secret,
        )
        self.edge: Child | None = None
        self.session_ids: list[str] = []
        self.voice = EspeakSynthesizer(CALLER_VOICE)

    @contextlib.asynccontextmanager
    async def _caller(self, line: str, client: httpx.AsyncClient) -> AsyncIterator[AudioCaller]:
        """A caller in a session of its own: a web client, or a phone call through the carrier."""
        assert self.edge is not None
        if line == PHONE:
            listener = functools.partial(self.tokens.issue, role="listener")
            async with PhoneCaller.dialled(self.edge.url, self.twilio_token, listener) as phone:
                self.session_ids.append(phone.session_id)
                yield phone
            return
        body = {} if self.soft_pause_ms is None else {"turn_taking": {"soft_pause_ms": self.soft_pause_ms}}
        created = (await client.post(f"{self.edge.url}/v1/sessions", json=body)).json()
        self.session_ids.append(created["session_id"])
        async with AudioCaller.joined(created["ws_url"], created["token"]) as web:
            yield web

    async def one_caller(self, index: int, line: str, client: httpx.AsyncClient) -> list[Round]:
        rng = random.Random(index)  # caller i asks the same questions on either line
        rounds: list[Round] = []
        async with self._caller(line, client) as caller:
            await asyncio.sleep(1.0)  # the speech tier owns the session and hears silence first
            for i in range(self.n_rounds):
                result = Round()
                question = await utterance(self.voice, rng.choice(QUESTIONS))
                ended = await _spoken(caller.say(question.pcm))
                result.turn_latency_s.append(await _first_audio_after(caller, ended) - ended)
                await caller.wait_audio(LISTEN_BEFORE_S, after=ended, timeout=ROUND_TIMEOUT_S)
                mark = time.monotonic()
                result.backchannel = rng.choice(BACKCHANNELS)
                backchannel = await utterance(self.voice, result.backchannel)
                said = caller.say(backchannel.pcm)
                spoken_end = await _spoken(said)
                await asyncio.sleep(VERDICT_WAIT_S)
                result.false_cut = bool(caller.frames("clear", after=mark))
                result.backchannel_paused = bool(caller.frames("pause", after=mark))
                resumes = caller.frames("resume", after=mark)
                result.backchannel_resumed = bool(resumes)
                if resumes and not result.false_cut:
                    result.dead_air_s = max(0.0, resumes[-1].at - spoken_end)
                transcripts = caller.frames("user_transcript", after=mark)
                result.heard = (
                    transcripts[0].frame.get("text") if transcripts and transcripts[0].frame else None
                )
                if not result.false_cut:
                    interruption = await utterance(self.voice, rng.choice(INTERRUPTIONS))
                    said = caller.say(interruption.pcm)
                    ended = await _spoken(said)
                    onset = said.started + interruption.onset_s
                    stopped = _stopped_at(caller, said.started)
                    if stopped is not None:
                        result.stop_s = stopped - onset
                    result.turn_latency_s.append(await _first_audio_after(caller, ended) - ended)
                # let the answer play out before the next round
                await _quiet(caller)
                rounds.append(result)
                self.say(f"  {line} caller {index + 1} round {i + 1}: {self._line(result)}")
        return rounds

    @staticmethod
    def _line(r: Round) -> str:
        stop = "—" if r.stop_s is None else f"{r.stop_s * 1000:.0f} ms"
        latency = ", ".join(f"{s * 1000:.0f}" for s in r.turn_latency_s)
        bc = "false cut" if r.false_cut else ("paused, resumed" if r.backchannel_resumed else "left alone")
        if r.dead_air_s is not None:
            bc += f" ({r.dead_air_s * 1000:.0f} ms of dead air after it)"
        bc = f"{r.backchannel!r} (heard {r.heard!r}) {bc}"
        return f"answers after {latency} ms; backchannel {bc}; barge-in silent after {stop}"

    async def engines(self) -> dict[str, Any]:
        """Synthesis request → audio, per engine (a phrase of the agent's length)."""
        phrase = "Good question! Today looks mostly sunny with a light breeze from the west."
        out: dict[str, Any] = {}
        engines: list[tuple[str, Synthesizer]] = [("espeak", EspeakSynthesizer())]
        settings = load(VoiceSettings)
        if settings.tts_base_url:
            engines.append(("openai", OpenAISynthesizer(settings.tts_base_url, api_key=settings.tts_api_key)))
        for name, engine in engines:
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                speech = await engine.synthesize(phrase)
                times.append(time.perf_counter() - t0)
            await engine.aclose()
            out[name] = {**summarize(times), "audio_s": round(speech.duration_s, 2)}
        if "openai" not in out:
            out["openai"] = "not measured: set BARGEIN_TTS_BASE_URL to an OpenAI-compatible speech server"
        return out

    def say(self, text: str) -> None:
        say(self.out, text)

    async def run(self) -> dict[str, Any]:
        pause = "the default" if self.soft_pause_ms is None else f"{self.soft_pause_ms:g} ms"
        self.say(
            f"bench e2e: {self.n_callers} callers on each of {' and '.join(self.lines)},"
            f" {self.n_rounds} rounds each, over the agent's voice (soft pause after {pause} of voice"
            + (", the phone's the default" if self.soft_pause_ms is not None and PHONE in self.lines else "")
            + ")"
        )
        try:
            await start_service(self.processes, "reasoning", "reasoning", self.env)
            await start_service(self.processes, "speech", "speech", self.env)
            self.edge = await start_service(self.processes, "broadcast", "edge", self.env)
            per_line: dict[str, list[Round]] = {}
            async with httpx.AsyncClient(timeout=ROUND_TIMEOUT_S) as client:
                for line in self.lines:  # one line after the other: the same load on each
                    per_caller = await all_or_stalled(
                        self.processes,
                        (self.one_caller(i, line, client) for i in range(self.n_callers)),
                        f"a round did not finish in {ROUND_TIMEOUT_S:.0f} s",
                    )
                    per_line[line] = [r for caller in per_caller for r in caller]
            engines = await self.engines()
            return self.report(per_line, engines)
        finally:
            await self.processes.stop()
            await forget_sessions(self.rabbitmq_url, self.redis_url, self.session_ids, self.out)

    def report(self, per_line: dict[str, list[Round]], engines: dict[str, Any]) -> dict[str, Any]:
        numbers = {}
        for line, rounds in per_line.items():
            self.say("")
            self.say(f"  {line} callers ({len(rounds)} rounds):")
            numbers[line] = self.measure(rounds)
        result: dict[str, Any] = {**numbers[self.lines[0]], "lines": numbers, "engines": engines}
        if WEB in numbers and PHONE in numbers:
            gap = numbers[PHONE]["turn_latency"]["p50_ms"] - numbers[WEB]["turn_latency"]["p50_ms"]
            result["phone_minus_web_ms"] = gap
            self.say("")
            self.say(
                f"  the phone's turn latency over the web's (p50): {gap:+.0f} ms"
                f" (target ≤ {PHONE_GAP_TARGET_MS:.0f} ms: {verdict(gap <= PHONE_GAP_TARGET_MS)})"
            )
        for name, engine in engines.items():
            if isinstance(engine, dict):
                self.say(
                    f"  {name}: synthesis request → audio p50 {engine['p50_ms']:.1f} ms"
                    f" for {engine['audio_s']} s of speech"
                )
            else:
                self.say(f"  {name}: {engine}")
        return result

    def measure(self, rounds: list[Round]) -> dict[str, Any]:
        """One line's numbers, printed as they are read."""
        stops = sorted(r.stop_s for r in rounds if r.stop_s is not None)
        latencies = [s for r in rounds for s in r.turn_latency_s]
        false_cuts = sum(r.false_cut for r in rounds)
        # a cut the words explain: speech-to-text heard more than a backchannel (its mistake, not
        # the soft barge-in's: the pause itself never cuts anything off)
        misheard = [r for r in rounds if r.false_cut and content_words(r.heard, DEFAULT_BACKCHANNELS)]
        per_100 = 100 * false_cuts / max(len(rounds), 1)
        stop = summarize(stops) if stops else None
        met = stop is not None and stop["p50_ms"] <= STOP_TARGET_MS
        resumed = sum(r.backchannel_resumed for r in rounds)
        dead_air = sorted(r.dead_air_s * 1000 for r in rounds if r.dead_air_s is not None)
        turn = summarize(latencies)
        lines = []
        if stop is not None:
            p95 = percentile(sorted(s * 1000 for s in stops), 95)
            lines.append(
                f"  caller's speech onset → agent's audio stopped: p50 {stop['p50_ms']:.0f} ms,"
                f" p95 {p95:.0f} ms (target p50 ≤ {STOP_TARGET_MS:.0f} ms: {verdict(met)})"
            )
        lines += [
            f"  end of the caller's speech → first agent audio: p50 {turn['p50_ms']:.0f} ms,"
            f" p95 {percentile(sorted(s * 1000 for s in latencies), 95):.0f} ms",
            f"  false cuts: {false_cuts} of {len(rounds)} backchannels ({per_100:.0f} per 100;"
            f" target 0: {verdict(false_cuts == 0)}); {len(misheard)} of them where speech-to-text"
            f" heard words: {sorted({f'{r.backchannel!r} as {r.heard!r}' for r in misheard})}",
            f"  backchannels that paused the agent and resumed it: {resumed}",
        ]
        dead = None
        if dead_air:
            dead = {"p50_ms": percentile(dead_air, 50), "p95_ms": percentile(dead_air, 95)}
            p50_target, p95_target = DEAD_AIR_TARGETS_MS
            dead_met = dead["p50_ms"] <= p50_target and dead["p95_ms"] <= p95_target
            lines.append(
                f"  dead air after a backchannel (its end → the agent's voice again): p50"
                f" {dead['p50_ms']:.0f} ms, p95 {dead['p95_ms']:.0f} ms (targets ≤ {p50_target:.0f}"
                f" / ≤ {p95_target:.0f} ms: {verdict(dead_met)})"
            )
        for line in lines:
            self.say(line)
        return {
            "rounds": len(rounds),
            "stop": stop,
            "stop_target_met": met,
            "turn_latency": turn,
            "false_cuts": false_cuts,
            "false_cuts_per_100": per_100,
            "false_cuts_misheard": len(misheard),
            "resumed": resumed,
            "dead_air": dead,
        }


async def run_e2e_bench(
    callers: int = 2,
    rounds: int = 5,
    soft_pause_ms: float | None = None,
    lines: tuple[str, ...] = LINES,
    rabbitmq_url: str | None = None,
    redis_url: str | None = None,
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Run the bench and return its numbers (also printed to ``out``, default stdout)."""
    if callers < 1 or rounds < 1:
        raise ValueError("callers and rounds must be at least 1")
    if not lines or set(lines) - set(LINES):
        raise ValueError(f"lines must be some of {', '.join(LINES)}")
    broker = load(BrokerSettings)
    bench = _E2EBench(
        callers=callers,
        rounds=rounds,
        soft_pause_ms=soft_pause_ms,
        lines=lines,
        rabbitmq_url=rabbitmq_url or broker.rabbitmq_url,
        redis_url=redis_url or broker.redis_url,
        out=out if out is not None else sys.stdout,
    )
    return await bench.run()


def e2e_main(
    callers: int = 2, rounds: int = 5, soft_pause_ms: float | None = None, lines: tuple[str, ...] = LINES
) -> int:
    """``bargein bench e2e``: run the bench, print the report."""
    return run_main(lambda: run_e2e_bench(callers, rounds, soft_pause_ms, lines), "e2e")
