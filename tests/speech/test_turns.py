"""The turn-taking policy: synthetic probability sequences for the rules, fixtures for accuracy.

What the accuracy tests compare (the issue's ±100 ms acceptance):

* a detected speech **start** is the ``speech_start_ms`` of a ``UserStartedSpeaking`` emission: the
  start of the first voiced window of the burst that led to the barge-in, compared with the mark
  where the fixture script placed the utterance's first sample above sox's trim threshold;
* a detected speech **end** is the ``speech_end_ms`` of a ``UserStoppedSpeaking`` (or
  ``FalseInterruption``) emission: the start of the run of silence that ended the burst, compared
  with the mark where the script placed the utterance's last sample above that threshold.

(The events themselves are decided later by design: the barge-in ``min_interruption_ms`` after the
start, the end of turn ``min_silence_ms`` after the end; ``at_ms`` records that.)
"""

from __future__ import annotations

from typing import Any

import pytest

from bargein.agent.events import FalseInterruption, UserStartedSpeaking, UserStoppedSpeaking
from bargein.settings import SpeechSettings
from bargein.speech.turns import Emission, TurnConfig, TurnPolicy, TurnTakingError
from bargein.speech.vad import VadStream, pcm16_to_float

from . import TOLERANCE_MS, pcm, speech_marks
from .test_vad import windows_of

W = 32.0  # ms per window
HI, LO = 0.9, 0.05


def run(probabilities: list[float], **config: float) -> TurnPolicy:
    policy = TurnPolicy(TurnConfig(**config))
    for p in probabilities:
        policy.feed(p)
    return policy


def kinds(policy: TurnPolicy) -> list[str]:
    return [e.event.type_name() for e in policy.emissions]


def windows(ms: float) -> int:
    return round(ms / W)


# --- the rules ------------------------------------------------------------------------------------


def test_a_blip_shorter_than_min_interruption_emits_nothing() -> None:
    policy = run([LO] * 10 + [HI] * windows(192) + [LO] * 40)
    assert kinds(policy) == []
    assert [b.outcome for b in policy.bursts] == ["ignored"]


def test_barge_in_after_min_interruption_then_stop_after_min_silence() -> None:
    policy = run([LO] * 10 + [HI] * 60 + [LO] * 20)  # speech 320 ms .. 2240 ms
    assert kinds(policy) == ["UserStartedSpeaking", "UserStoppedSpeaking"]
    started, stopped = policy.emissions
    assert started.speech_start_ms == 320 and started.at_ms == 320 + 256  # 8 windows = 256 ms >= 250
    assert stopped.speech_end_ms == 320 + 60 * W
    assert stopped.at_ms == stopped.speech_end_ms + 512  # 16 windows of silence >= 500 ms
    assert not policy.speaking


def test_a_short_burst_without_transcript_is_a_false_interruption() -> None:
    policy = run([LO] * 5 + [HI] * 12 + [LO] * 20)
    assert kinds(policy) == ["UserStartedSpeaking", "FalseInterruption"]
    event = policy.emissions[1].event
    assert isinstance(event, FalseInterruption) and event.duration_ms == 12 * W


@pytest.mark.parametrize("how", ["note", "callback"])
def test_a_short_burst_with_a_transcript_is_a_turn(how: str) -> None:
    policy = TurnPolicy(TurnConfig(), transcript=(lambda: True) if how == "callback" else None)
    for p in [LO] * 5 + [HI] * 12:
        policy.feed(p)
    if how == "note":
        policy.note_transcript()
    for p in [LO] * 20:
        policy.feed(p)
    assert kinds(policy) == ["UserStartedSpeaking", "UserStoppedSpeaking"]


def test_the_transcript_flag_belongs_to_one_burst() -> None:
    policy = TurnPolicy(TurnConfig())
    for p in [HI] * 12:
        policy.feed(p)
    policy.note_transcript()
    for p in [LO] * 20 + [HI] * 12 + [LO] * 20:
        policy.feed(p)
    assert kinds(policy) == [
        "UserStartedSpeaking",
        "UserStoppedSpeaking",
        "UserStartedSpeaking",
        "FalseInterruption",
    ]


def test_a_burst_longer_than_the_timeout_is_a_turn_even_without_transcript() -> None:
    policy = run([HI] * windows(1600) + [LO] * 20)
    assert kinds(policy) == ["UserStartedSpeaking", "UserStoppedSpeaking"]
    off = run([HI] * 12 + [LO] * 20, false_interruption_timeout_ms=0)  # 0 turns the feature off
    assert kinds(off) == ["UserStartedSpeaking", "UserStoppedSpeaking"]


def test_pauses_shorter_than_min_silence_do_not_split_a_turn() -> None:
    pattern = ([HI] * 15 + [LO] * 10) * 3 + [HI] * 15 + [LO] * 20  # 320 ms pauses < 500 ms
    policy = run(pattern)
    assert kinds(policy) == ["UserStartedSpeaking", "UserStoppedSpeaking"]
    assert policy.emissions[1].speech_end_ms == (25 * 3 + 15) * W


def test_voiced_time_accumulates_across_short_pauses() -> None:
    # 5 + 5 voiced windows with a 3-window pause: 320 ms of speech in the burst, a barge-in
    policy = run([HI] * 5 + [LO] * 3 + [HI] * 5 + [LO] * 20)
    assert kinds(policy)[0] == "UserStartedSpeaking"
    assert policy.emissions[0].speech_start_ms == 0 and policy.emissions[0].at_ms == 11 * W


def test_hysteresis_keeps_a_dip_inside_speech() -> None:
    # 0.4 is under the 0.5 threshold but over 0.35 = 0.5 - 0.15: it continues speech, never starts it
    policy = run([0.4] * 20 + [HI] * 10 + [0.4] * 40 + [LO] * 20)
    assert kinds(policy) == ["UserStartedSpeaking", "UserStoppedSpeaking"]
    assert policy.emissions[0].speech_start_ms == 20 * W
    assert policy.emissions[1].speech_end_ms == 70 * W


def test_zero_min_interruption_barges_in_on_the_first_voiced_window() -> None:
    policy = run([LO, LO, HI] + [LO] * 20, min_interruption_ms=0)
    assert policy.emissions[0].at_ms == 3 * W and isinstance(policy.emissions[0].event, UserStartedSpeaking)


def test_would_end_burst_predicts_feed() -> None:
    sequence = [LO] * 5 + [HI] * 50 + [LO] * 8 + [HI] * 3 + [LO] * 20 + [HI] * 4 + [LO] * 30
    policy = TurnPolicy(TurnConfig())
    for p in sequence:
        predicted = policy.would_end_burst(p)
        ended = any(not isinstance(e.event, UserStartedSpeaking) for e in policy.feed(p))
        assert predicted == ended
    assert kinds(policy) == ["UserStartedSpeaking", "UserStoppedSpeaking"]


def test_active_while_speaking() -> None:
    policy = TurnPolicy(TurnConfig())
    for p in [HI] * 10:
        policy.feed(p)
    assert policy.speaking
    for p in [LO] * 20:
        policy.feed(p)
    assert not policy.speaking


# --- per-session overrides ------------------------------------------------------------------------


def test_overrides_apply_with_the_settings_names_and_the_threshold_alias() -> None:
    base = TurnConfig.from_settings(SpeechSettings())
    config = base.with_overrides({"min_silence_ms": 800, "threshold": 0.6})
    assert config.min_silence_ms == 800 and config.speech_threshold == 0.6
    assert config.min_interruption_ms == base.min_interruption_ms
    assert base.with_overrides(None) is base


@pytest.mark.parametrize(
    "overrides, problem",
    [
        ({"min_silence_ms": 10}, "min_silence_ms: Input should be greater than or equal to 32 (got 10)"),
        ({"speech_threshold": 1.5}, "speech_threshold: Input should be less than 1"),
        ({"min_interruption_ms": "soon"}, "min_interruption_ms: Input should be a valid number"),
        (
            {"min_interruption_ms": "300"},
            "min_interruption_ms: Input should be a valid number",
        ),  # numbers only
        ({"min_silence_ms": True}, "min_silence_ms: Input should be a valid number"),
        ({"min_silence_ms": float("nan")}, "min_silence_ms: Input should be a finite number"),
        ({"false_interruption_timeout_ms": float("inf")}, "Input should be a finite number"),
        ({"silence": 500}, "silence: not a setting; a session may set speech_threshold"),
        ({"vad_tick_ms": 4}, "vad_tick_ms: a process setting"),
        ({"threshold": 0.5, "speech_threshold": 0.6}, "given twice"),
        ([500], "must be a mapping"),
    ],
)
def test_bad_overrides_are_named(overrides: Any, problem: str) -> None:
    with pytest.raises(TurnTakingError, match=r"invalid options\.turn_taking|must be a mapping") as info:
        TurnConfig().with_overrides(overrides)
    assert problem in str(info.value)


def test_every_bad_override_is_reported_at_once() -> None:
    with pytest.raises(TurnTakingError) as info:
        TurnConfig().with_overrides({"min_silence_ms": 1, "min_interruption_ms": -5})
    assert "min_silence_ms" in str(info.value) and "min_interruption_ms" in str(info.value)


# --- accuracy on the fixtures ---------------------------------------------------------------------


def detect(name: str, **config: float) -> TurnPolicy:
    stream = VadStream()
    policy = TurnPolicy(TurnConfig(**config))
    for window in windows_of(pcm16_to_float(pcm(name))):
        policy.feed(stream.probability(window))
    return policy


def starts_and_ends(emissions: list[Emission]) -> tuple[list[float], list[float]]:
    starts = [e.speech_start_ms for e in emissions if isinstance(e.event, UserStartedSpeaking)]
    ends = [e.speech_end_ms for e in emissions if e.speech_end_ms is not None]
    return starts, ends


@pytest.mark.parametrize("name", ["one_utterance.wav", "two_utterances.wav"])
def test_detected_speech_starts_and_ends_are_within_100_ms_of_the_marks(name: str) -> None:
    policy = detect(name)
    marks = speech_marks(name)
    assert kinds(policy) == ["UserStartedSpeaking", "UserStoppedSpeaking"] * len(marks)
    starts, ends = starts_and_ends(list(policy.emissions))
    for (mark_start, mark_end), start, end in zip(marks, starts, ends, strict=True):
        assert abs(start - mark_start) <= TOLERANCE_MS, (name, start, mark_start)
        assert end is not None and abs(end - mark_end) <= TOLERANCE_MS, (name, end, mark_end)


def test_the_short_burst_fixture_is_a_false_interruption_at_the_right_place() -> None:
    policy = detect("short_burst.wav")
    assert kinds(policy) == ["UserStartedSpeaking", "FalseInterruption"]
    (mark_start, mark_end) = speech_marks("short_burst.wav")[0]
    started, false = policy.emissions
    assert abs(started.speech_start_ms - mark_start) <= TOLERANCE_MS
    assert false.speech_end_ms is not None and abs(false.speech_end_ms - mark_end) <= TOLERANCE_MS
    assert isinstance(false.event, FalseInterruption)
    assert abs(false.event.duration_ms - (mark_end - mark_start)) <= 2 * TOLERANCE_MS


def test_a_noise_burst_is_not_speech() -> None:
    assert kinds(detect("noise_burst.wav")) == []


def test_a_longer_min_interruption_ignores_the_short_burst() -> None:
    policy = detect("short_burst.wav", min_interruption_ms=600)
    assert kinds(policy) == [] and [b.outcome for b in policy.bursts] == ["ignored"]


def test_stopped_events_are_the_usual_kind() -> None:
    policy = detect("one_utterance.wav")
    assert isinstance(policy.emissions[-1].event, UserStoppedSpeaking)
