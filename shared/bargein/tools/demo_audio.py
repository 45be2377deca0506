"""A fixture WAV through speech detection, in one process: what plain ``bargein demo`` can run.

The caller is a WAV file, streamed at real time in 20 ms frames onto the audio lane of the
in-process transport. A real speech session (:class:`bargein.speech.session.SpeechSession`,
Silero VAD through the process's :class:`~bargein.speech.batcher.VadBatcher`, the real turn
policy) owns the session's audio under its own lease, exactly as a speech worker would, and
publishes the user's turn events; the agent runs in the real session runtime
(:class:`~bargein.testing.LocalSession`, which also plays the client edge: fence, delivery
reports). Nothing is simulated: only the broker is the in-memory one.

The agent's answers are spoken as the edge speaks them (``BARGEIN_TTS``, eSpeak NG by default) and
played at real time into the caller's ear; what the caller heard is what was played, to the word,
and the whole conversation is saved as a WAV (``bargein-demo.wav`` in the working directory: the
caller left, the agent right), where the cut is audible.

It prints the same timeline as ``bargein call`` (:class:`~bargein.tools.call.CallTimeline`): the user's
speech starting and stopping (heard on an edge queue, as the broadcast service hears them), the
agent's answer streaming, the barge-in with the time from the barge-in audio to the turn's
interrupt reaching the edge, and finally the history the model sees next (the interrupted answer
cut to what was delivered).

Speech-to-text runs as the speech service would run it (``BARGEIN_STT``; by default the bundled
Whisper model when ``bargein[stt]`` is installed, as ``make install`` does): the caller's words are
printed as they are heard and reach the agent's history, and a burst over the agent's answer is
judged by its words before it cuts the answer off.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TextIO

from bargein.agent.events import (
    SAMPLE_RATE,
    AgentError,
    AgentGenerationComplete,
    AgentResponse,
    AudioFrame,
    Event,
    FalseInterruption,
    UserBackchannel,
    UserOnsetDismissed,
    UserSpeechOnset,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.message import Source
from bargein.agent.nodes import ReasoningNode
from bargein.hosting.host import SessionHost
from bargein.hosting.loader import load_agent
from bargein.runtime.agents import Agent
from bargein.settings import (
    CoreSettings,
    LLMSettings,
    SpeechSettings,
    TranscriptionSettings,
    VoiceSettings,
    load,
)
from bargein.speech.batcher import VadBatcher
from bargein.speech.session import SpeechSessions
from bargein.speech.transcriber import engine_name, transcriber_from_settings
from bargein.speech.vad import shared_model
from bargein.tasks import cancel_and_wait
from bargein.testing import LocalSession
from bargein.tools.call import (
    FRAME_BYTES,
    FRAME_MS,
    CallError,
    CallTimeline,
    SpeechRuns,
    describe_clear,
    frames_of,
    read_wav,
)
from bargein.tools.earpiece import Earpiece
from bargein.tools.timeline import TimelineLogHandler
from bargein.transport.memory import MemoryTransport
from bargein.voice.engines import synthesizer_from_settings
from bargein.voice.speaker import Voice
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN, TIER_SPEECH

DEFAULT_WAV = Path(str(resources.files("bargein") / "data" / "barge_in.wav"))  # made by make fixtures
LISTEN_AFTER_S = 1.5  # after the WAV: quiet this long with no answer streaming ends the demo
MAX_AFTER_S = 30.0  # ... and this ends it whatever is going on
DEMO_WORDS_PER_S = "10"  # scripted replies of 30-40 words last 3-4 s: the barge-in lands inside one


class _EdgeSession(LocalSession):
    """A :class:`LocalSession` that says when the edge moves its fence (the in-process ``clear``)."""

    def __init__(
        self,
        agent: Agent,
        *,
        on_interrupt: Callable[[int], None],
        session_id: str,
        voice: Voice | None = None,
        ear: Earpiece | None = None,
    ) -> None:
        # as the edge does: it tells the speech tier when the agent speaks, and speaks it
        super().__init__(agent, session_id=session_id, report_playback=True, voice=voice, loudspeaker=ear)
        self._on_interrupt = on_interrupt

    async def receive(self, envelope: Envelope, event: Event) -> None:
        before = len(self.interrupted_turns)
        await super().receive(envelope, event)
        if len(self.interrupted_turns) > before:
            self._on_interrupt(self.interrupted_turns[-1])


class _AudioDemo:
    def __init__(self, tl: CallTimeline, ear: Earpiece | None = None) -> None:
        self.tl = tl
        self.ear = ear
        self.session: LocalSession | None = None
        self.runs = SpeechRuns()
        self.detected_at: float | None = None
        self.streaming: int | None = None
        self.chunks: dict[int, int] = {}
        self.last_activity = time.monotonic()

    def on_interrupt(self, turn: int) -> None:
        now = time.monotonic()
        if self.streaming is not None and self.streaming <= turn:
            self.streaming = None
        text, fields = describe_clear(
            turn, now, onset=self.runs.onset(now), text_sent_at=None, detected_at=self.detected_at
        )
        fields["chunks_before"] = self.chunks.get(turn, 0)
        self.tl.entry("clear", "edge", text, **fields)
        self.last_activity = now

    async def on_caller_event(self, envelope: Envelope, event: Event) -> None:
        """The edge queue: the speech tier's turn events for the session (and its output, ignored
        here: :class:`LocalSession` consumes that)."""
        session = self.session
        if isinstance(event, UserSpeechOnset) and session is not None:
            if await session.soft_pause():
                onset = self.runs.onset(time.monotonic())
                after = (
                    ""
                    if onset is None
                    else f" {(time.monotonic() - onset) * 1000:.0f} ms after the barge-in audio"
                )
                self.tl.entry("pause", "edge", f"⏸ the agent's voice paused{after}")
            return
        verdict = UserOnsetDismissed | UserBackchannel | UserStoppedSpeaking | FalseInterruption
        if isinstance(event, verdict) and session is not None and session.soft_resume():
            self.tl.entry("resume", "edge", "▶ it was not a barge-in: the agent's voice goes on")
        if isinstance(event, UserStartedSpeaking):
            self.detected_at = time.monotonic()
            self.tl.entry("user_started_speaking", "user", "▸ starts speaking")
            if session is not None and UserStartedSpeaking.type_name() in session.policy:
                await session.barge_in()  # the voice of an answer already written stops too
        elif isinstance(event, UserStoppedSpeaking):
            self.tl.entry("user_stopped_speaking", "user", "▸ stops speaking")
        elif isinstance(event, UserTranscriptionReceived) and envelope.source == Source.SPEECH:
            self.tl.transcript(event.content)
        elif isinstance(event, UserBackchannel):
            self.tl.transcript(event.content, backchannel=True)
        else:
            return
        self.last_activity = time.monotonic()

    async def consume(self, session: LocalSession) -> None:
        while True:
            try:
                envelope, event = await session.next_envelope(timeout=3600)
            except TimeoutError:
                continue
            self.last_activity = time.monotonic()
            if isinstance(event, AgentResponse):
                self.streaming = envelope.turn
                self.chunks[envelope.turn] = self.chunks.get(envelope.turn, 0) + 1
                self.tl.chunk(envelope.turn, envelope.seq, event.content)
            elif isinstance(event, AgentGenerationComplete):
                if self.streaming == envelope.turn:
                    self.streaming = None
                self.tl.entry(
                    "turn_complete", "agent", f"▪ turn {envelope.turn} complete", turn=envelope.turn
                )
            elif isinstance(event, AgentError):
                self.streaming = None
                self.tl.entry("error", "agent", f"✗ the turn failed: {event.message}", message=event.message)

    async def stream(self, transport: MemoryTransport, session_id: str, pcm: bytes) -> None:
        """The WAV at real time, then silence until the conversation is quiet (a phone line)."""
        seq = 0
        start = time.monotonic()

        async def send(frame: bytes) -> None:
            nonlocal seq
            await asyncio.sleep(max(0.0, start + seq * FRAME_MS / 1000 - time.monotonic()))
            self.runs.sent(frame, time.monotonic())
            if self.ear is not None:
                self.ear.said(frame, time.monotonic())
            await transport.publish(
                Envelope.wrap(session_id, AudioFrame(data=frame), seq=seq, source="user"), IN
            )
            seq += 1

        for frame in frames_of(pcm):
            await send(frame)
        seconds = len(pcm) / 2 / SAMPLE_RATE
        self.tl.entry("audio_done", "user", f"(all {seconds:.2f} s of audio sent)", seconds=round(seconds, 3))
        done_at = self.last_activity = time.monotonic()
        silence = bytes(FRAME_BYTES)
        while time.monotonic() - done_at < MAX_AFTER_S:
            quiet = time.monotonic() - self.last_activity >= LISTEN_AFTER_S
            speaking = self.session is not None and self.session.agent_audible
            if self.streaming is None and quiet and not speaking:
                return
            await send(silence)


async def run_audio_demo(
    wav: Path | None = None,
    agent_spec: str | None = None,
    *,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    json_lines: bool = False,
    show_history: bool = True,
    save_audio: Path | None = None,
) -> int:
    """Feed ``wav`` (default: the two-utterance fixture) through in-process speech detection into
    the agent ``agent_spec`` (default ``BARGEIN_AGENT``); the exit code. With ``save_audio`` the
    agent is heard (``BARGEIN_TTS``) and the conversation saved there as a WAV."""
    core = load(CoreSettings)
    load(LLMSettings)
    speech_settings = load(SpeechSettings)
    try:
        pcm = read_wav(wav or DEFAULT_WAV)
    except CallError as exc:
        print(f"bargein demo: {exc}", file=err)
        return exc.exit_code
    spec = agent_spec or core.agent
    agent = load_agent(spec)
    t0 = time.monotonic()
    tl = CallTimeline(out, json_lines=json_lines, t0=t0)
    synthesizer = synthesizer_from_settings(load(VoiceSettings)) if save_audio is not None else None
    ear = Earpiece(t0) if synthesizer is not None else None
    voice = Voice(synthesizer, name="demo-audio") if synthesizer is not None else None
    demo = _AudioDemo(tl, ear)
    if not json_lines:  # the agent's and the runtime's log lines, folded in (the interrupt handler)
        handler = TimelineLogHandler(tl.timeline)
        for name in ("agent", "bargein.runtime"):
            logger = logging.getLogger(name)
            logger.addHandler(handler)
            logger.setLevel(logging.INFO)
            logger.propagate = False
    batcher = VadBatcher(
        shared_model(), tick_ms=speech_settings.vad_tick_ms, max_batch=speech_settings.vad_max_batch
    )
    stt = load(TranscriptionSettings)
    transcriber = transcriber_from_settings(stt)
    async with _EdgeSession(
        agent, on_interrupt=demo.on_interrupt, session_id="demo-audio", voice=voice, ear=ear
    ) as session:
        demo.session = session
        transport = MemoryTransport(session.broker)
        speech = SessionHost(
            transport,
            session.store,
            SpeechSessions(speech_settings, batcher=batcher, transcriber=transcriber),
            owner="local-speech",
            tier=TIER_SPEECH,
        )
        tap = await transport.open_edge_queue("demo-edge", demo.on_caller_event)
        consumer = asyncio.create_task(demo.consume(session), name="demo-consume")
        try:
            await tap.add_session(session.session_id)
            await speech.open(session.info)
            tl.entry(
                "session",
                "system",
                f"session {session.session_id} in process: speech detection (Silero VAD), "
                f"speech-to-text: {engine_name(stt)} → agent {spec}",
                session_id=session.session_id,
            )
            await demo.stream(transport, session.session_id, pcm)
        finally:
            await cancel_and_wait(consumer)
            await speech.close_all()
            await tap.cancel()
            await batcher.close()
        if ear is not None and save_audio is not None:
            ear.advance(time.monotonic())
            seconds = ear.save(save_audio)
            tl.entry(
                "audio_saved",
                "system",
                f"the call as the caller heard it ({seconds:.1f} s; caller left, agent right): {save_audio}",
                path=str(save_audio),
                seconds=round(seconds, 2),
            )
        if show_history:
            tl.entry("note", "system", "the history the model sees on the next turn:", message="history")
            for node in session.nodes:
                if isinstance(node, ReasoningNode):
                    for msg in node.history_messages():
                        role, content = msg["role"], msg["content"]
                        tl.entry("history", "", f"  {role:>9}: {content}", role=role, content=content)
    tl.close()
    return 0


DEMO_AUDIO = Path("bargein-demo.wav")  # in the working directory


def main(
    wav: Path | None = None,
    agent_spec: str | None = None,
    *,
    json_lines: bool = False,
    save_audio: Path | None = DEMO_AUDIO,
) -> int:
    """``bargein demo`` on the audio path. With the scripted LLM the agent's words are paced at
    ``DEMO_WORDS_PER_S`` unless ``BARGEIN_SCRIPTED_TOKENS_PER_S`` says otherwise, so the fixture's
    second utterance lands while the answer is still streaming."""
    if not os.environ.get("BARGEIN_LLM_BASE_URL"):
        os.environ.setdefault("BARGEIN_SCRIPTED_TOKENS_PER_S", DEMO_WORDS_PER_S)
    try:
        return asyncio.run(run_audio_demo(wav, agent_spec, json_lines=json_lines, save_audio=save_audio))
    except KeyboardInterrupt:
        return 130
