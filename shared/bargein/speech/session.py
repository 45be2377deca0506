"""The speech tier's session processor: caller audio in, the user's turn events out.

A :class:`SpeechSession` is what a speech worker runs for each session it owns (through
:class:`~bargein.hosting.host.SessionHost`, with a lease, like the reasoning tier). Its mailbox is bound to
the session's audio (``bargein.audio``, ``<session>.in.#``; bounded, the oldest frames dropped). For
each :class:`~bargein.agent.events.AudioFrame` it:

1. validates the frame (whole PCM16 samples, at most ``max_frame_bytes``); a bad frame becomes a
   :class:`~bargein.agent.events.SessionError` published ``out`` (the edge shows it to the client), is
   counted, and the session carries on with the next frame;
2. re-chunks the audio into 512-sample windows and hands full windows to the process's
   :class:`~bargein.speech.batcher.VadBatcher`;
3. receives the probabilities in window order and feeds them to its
   :class:`~bargein.speech.turns.TurnPolicy`, whose events (``UserStartedSpeaking``, the barge-in, a
   control event the transport publishes at high priority; ``UserStoppedSpeaking``;
   ``FalseInterruption``) it publishes ``in``, stamped ``source="speech"``, its owner epoch and a
   per-session increasing ``seq``.

There is no checkpoint: VAD state is a few hundred milliseconds of context and is worthless to an
adopter, which starts from silence (a burst in progress at the hand-over is detected again from
where the new owner's audio begins).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from bargein import metrics, tracing
from bargein.agent.events import (
    SAMPLE_RATE,
    AgentPlayback,
    AudioFrame,
    EndCall,
    Event,
    SessionError,
    SessionErrorCode,
    SpeculationDropped,
    SpeculativeTurn,
    UserTranscriptionReceived,
)
from bargein.agent.message import Source
from bargein.errors import NotOwner, SettingsError, TranscriberBehind
from bargein.hosting.host import Ownership, ProcessorFactory
from bargein.metrics import Counted
from bargein.settings import BrokerSettings, CoreSettings, SpeechSettings, TranscriptionSettings, load
from bargein.speech.batcher import VadBatcher
from bargein.speech.reading import Reading
from bargein.speech.smart_turn import SmartTurnModel, shared_smart_turn
from bargein.speech.transcriber import (
    NullTranscriber,
    ReadsEndings,
    Transcriber,
    transcriber_from_settings,
)
from bargein.speech.turn_end import Completion, Heard, Verdict
from bargein.speech.turns import TURN_TAKING_OPTION, Emission, State, TurnConfig, TurnPolicy, TurnTakingError
from bargein.speech.vad import WINDOW_BYTES, WINDOW_MS, shared_model
from bargein.tasks import cancel_and_wait
from bargein.transport.abc import Heartbeat, SessionProcessor, Transport
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN, OUT, Direction
from bargein.wire.session_info import SessionInfo

log = logging.getLogger("bargein.speech")

T = TypeVar("T")

PRE_ROLL_WINDOWS = 5  # audio kept from before a burst's first voiced window, for the transcriber
MAX_TURN_WINDOWS = 30 * SAMPLE_RATE // 512  # at most 30 s of a turn's audio is kept per session
FLUSH_TIMEOUT_S = 2.0  # on close, how long queued events may take to publish
LOGGED_BAD_FRAMES = 3  # per session, the first few bad frames are logged; all are counted
REJUDGE_WINDOWS = 5  # a held burst is transcribed again once it has this much more audio (160 ms)
BEHIND_REPORT_S = 10.0  # a session tells its client the engine is behind at most this often
SPECULATE_AHEAD_MS = 100.0  # a speculative turn starts only this far or more ahead of the turn's end


class SpeechSession(SessionProcessor):
    """One session's speech detection in its owner process: validate, re-chunk, batch, decide,
    publish. Events leave through one queue and one publishing task, so they go out in the order the
    policy decided them while neither the mailbox handler nor the batcher ever waits on the broker."""

    def __init__(
        self,
        own: Ownership,
        *,
        settings: SpeechSettings,
        batcher: VadBatcher,
        transcriber: Transcriber | None = None,
        smart_turn: SmartTurnModel | None = None,
    ) -> None:
        self.info: SessionInfo = own.info
        self.session_id = own.info.session_id
        self.transport: Transport = own.transport
        self.epoch = own.epoch
        self.owner = own.owner
        self.on_end = own.on_end
        self.fenced = False
        self.last_activity = time.monotonic()
        self.lease_deadline = math.inf  # set by the host (SessionProcessor)
        self.lease_confirmed_at = math.inf  # set by the host too: until then, no heartbeat is older
        self.liveness: Heartbeat | None = None
        self.settings = settings
        self.batcher = batcher
        self.transcriber: Transcriber = transcriber or NullTranscriber()
        self.smart_turn = smart_turn  # the process's acoustic end-of-turn model, if it loaded one
        self.counters: collections.Counter[str] = Counted("speech")
        self.policy = TurnPolicy(TurnConfig.from_settings(settings))
        self.closed = False
        self._seq = itertools.count()
        self._partial = bytearray()
        self._slot = batcher.register(self.session_id, self._on_probabilities)
        self._probabilities: collections.deque[float] = collections.deque()
        self._busy = False  # a transcription is in flight: the policy waits for it
        self._asked = False  # the transcriber was asked about the current burst
        self._judging = False  # a held burst's words are being transcribed
        # the words of the caller's turn up to its current pause, for the turn-end judge: (pause, task)
        self._pause_words: tuple[int, asyncio.Task[Heard]] | None = None
        self._speculation: tuple[int, str] | None = None  # (pause, words) of a SpeculativeTurn sent
        self._behind_reported = -math.inf
        # turn audio, kept only when a transcriber can use it
        self._keep_audio = not isinstance(self.transcriber, NullTranscriber)
        self.engine = type(self.transcriber).__name__.removesuffix("Transcriber").lower() or "none"
        self._unfed: collections.deque[bytes] = collections.deque()  # windows awaiting their probability
        self._pre_roll: collections.deque[bytes] = collections.deque(maxlen=PRE_ROLL_WINDOWS)
        self._turn_audio: list[bytes] = []
        self._outbox: asyncio.Queue[tuple[Event, Direction]] = asyncio.Queue()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._publisher: asyncio.Task[None] | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        base = TurnConfig.from_settings(self.settings)
        try:
            config = base.with_overrides(self.info.options.get(TURN_TAKING_OPTION))
        except TurnTakingError as exc:
            # the session still works, with the service's settings; the client is told why
            log.warning("session %s: %s; using the service's turn-taking settings", self.session_id, exc)
            self.counters["bad_turn_taking"] += 1
            self._send(SessionError(code=SessionErrorCode.BAD_TURN_TAKING, message=str(exc)), OUT)
            config = base
        if config.turn_detector == "smart-turn" and self.smart_turn is None and self._keep_audio:
            try:  # asked for by this session only: the process loads the model once, now
                self.smart_turn = shared_smart_turn()
            except SettingsError as exc:
                log.warning("session %s: %s; judging turns by their words", self.session_id, exc)
                self._send(SessionError(code=SessionErrorCode.BAD_TURN_TAKING, message=str(exc)), OUT)
                config = dataclasses.replace(config, turn_detector="text")
        self.policy = TurnPolicy(config, judges=self._keep_audio)
        self._publisher = asyncio.create_task(self._publish_loop(), name=f"speech-out:{self.session_id}")
        if config.turn_detector in ("text", "smart-turn") and not self._keep_audio:
            log.warning(
                "session %s: turn_detector %r needs speech-to-text (BARGEIN_STT); "
                "ending turns by silence alone",
                self.session_id,
                config.turn_detector,
            )
        judge = self.policy.judge
        ends = (
            f"by the {judge.name} judge after {config.end_silence_ms:.0f} ms (finished),"
            f" {config.min_silence_ms:.0f} ms (unsure) or {config.max_silence_ms:.0f} ms (unfinished)"
            " of silence"
            if judge.needs_words or judge.needs_audio
            else f"after {config.min_silence_ms:.0f} ms of silence"
        )
        log.info(
            "session %s: speech detection running (epoch %d; threshold %.2f, barge-in after %.0f ms, "
            "turn ends %s, false interruption under %.0f ms)",
            self.session_id,
            self.epoch,
            config.speech_threshold,
            config.min_interruption_ms,
            ends,
            config.false_interruption_timeout_ms,
        )

    async def close(self, *, checkpoint: bool = True) -> None:
        """Stop here. ``checkpoint`` is accepted and ignored: the speech tier keeps no state worth
        restoring (an adopter starts from silence)."""
        if self.closed:
            return
        self.batcher.unregister(self._slot)
        self._settle_speculation(None)  # the next owner hears the caller's turn from the start
        await cancel_and_wait(*self._tasks)
        if not self.fenced and self._publisher is not None:  # what was decided still goes out
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._outbox.join(), FLUSH_TIMEOUT_S)
        self.closed = True
        await cancel_and_wait(self._publisher)
        c = self.counters
        log.info(
            "session %s: speech detection stopped here (%d frames, %d bad, %d windows, %d events published)",
            self.session_id,
            c["frames"],
            c["bad_frames"],
            self.policy.windows,
            c["published"],
        )

    async def checkpoint(self) -> None:
        """Nothing to keep: an adopter starts from silence (see the module docstring)."""

    def hold(self) -> None:
        """Speech detection has no turns of its own to hold: it listens until the session is closed
        (the drain waits for a burst in progress to end, ``active_turns``)."""

    @property
    def active_turns(self) -> int:
        """1 while the user holds the floor (between UserStartedSpeaking and the burst's end), or
        may be about to (a burst held while its words are judged)."""
        return 1 if self.policy.state in (State.SPEAKING, State.HELD) else 0

    @property
    def idle(self) -> bool:
        """Every window sent so far decided, no burst going on and no transcription in flight: what
        this session will publish about the audio so far is in its outbox."""
        return (
            self.policy.state is State.SILENT
            and not self._probabilities
            and not self._busy
            and not self._judging
            and not self._slot.pending
        )

    # --- audio in --------------------------------------------------------------------------------

    def _frame_problem(self, data: bytes) -> tuple[str, str] | None:
        if len(data) > self.settings.max_frame_bytes:
            return SessionErrorCode.FRAME_TOO_LARGE, (
                f"audio frame of {len(data)} bytes exceeds the {self.settings.max_frame_bytes}-byte limit"
            )
        if len(data) % 2:
            return SessionErrorCode.BAD_AUDIO_FRAME, (
                f"audio frame of {len(data)} bytes is not whole 16-bit samples (16 kHz mono PCM16 expected)"
            )
        return None

    async def handle(self, envelope: Envelope, event: Event) -> None:
        """One mailbox message. Returns at once unless this session's windows are piling up in the
        batcher, in which case it waits for room (so excess audio waits in the bounded mailbox,
        where the oldest is dropped, instead of here)."""
        now = self.last_activity = time.monotonic()
        if not self.surely_owned(now):
            self.counters["not_owner"] += 1  # thawed after a pause, say: another process may own it now
            raise NotOwner(f"session {self.session_id}: this process may no longer own it")
        if isinstance(event, EndCall):  # the call is over: stop owning it (the mailbox hears this one)
            self.on_end(self.session_id)
            return
        if isinstance(event, AgentPlayback):  # in order with the audio: what the caller heard as they spoke
            self.policy.agent_speaking = event.speaking
            self.counters["playback"] += 1
            return
        if not isinstance(event, AudioFrame):
            self.counters["ignored"] += 1
            log.debug("session %s: ignoring %s on the audio lane", self.session_id, envelope.type)
            return
        data = event.data
        problem = self._frame_problem(data)
        if problem is not None:
            code, message = problem
            self.counters["bad_frames"] += 1
            if self.counters["bad_frames"] <= LOGGED_BAD_FRAMES:
                log.warning("session %s: %s (seq %d); frame dropped", self.session_id, message, envelope.seq)
            self._send(SessionError(code=code, message=message), OUT)
            return
        self.counters["frames"] += 1
        self.counters["bytes"] += len(data)
        partial = self._partial
        partial.extend(data)
        while len(partial) >= WINDOW_BYTES:
            window = bytes(partial[:WINDOW_BYTES])
            del partial[:WINDOW_BYTES]
            if self._keep_audio:
                self._unfed.append(window)
            self.batcher.submit(self._slot, window)
        await self._slot.wait_for_room()

    # --- probabilities → policy → events --------------------------------------------------------

    def _on_probabilities(self, probabilities: list[float]) -> None:
        """Called by the batcher, in window order."""
        self._probabilities.extend(probabilities)
        if not self._busy:
            self._advance()

    def _advance(self) -> None:
        policy = self.policy
        queue = self._probabilities
        while queue:
            probability = queue[0]
            if self._keep_audio and not self._asked and policy.would_end_burst(probability):
                # the burst ends with this window (or, with the text judge, its words must be known
                # by now): get its transcript before the policy decides
                self._asked = self._busy = True
                self._spawn(self._transcribe(self._words_of_turn()))
                return
            queue.popleft()
            before = policy.state
            emissions = policy.feed(probability)
            if self._keep_audio:
                self._track_audio(before, policy.state)
            self._emit(emissions)
            if policy.state is State.SILENT:
                self._asked = False
            elif policy.state is State.HELD and not self._judging:
                self._judging = True
                self._spawn(self._judge(policy.burst))
            if self._speculation is not None and not (
                policy.paused_in_turn and policy.pause == self._speculation[0]
            ):
                self._settle_speculation(None)  # the caller went on
            pause = policy.pause_needing_words()
            if pause is not None:
                self._listen_to_pause(pause)

    def _listen_to_pause(self, pause: int) -> None:
        """The caller paused in their turn: transcribe it so far (and, for the smart-turn judge,
        ask the acoustic model), so the turn-end judge can tell a finished sentence (end it soon)
        from one that goes on (wait). One such hearing of a session's pauses runs at a time: this
        one starts when the last one is done, unless the caller has spoken on meanwhile (then it is
        not made at all)."""
        self.policy.expect_words(pause)
        audio = b"".join(self._turn_audio)
        before = self._pause_words[1] if self._pause_words is not None else None
        task = self._spawn(self._hear_pause(pause, audio, before))
        task.add_done_callback(functools.partial(self._pause_heard, pause))
        self._pause_words = (pause, task)

    def _pause_heard(self, pause: int, task: asyncio.Task[Heard]) -> None:
        """The words of a pause are known: if the caller may have finished, and the judge has them
        wait a while longer yet, the reasoning owner starts the answer now, held until the turn is
        confirmed (``SpeculativeTurn``). Not on words that read unfinished: those callers go on."""
        policy = self.policy
        if task.cancelled() or self.closed or not policy.config.speculative_turns:
            return
        heard = task.result()
        text = heard.words
        if heard.failed or not text or pause != policy.pause or not policy.paused_in_turn:
            return
        if policy.only_listening(text):  # an "uh-huh" that cut the agent off by timing: no turn
            return
        verdict = policy.judge.judge(heard)
        if verdict.completion is Completion.UNFINISHED:
            return
        if verdict.silence_ms - policy.pause_ms < SPECULATE_AHEAD_MS:
            return  # the turn ends about now anyway
        self._speculation = (pause, text)
        self.counters["speculative_starts"] += 1
        self._send(SpeculativeTurn(transcript=text), IN)

    def _settle_speculation(self, words: str | None) -> None:
        """The caller's turn ends with ``words`` (None: it did not end, they went on): a speculative
        turn on the same words is confirmed by them; otherwise it is dropped, before anything else
        is said."""
        speculation, self._speculation = self._speculation, None
        if speculation is None:
            return
        if words == speculation[1]:
            self.counters["speculative_hits"] += 1
        else:
            self.counters["speculative_drops"] += 1
            self._send(SpeculationDropped(), IN)

    async def _hear_pause(self, pause: int, audio: bytes, before: asyncio.Task[Heard] | None) -> Heard:
        if before is not None:
            await asyncio.wait([before])
        if pause != self.policy.pause:  # the caller went on: a later pause will be heard
            return Heard(failed=True)
        self.counters["pause_transcriptions"] += 1
        if not self.policy.judge.needs_audio or self.smart_turn is None:
            return await self._words(audio)
        heard, complete = await asyncio.gather(self._words(audio), self._complete(audio))
        return dataclasses.replace(heard, complete=complete)

    async def _complete(self, audio: bytes) -> float | None:
        """The acoustic model's probability that the turn whose audio this is is complete."""
        assert self.smart_turn is not None
        try:
            return await self.smart_turn.complete(audio)
        except Exception:
            self.counters["smart_turn_errors"] += 1
            log.exception("session %s: the smart-turn model failed; judging without it", self.session_id)
            return None

    def _words_of_turn(self) -> Awaitable[Heard]:
        """The words of the burst ending now: those already being transcribed for its current pause
        (the audio since is silence), or a transcription of it all."""
        job = self._pause_words
        if job is not None and job[0] == self.policy.pause and not job[1].cancelled():
            return job[1]
        return self._words(b"".join(self._turn_audio))

    def _emit(self, emissions: list[Emission]) -> None:
        for emission in emissions:
            self._announce(emission)
            self._send(emission.event, IN)

    async def _judge(self, burst: int) -> None:
        """Transcribe a held burst so far, and again as it grows, until its words decide it (or it
        ends: then the transcript of the whole burst, in :meth:`_transcribe`, has the last word)."""
        policy = self.policy
        judged = 0
        try:
            while policy.state is State.HELD and policy.burst == burst and not self.closed:
                # judged again once there is more audio, or at once if the burst went quiet since
                # the last judgement: its words up to the quiet may let the agent go on ("uh-huh")
                unjudged = len(self._turn_audio) - judged
                quiet = policy.held_quiet
                if unjudged < REJUDGE_WINDOWS and not (quiet and unjudged > 0):
                    await asyncio.sleep((1 if quiet else REJUDGE_WINDOWS) * WINDOW_MS / 1000)
                    continue
                judged, upto_ms = len(self._turn_audio), policy.at_ms
                heard = await self._words(b"".join(self._turn_audio))
                self.counters["judgements"] += 1
                self._judged(heard.words, heard.failed, burst, upto_ms=upto_ms)
        finally:
            self._judging = False

    def _judged(
        self, text: str | None, failed: bool, burst: int, *, final: bool = False, upto_ms: float | None = None
    ) -> None:
        """Tell the policy what the engine made of held burst ``burst`` (of its audio up to
        ``upto_ms``), and publish its verdict."""
        policy = self.policy
        if failed:
            self._emit(policy.judge_failed(burst))
        else:
            self._emit(policy.judged(text, burst, final=final, upto_ms=upto_ms))

    def _track_audio(self, before: State, after: State) -> None:
        """Keep the current burst's audio (plus a little pre-roll) for the transcriber."""
        window = self._unfed.popleft() if self._unfed else b""
        if before is State.SILENT and after is not State.SILENT:
            self._turn_audio = [*self._pre_roll, window]
        elif after is not State.SILENT and len(self._turn_audio) < MAX_TURN_WINDOWS:
            self._turn_audio.append(window)
        elif after is State.SILENT:
            self._turn_audio = []
            self._pre_roll.append(window)

    async def _transcribe(self, words: Awaitable[Heard]) -> None:
        """The burst ends with the next window: its words first. A held burst is judged by them
        (a barge-in after all, or a backchannel); a turn gets them in its history, unless the
        turn-end judge reads them as unfinished: then the turn goes on, waiting longer."""
        policy = self.policy
        heard = await words
        text, failed = heard.words, heard.failed
        if policy.words_due:
            verdict = policy.pause_words(policy.pause, heard)
            if verdict is not None:
                self.counters[f"turn_end_{verdict.completion.value}"] += 1
                self._announce_verdict(heard, verdict)
            upcoming = self._probabilities[0] if self._probabilities else None
            if upcoming is not None and not policy.would_end_burst(upcoming):
                self._asked = self._busy = False  # not yet: asked again when the longer pause ends
                if not self.closed:
                    self._advance()
                return
        if policy.state is State.HELD:
            self._judged(text, failed, policy.burst, final=True)
        if text and policy.state is State.SPEAKING:
            if policy.only_listening(text):  # "uh-huh" that cut the agent off by timing: resume it
                policy.note_listening(text)
                self.counters["backchannels_after_cut"] += 1
            else:
                self.counters["transcripts"] += 1
                self._settle_speculation(text)
                self._send(UserTranscriptionReceived(content=text), IN)
                policy.note_transcript()
        self._settle_speculation(None)  # the burst ends without those words: no turn of theirs
        self._busy = False
        if not self.closed:
            self._advance()

    async def _words(self, audio: bytes) -> Heard:
        """The engine's words for ``audio`` (with how sure it was that the sentence ends there, if
        it can say: :class:`ReadsEndings`); a failure is logged and counted (``failed``), and never
        loses the turn (the caller decides what happens without words)."""
        self.counters["transcriptions"] += 1
        try:
            started = time.monotonic()
            if isinstance(self.transcriber, ReadsEndings):
                reading = await self.transcriber.read(
                    audio, session_id=self.session_id, sample_rate=SAMPLE_RATE
                )
            else:
                text = await self.transcriber.transcribe(
                    audio, session_id=self.session_id, sample_rate=SAMPLE_RATE
                )
                reading = Reading(text)
            metrics.STT_SECONDS.labels(self.engine).observe(time.monotonic() - started)
        except (TranscriberBehind, TimeoutError) as exc:
            self.counters["stt_behind"] += 1
            log.warning("session %s: speech-to-text is behind (%s); judging by timing", self.session_id, exc)
            now = time.monotonic()
            if now - self._behind_reported >= BEHIND_REPORT_S:
                self._behind_reported = now
                self._send(SessionError(code=SessionErrorCode.STT_BEHIND, message=str(exc)), OUT)
            return Heard(failed=True)
        except Exception:
            self.counters["transcriber_errors"] += 1
            log.exception(
                "session %s: the transcriber failed; the turn goes on without text", self.session_id
            )
            return Heard(failed=True)
        text = reading.text.strip() if reading.text else ""
        return Heard(text or None, ending=reading.ending)

    def _announce_verdict(self, heard: Heard, verdict: Verdict) -> None:
        """Why a turn waits as long as it does. The caller's words themselves only at debug level:
        they may be an account number."""
        ending = "" if heard.ending is None else f", its full stop {heard.ending:.2f} sure"
        count = len(heard.words.split()) if heard.words else 0
        log.info(
            "session %s: the pause's %d word%s read %s%s: the turn ends after %.0f ms of silence",
            self.session_id,
            count,
            "" if count == 1 else "s",
            verdict.completion.value,
            ending,
            verdict.silence_ms,
        )
        log.debug("session %s: the pause's words: %r", self.session_id, heard.words)

    def _announce(self, emission: Emission) -> None:
        end = (
            "" if emission.speech_end_ms is None else f", speech until {emission.speech_end_ms / 1000:.3f} s"
        )
        log.info(
            "session %s: %s at %.3f s of audio (speech from %.3f s%s)",
            self.session_id,
            emission.event.type_name(),
            emission.at_ms / 1000,
            emission.speech_start_ms / 1000,
            end,
        )

    # --- events out ------------------------------------------------------------------------------

    def _send(self, event: Event, direction: Direction) -> None:
        """Queue ``event`` for publishing, in order; nothing once the lease is lost."""
        if self.fenced or self.closed:
            self.counters["dropped_fenced"] += 1
            return
        self._outbox.put_nowait((event, direction))

    async def _publish_loop(self) -> None:
        while True:
            event, direction = await self._outbox.get()
            try:
                if self.fenced:
                    self.counters["dropped_fenced"] += 1
                    continue
                # Output toward the edge carries epoch 0: the edge's TurnFence keeps one epoch per
                # session, the reasoning owner's, and a speech epoch (counted separately, per tier)
                # that happened to be higher would make it drop the agent's answers as stale.
                epoch = self.epoch if direction == IN else 0
                try:
                    # each detected event starts a trace: the turn it starts or cuts off follows it
                    with tracing.span(f"speech {event.type_name()}", session=self.session_id):
                        envelope = Envelope.wrap(
                            self.session_id, event, seq=next(self._seq), epoch=epoch, source=Source.SPEECH
                        )
                        await self.transport.publish(envelope, direction)
                except Exception as exc:  # the broker refused it (an interrupt no mailbox takes, say)
                    self.counters["publish_errors"] += 1
                    log.warning(
                        "session %s: publishing %s failed: %s: %s",
                        self.session_id,
                        envelope.type,
                        type(exc).__name__,
                        exc,
                    )
                else:
                    self.counters["published"] += 1
            finally:
                self._outbox.task_done()

    # --- housekeeping ----------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """A task of this session's: cancelled when it closes."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


class SpeechSessions:
    """The speech tier's :data:`~bargein.hosting.host.ProcessorFactory`: every session it makes shares one
    :class:`VadBatcher` (and so one model and one inference thread)."""

    def __init__(
        self,
        settings: SpeechSettings,
        *,
        batcher: VadBatcher | None = None,
        transcriber: Transcriber | None = None,
        smart_turn: SmartTurnModel | None = None,
    ) -> None:
        self.settings = settings
        self.batcher = batcher or VadBatcher(tick_ms=settings.vad_tick_ms, max_batch=settings.vad_max_batch)
        self.transcriber = transcriber
        self.smart_turn = smart_turn

    def __call__(self, own: Ownership) -> SpeechSession:
        return SpeechSession(
            own,
            settings=self.settings,
            batcher=self.batcher,
            transcriber=self.transcriber,
            smart_turn=self.smart_turn,
        )


def speech_factory(core: CoreSettings, *, transcriber: Transcriber | None = None) -> ProcessorFactory:
    """What ``bargein speech`` runs: load the speech settings (a bad value fails here,
    at start-up, naming the variable), load the model once, build the process's batcher."""
    settings = load(SpeechSettings)
    load(BrokerSettings)  # validated here too, so a bad broker setting fails at start-up
    model = shared_model()  # fail at start-up, not with the first caller, if the model is missing
    batcher = VadBatcher(model, tick_ms=settings.vad_tick_ms, max_batch=settings.vad_max_batch)
    log.info(
        "speech tier: Silero VAD, batches of up to %d sessions every %.1f ms; frames up to %d bytes",
        settings.vad_max_batch,
        settings.vad_tick_ms,
        settings.max_frame_bytes,
    )
    if transcriber is None:
        transcriber = transcriber_from_settings(load(TranscriptionSettings))
    # the acoustic end-of-turn model, when the service's turns are judged by it: a missing model
    # stops the service here, naming the setting
    smart_turn = shared_smart_turn() if settings.turn_detector == "smart-turn" else None
    factory: Callable[[Ownership], SpeechSession] = SpeechSessions(
        settings,
        batcher=batcher,
        transcriber=transcriber,
        smart_turn=smart_turn,  # sessions gone quiet are ended by the host (BARGEIN_SESSION_IDLE_S)
    )
    return factory
