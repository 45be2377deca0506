"""Turn-taking: from one VAD probability per 32 ms window to the user's turn events.

:class:`TurnPolicy` is a pure state machine (no I/O, no clock): it counts windows, so it gives the
same events for the same audio however fast the audio arrives, and tests can drive it with plain
lists of numbers. Times are milliseconds from the start of the session's audio stream.

The rules, with the :class:`~bargein.settings.SpeechSettings` fields (overridable per session):

* A window is *voiced* when its probability is at least ``speech_threshold``; once voiced, windows
  stay voiced down to ``speech_threshold - 0.15`` (Silero's own hysteresis, so a dip mid-word is
  not a pause).
* A *burst* starts at the first voiced window and lasts until ``min_silence_ms`` of unvoiced
  windows; pauses shorter than that are part of the burst. Its end is where that silence began.
  Once a burst is the caller's turn (after :class:`UserStartedSpeaking`) a turn-end judge
  (:mod:`bargein.speech.turn_end`, ``turn_detector``) may say otherwise for each pause: with the
  ``text`` judge the service transcribes the turn as a pause begins (:meth:`TurnPolicy.pause_needing_words`)
  and hands the words over (:meth:`TurnPolicy.pause_words`); a finished sentence then ends the turn
  after ``end_silence_ms``, an unfinished one after ``max_silence_ms``. Until its words are known
  the policy asks for ``end_silence_ms`` (:meth:`would_end_burst`): the service waits for them there.
* :class:`UserStartedSpeaking` (the barge-in) is emitted once a burst holds ``min_interruption_ms``
  of voiced windows; a burst with less (a click, a breath) emits nothing at all.
* While the agent is speaking (:attr:`TurnPolicy.agent_speaking`, from the edge's
  :class:`~bargein.agent.events.AgentPlayback`) and words can be judged (:attr:`TurnPolicy.judges`:
  a speech-to-text engine runs, ``interrupt_words`` > 0), a burst that reaches
  ``min_interruption_ms`` is *held* instead: the service transcribes what it has so far and calls
  :meth:`TurnPolicy.judged`; once the words hold ``interrupt_words`` words that are not
  backchannels, or the burst holds ``max_backchannel_ms`` of voice whatever it said, or the
  engine failed (:meth:`TurnPolicy.judge_failed`), it is a barge-in after all. A held burst that
  ends without that cut nothing off: :class:`UserBackchannel` if it said anything ("uh-huh"),
  nothing at all if not (a cough).
* While the agent is speaking, a burst that holds ``soft_pause_ms`` of voiced windows (before it is
  a barge-in) emits :class:`UserSpeechOnset`: the client edge pauses the agent's audio at once (the
  soft barge-in). If the burst then ends without cutting the agent off, it emits
  :class:`UserOnsetDismissed` (or :class:`UserBackchannel` for words), and the audio resumes; a
  burst still too short to be a barge-in (a click, a cough) lets it go on after
  ``SOFT_RELEASE_MS`` of quiet, without waiting for ``min_silence_ms`` (it pauses it again if the
  voice comes back). So does a held burst once it is that quiet and its words, judged up to its
  quiet, are only backchannels ("uh-huh": :meth:`TurnPolicy.judged` is given how far they reach):
  the agent goes on at once instead of after the burst's end and its last transcription, and the
  words of the rest can still cut it off. A held burst whose words so far are not backchannels
  ("wait, ...") keeps the agent paused through its gaps.
* When a burst that emitted :class:`UserStartedSpeaking` ends, the policy emits
  :class:`UserStoppedSpeaking`, except when the burst lasted at most
  ``false_interruption_timeout_ms`` and no transcript arrived for it: then it emits
  :class:`FalseInterruption` instead, so the reasoning side can resume the answer it cut off (a
  cough, an "mm-hm") rather than start a new turn. Whether a transcript arrived is asked of the
  ``transcript`` callback, or set with :meth:`TurnPolicy.note_transcript`.

Per-session overrides come from the session start's ``options["turn_taking"]``, a dict with the
:class:`SpeechSettings` field names (``threshold`` is accepted for ``speech_threshold``); they are
validated with the same bounds as the environment variables, and every problem is named
(:func:`bargein.settings.check_turn_taking`, which the edge also applies when a session is created).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bargein.agent.events import (
    Event,
    FalseInterruption,
    UserBackchannel,
    UserOnsetDismissed,
    UserSpeechOnset,
    UserStartedSpeaking,
    UserStoppedSpeaking,
)
from bargein.agent.words import content_words, spoken_words, whole_words
from bargein.errors import TurnTakingError
from bargein.settings import (
    TURN_TAKING_FIELDS,
    TURN_TAKING_OPTION,
    SpeechSettings,
    check_turn_taking,
    turn_taking_defaults,
)
from bargein.speech.turn_end import (
    Heard,
    SilenceJudge,
    SmartTurnJudge,
    TextJudge,
    TurnEndJudge,
    Verdict,
    resolve_detector,
)
from bargein.speech.vad import WINDOW_MS

__all__ = ["TURN_TAKING_OPTION", "Emission", "State", "TurnConfig", "TurnPolicy", "TurnTakingError"]

PAUSE_WORDS_AFTER_MS = 64  # a pause this long in the caller's turn has its words judged (not the
# shorter gaps between words, which would cost a transcription each)
SOFT_RELEASE_MS = 160  # a paused burst too short to be a barge-in, quiet this long, lets the agent go on
# Words judged of a held burst speak for all of it once they reach its quiet, or once they are
# backchannels and at most this much of it came after them: too little for another word, and the
# burst's last words may still cut the agent off at its end. Waiting for words that reach the quiet
# cost a second transcription (~0.5 s here) after most backchannels: ~1 s of dead air at p95.
BACKCHANNEL_TAIL_MS = 250
HYSTERESIS = 0.15  # Silero's recommended gap between the onset and the offset threshold
MIN_OFFSET_THRESHOLD = 0.01
HISTORY = 256
_DEFAULTS = turn_taking_defaults()  # the SpeechSettings defaults: one source for both


@dataclass(frozen=True)
class TurnConfig:
    """What the policy runs on: the per-session turn-taking settings."""

    speech_threshold: float = _DEFAULTS["speech_threshold"]
    min_interruption_ms: float = _DEFAULTS["min_interruption_ms"]
    min_silence_ms: float = _DEFAULTS["min_silence_ms"]
    turn_detector: str = _DEFAULTS["turn_detector"]
    end_silence_ms: float = _DEFAULTS["end_silence_ms"]
    max_silence_ms: float = _DEFAULTS["max_silence_ms"]
    speculative_turns: bool = _DEFAULTS["speculative_turns"]
    false_interruption_timeout_ms: float = _DEFAULTS["false_interruption_timeout_ms"]
    interrupt_words: int = _DEFAULTS["interrupt_words"]
    max_backchannel_ms: float = _DEFAULTS["max_backchannel_ms"]
    backchannels: tuple[str, ...] = _DEFAULTS["backchannels"]
    soft_pause_ms: float = _DEFAULTS["soft_pause_ms"]

    @property
    def offset_threshold(self) -> float:
        return max(self.speech_threshold - HYSTERESIS, MIN_OFFSET_THRESHOLD)

    def turn_end_judge(self, *, words: bool) -> TurnEndJudge:
        """The judge of how long a pause ends the caller's turn (``words``: speech-to-text runs)."""
        detector = resolve_detector(self.turn_detector, words=words)
        if detector == "silence":
            return SilenceJudge(self.min_silence_ms)
        judge = SmartTurnJudge if detector == "smart-turn" else TextJudge
        return judge(
            end_silence_ms=self.end_silence_ms,
            min_silence_ms=self.min_silence_ms,
            max_silence_ms=self.max_silence_ms,
        )

    @classmethod
    def from_settings(cls, settings: SpeechSettings) -> TurnConfig:
        return cls(**{name: getattr(settings, name) for name in TURN_TAKING_FIELDS})

    def with_overrides(self, overrides: Any) -> TurnConfig:
        """This config with a session's ``turn_taking`` options applied; :class:`TurnTakingError`
        naming each bad field (unknown names included) otherwise."""
        values = check_turn_taking(overrides)
        return dataclasses.replace(self, **values) if values else self


class State(enum.Enum):
    SILENT = "silent"  # no burst
    PENDING = "pending"  # a burst too short so far to be a barge-in
    HELD = "held"  # long enough, but the agent is speaking: its words decide
    SPEAKING = "speaking"  # UserStartedSpeaking was emitted for this burst


@dataclass(frozen=True)
class Emission:
    """One event the policy emitted, with where it sits in the audio (ms from stream start).

    ``at_ms`` is the end of the window that decided it. ``speech_start_ms`` is where its burst's
    first voiced window began; ``speech_end_ms`` (stop and false interruption only) is where the
    silence that ended the burst began.
    """

    event: Event
    at_ms: float
    speech_start_ms: float
    speech_end_ms: float | None = None


@dataclass(frozen=True)
class Burst:
    """A finished burst, emitted or not (for tests and logs)."""

    start_ms: float
    end_ms: float
    voiced_ms: float
    outcome: str  # "ignored" (too short), "stopped", "false_interruption", "backchannel" or "noise"


@dataclass
class TurnPolicy:
    """Feed it :meth:`feed` one probability per window, in order; it returns what to publish."""

    config: TurnConfig = field(default_factory=TurnConfig)
    transcript: Callable[[], bool] | None = None
    window_ms: float = WINDOW_MS
    judges: bool = False  # words can be judged (a speech-to-text engine runs)
    agent_speaking: bool = False  # the agent's voice reaches the caller now

    state: State = State.SILENT
    windows: int = 0
    # the latest emissions and bursts, for tests and logs (bounded: a call can last hours)
    emissions: collections.deque[Emission] = field(default_factory=lambda: collections.deque(maxlen=HISTORY))
    bursts: collections.deque[Burst] = field(default_factory=lambda: collections.deque(maxlen=HISTORY))
    _voiced: bool = False
    _burst_start_ms: float = 0.0
    _voiced_ms: float = 0.0
    _silence_start_ms: float | None = None
    _transcribed: bool = False
    burst: int = 0  # numbers the bursts, so a judgement that comes back late applies to its own
    _heard: str | None = None  # the latest words judged of a held burst
    _heard_upto_ms: float = -1.0  # ... of its audio up to then
    _cut_agent: bool = False  # this burst's UserStartedSpeaking came while the agent spoke
    _paused: bool = False  # this burst emitted UserSpeechOnset (the agent's audio is paused)
    judge: TurnEndJudge = field(init=False)
    pause: int = 0  # numbers the pauses, so words that come back late apply to their own
    _pause_silence_ms: float | None = None  # the silence that ends the turn in this pause, by its words
    _words_due: bool = False  # the service is getting this pause's words

    def __post_init__(self) -> None:
        self.judge = self.config.turn_end_judge(words=self.judges)

    @property
    def speaking(self) -> bool:
        """True from UserStartedSpeaking until the burst ends: the user holds the floor."""
        return self.state is State.SPEAKING

    def note_transcript(self) -> None:
        """A transcript arrived for the current burst: when it ends it is a turn, never a false
        interruption."""
        self._transcribed = True

    def only_listening(self, text: str | None) -> bool:
        """Whether the burst, ending now with the words ``text``, cut the agent off for nothing:
        it barged in while the agent spoke (by timing: no words were judged, or judging is off),
        it was short, and said only backchannels. It then ends as a :class:`FalseInterruption`
        carrying ``text`` (the agent may resume), and ``text`` is no turn of the caller's."""
        speech_end = self._silence_start_ms if self._silence_start_ms is not None else self.at_ms
        return (
            self.state is State.SPEAKING
            and self._cut_agent
            and speech_end - self._burst_start_ms <= self.config.false_interruption_timeout_ms
            and not content_words(text, self.config.backchannels)
        )

    def note_listening(self, text: str | None) -> None:
        """The burst's words, when :meth:`only_listening`: its false interruption carries them."""
        self._heard = text

    def _is_voiced(self, probability: float) -> bool:
        threshold = self.config.offset_threshold if self._voiced else self.config.speech_threshold
        return probability >= threshold

    def would_end_burst(self, probability: float) -> bool:
        """Whether feeding ``probability`` next would end a burst that emitted UserStartedSpeaking.
        The service asks this to get a transcript for the burst before the policy decides."""
        if self.state not in (State.SPEAKING, State.HELD) or self._is_voiced(probability):
            return False
        start = (
            self._silence_start_ms if self._silence_start_ms is not None else self.windows * self.window_ms
        )
        return (self.windows + 1) * self.window_ms - start >= self._ending_silence_ms()

    def _ending_silence_ms(self) -> float:
        """How long the current pause must last to end the burst."""
        if self.state is not State.SPEAKING:
            return self.config.min_silence_ms  # a burst that is no turn (yet) is not judged by words
        if self._pause_silence_ms is not None:
            return self._pause_silence_ms
        return self.judge.soonest_ms if self._words_due else self.judge.judge(Heard()).silence_ms

    def pause_needing_words(self) -> int | None:
        """The current pause of the caller's turn, if its words would say how long it must last and
        nobody has asked for them yet: the service then transcribes the turn so far and says that
        it has (:meth:`expect_words`)."""
        if (
            self.state is State.SPEAKING
            and (self.judge.needs_words or self.judge.needs_audio)
            and self._silence_start_ms is not None
            and self.at_ms - self._silence_start_ms >= PAUSE_WORDS_AFTER_MS
            and not self._words_due
            and self._pause_silence_ms is None
        ):
            return self.pause
        return None

    def expect_words(self, pause: int) -> None:
        """The words of pause ``pause`` are coming: the turn may end as soon as ``end_silence_ms``,
        and :meth:`would_end_burst` says when the service must have them."""
        if pause == self.pause:
            self._words_due = True

    @property
    def words_due(self) -> bool:
        return self._words_due

    @property
    def paused_in_turn(self) -> bool:
        """The caller holds the floor and is silent: a pause that may end their turn."""
        return self.state is State.SPEAKING and self._silence_start_ms is not None

    @property
    def pause_ms(self) -> float:
        """How long the current pause has lasted so far (0 while voiced)."""
        return 0.0 if self._silence_start_ms is None else self.at_ms - self._silence_start_ms

    def pause_words(self, pause: int, heard: Heard) -> Verdict | None:
        """What was heard of the caller's turn up to pause ``pause`` (its words, the acoustic
        model's probability). Returns the judge's verdict on this pause, or None for a pause the
        caller already ended by speaking on."""
        if pause != self.pause or self._silence_start_ms is None or self.state is not State.SPEAKING:
            return None
        self._words_due = False
        verdict = self.judge.judge(heard)
        self._pause_silence_ms = verdict.silence_ms
        return verdict

    def feed(self, probability: float) -> list[Emission]:
        """One window's probability → the events it causes (usually none)."""
        start_ms = self.windows * self.window_ms
        self.windows += 1
        end_ms = self.windows * self.window_ms
        voiced = self._is_voiced(probability)
        self._voiced = voiced
        out: list[Emission] = []
        if self.state is State.SILENT:
            if not voiced:
                return out
            self.state = State.PENDING
            self._burst_start_ms = start_ms
            self._voiced_ms = 0.0
            self._silence_start_ms = None
            self._transcribed = False
            self._heard = None
            self._heard_upto_ms = -1.0
            self._cut_agent = False
            self._paused = False
            self.burst += 1
        if voiced:
            self._voiced_ms += self.window_ms
            self._silence_start_ms = None
            if self._pauses():
                self._paused = True
                out.append(self._emit(UserSpeechOnset(), end_ms))
            if self.state is State.PENDING and self._voiced_ms >= self.config.min_interruption_ms:
                if self.holds():
                    self.state = State.HELD
                else:
                    self.state = State.SPEAKING
                    self._cut_agent = self.agent_speaking
                    out.append(self._emit(UserStartedSpeaking(), end_ms))
            elif self.state is State.HELD and self._voiced_ms >= self.config.max_backchannel_ms:
                out.append(self._barge(end_ms, self._heard))  # too long to be "uh-huh"
            return out
        if self._silence_start_ms is None:  # a pause begins: the judge has not heard it yet
            self._silence_start_ms = start_ms
            self.pause += 1
            self._pause_silence_ms = None
            self._words_due = False
        released = self._released(end_ms)  # the agent goes on without waiting for the burst's end
        if released is not None:
            out.append(self._release(released, end_ms))
        if end_ms - self._silence_start_ms >= self._ending_silence_ms():
            out.extend(self._end_burst(end_ms, self._silence_start_ms))
        return out

    def _pauses(self) -> bool:
        """Whether this window makes the burst pause the agent (the soft barge-in)."""
        return (
            not self._paused
            and self.agent_speaking
            and self.config.soft_pause_ms > 0
            and self.state in (State.PENDING, State.HELD)
            and self._voiced_ms >= self.config.soft_pause_ms
        )

    def _released(self, end_ms: float) -> str | None:
        """Whether a burst that paused the agent has been quiet long enough (``SOFT_RELEASE_MS``)
        to let the agent go on, and why: ``short``, still too short to be a barge-in (a click, a
        cough); ``backchannel``, held, and its words judged so far, which speak for it
        (:meth:`_heard_speaks_for`), are only backchannels ("uh-huh"). If the voice comes back the
        agent is paused again; if the burst's words at its end are more, they cut it off then."""
        if not self._paused or self._silence_start_ms is None:
            return None
        if end_ms - self._silence_start_ms < SOFT_RELEASE_MS:
            return None
        if self.state is State.PENDING:
            return "short"
        if (
            self.state is State.HELD
            and self._heard_speaks_for(self._silence_start_ms)
            and not content_words(self._heard, self.config.backchannels)
        ):
            return "backchannel"
        return None

    def _heard_speaks_for(self, quiet_ms: float) -> bool:
        """Whether the words judged so far tell what the burst that went quiet at ``quiet_ms`` was:
        they reach the quiet, or they are words (backchannels, by the caller's check) and less than
        ``BACKCHANNEL_TAIL_MS`` of the burst came after them."""
        if self._heard_upto_ms >= quiet_ms:
            return True
        return bool(spoken_words(self._heard)) and quiet_ms - self._heard_upto_ms <= BACKCHANNEL_TAIL_MS

    def _release(self, outcome: str, end_ms: float) -> Emission:
        self._paused = False
        return self._emit(UserOnsetDismissed(outcome=outcome), end_ms, self._silence_start_ms)

    @property
    def held_quiet(self) -> bool:
        """A held burst that paused the agent has gone quiet and waits for words that reach the
        quiet (the service transcribes it again at once, not when more audio has come)."""
        return (
            self._paused
            and self.state is State.HELD
            and self._silence_start_ms is not None
            and self._heard_upto_ms < self._silence_start_ms
        )

    def holds(self) -> bool:
        """Whether a burst reaching ``min_interruption_ms`` now waits for its words."""
        return self.judges and self.agent_speaking and self.config.interrupt_words > 0

    @property
    def at_ms(self) -> float:
        """The end of the last window fed."""
        return self.windows * self.window_ms

    def judged(
        self, text: str | None, burst: int, *, final: bool = False, upto_ms: float | None = None
    ) -> list[Emission]:
        """The words of held burst ``burst`` so far (``final``: of all of it, as it ends; ``upto_ms``:
        of its audio up to then, by default up to now; a last word cut off mid-way, "Bo-la-", counts
        only in the final reading: :func:`~bargein.agent.words.whole_words`). A barge-in once they hold
        ``interrupt_words`` words besides backchannels; otherwise the burst stays held, and if it
        has gone quiet and they reach the quiet, the agent goes on (:meth:`_released`). At its
        end, if the agent has stopped speaking meanwhile, any words are the caller's turn (a "yes"
        that answers the question the agent was finishing)."""
        if burst != self.burst or self.state is not State.HELD:
            return []  # a late answer about a burst already decided
        if not final and whole_words(text) != text:
            # a word the audio so far ends in the middle of is judged once a later reading has it
            # whole; till then these words do not speak for the audio up to now (no release either)
            text, upto_ms = whole_words(text), self._heard_upto_ms
        self._heard = text
        self._heard_upto_ms = self.at_ms if upto_ms is None else upto_ms
        answers = final and not self.agent_speaking and bool(spoken_words(text))
        if answers or len(content_words(text, self.config.backchannels)) >= self.config.interrupt_words:
            self._transcribed = True  # words, so a turn however short, never a false interruption
            return [self._barge(self.at_ms, text)]
        released = self._released(self.at_ms)
        return [self._release(released, self.at_ms)] if released is not None else []

    def judge_failed(self, burst: int) -> list[Emission]:
        """The engine could not say (it failed, timed out, or is behind): judge by timing, as if
        there were no speech-to-text, rather than let a real interruption go unheard."""
        if burst != self.burst or self.state is not State.HELD:
            return []
        return [self._barge(self.at_ms, None)]

    def _barge(self, at_ms: float, transcript: str | None) -> Emission:
        self.state = State.SPEAKING
        self._cut_agent = True
        return self._emit(UserStartedSpeaking(transcript=transcript), at_ms)

    def _end_burst(self, at_ms: float, speech_end_ms: float) -> list[Emission]:
        duration = speech_end_ms - self._burst_start_ms
        was, self.state = self.state, State.SILENT
        self._silence_start_ms = None
        if was is State.PENDING:
            self.bursts.append(Burst(self._burst_start_ms, speech_end_ms, self._voiced_ms, "ignored"))
            return (
                [self._emit(UserOnsetDismissed(outcome="short"), at_ms, speech_end_ms)]
                if self._paused
                else []
            )
        if was is State.HELD:  # never a barge-in: the agent went on talking
            said = spoken_words(self._heard)
            outcome = "backchannel" if said else "noise"
            self.bursts.append(Burst(self._burst_start_ms, speech_end_ms, self._voiced_ms, outcome))
            if not said:
                return [self._emit(UserOnsetDismissed(), at_ms, speech_end_ms)] if self._paused else []
            return [self._emit(UserBackchannel(content=(self._heard or "").strip()), at_ms, speech_end_ms)]
        transcribed = self._transcribed or (self.transcript is not None and self.transcript())
        if duration <= self.config.false_interruption_timeout_ms and not transcribed:
            self.bursts.append(
                Burst(self._burst_start_ms, speech_end_ms, self._voiced_ms, "false_interruption")
            )
            heard = self._heard if self._cut_agent else None
            return [
                self._emit(FalseInterruption(duration_ms=duration, transcript=heard), at_ms, speech_end_ms)
            ]
        self.bursts.append(Burst(self._burst_start_ms, speech_end_ms, self._voiced_ms, "stopped"))
        return [self._emit(UserStoppedSpeaking(), at_ms, speech_end_ms)]

    def _emit(self, event: Event, at_ms: float, speech_end_ms: float | None = None) -> Emission:
        emission = Emission(event, at_ms, self._burst_start_ms, speech_end_ms)
        self.emissions.append(emission)
        return emission
