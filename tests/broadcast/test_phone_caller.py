"""The bench's phone caller reads a carrier's clears as a web caller's frames: a clear the same
turn's marks follow was the soft barge-in's pause (its resume the first audio after it); one a
later turn follows, or nothing, was a cut. ``bench e2e`` counts false cuts and dead air from it."""

from __future__ import annotations

from typing import Any, cast

from bargein.tools.audio_caller import Received
from bargein.tools.phone_caller import PhoneCaller


def mark(at: float, turn: int, n: int) -> Received:
    return Received(at, {"type": "audio_mark", "turn": turn, "mark": n})


def audio(at: float) -> Received:
    return Received(at, None, bytes(640))


def clear(at: float) -> Received:
    return Received(at, {"type": "clear"})


def caller(*record: Received) -> PhoneCaller:
    phone = PhoneCaller(cast(Any, None))
    phone.received = list(record)
    return phone


def times(phone: PhoneCaller, kind: str, after: float = 0.0) -> list[float]:
    return [r.at for r in phone.frames(kind, after)]


def test_a_clear_the_same_turn_goes_on_after_is_a_pause_and_its_resume_the_first_audio() -> None:
    phone = caller(audio(1.0), mark(1.1, 3, 0), clear(2.0), audio(2.6), mark(2.7, 3, 1), audio(2.8))
    assert times(phone, "pause") == [2.0]
    assert times(phone, "resume") == [2.6]
    assert times(phone, "clear") == []


def test_a_clear_a_later_turn_follows_or_nothing_is_a_cut() -> None:
    phone = caller(audio(1.0), mark(1.1, 3, 0), clear(2.0), audio(3.5), mark(3.6, 4, 0), clear(5.0))
    assert times(phone, "clear") == [2.0, 5.0]
    assert times(phone, "pause") == [] and times(phone, "resume") == []
    assert times(phone, "clear", after=4.0) == [5.0]


def test_other_frames_are_read_as_they_came() -> None:
    phone = caller(audio(1.0), mark(1.1, 3, 0), mark(1.5, 3, 1))
    assert times(phone, "audio_mark") == [1.1, 1.5]
