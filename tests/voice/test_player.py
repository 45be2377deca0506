"""The player's clock: audio paced at real time with a lead, marks after each word, what the
caller heard by the clock, a pause that resumes with nothing lost or repeated, and a clear."""

from __future__ import annotations

import numpy as np

from bargein.agent.events import SAMPLE_RATE, SAMPLE_WIDTH
from bargein.voice.phrases import TurnText
from bargein.voice.player import FRAME_SAMPLES, Audio, Done, Heard, Mark, Output, Player
from bargein.voice.speech import Speech, estimate_words

WORD_S = 0.25  # each word of the fake speech lasts a quarter of a second


def speech_for(text: str) -> Speech:
    """Distinct samples (a ramp), so a lost or repeated frame shows; words spread by their length
    (the tests use words of three letters: a quarter of a second each)."""
    samples = int(len(text.split()) * WORD_S * SAMPLE_RATE)
    pcm = (np.arange(samples) % 30_000).astype("<i2").tobytes()
    return Speech(pcm, estimate_words(text, samples))


def turn_with(turn: int, *chunks: str) -> tuple[TurnText, Player]:
    text = TurnText(turn)
    for seq, chunk in enumerate(chunks):
        text.add(seq, chunk)
    text.complete = True
    player = Player(lead_ms=200)
    for phrase in text.phrases():
        player.add(text, phrase, speech_for(phrase.text))
    return text, player


def run(player: Player, start: float, end: float, step: float = 0.02) -> list[Output]:
    out: list[Output] = []
    t = start
    while t <= end + 1e-9:
        out += player.tick(t)
        t += step
    return out


def audio(out: list[Output]) -> bytes:
    return b"".join(o.pcm for o in out if isinstance(o, Audio))


def test_audio_goes_out_at_real_time_a_lead_ahead_of_what_has_played() -> None:
    _, player = turn_with(1, "one two six ten")  # one second of audio
    first = player.tick(0.0)
    assert len(audio(first)) // SAMPLE_WIDTH == 10 * FRAME_SAMPLES  # the 200 ms lead at once
    later = run(player, 0.02, 0.5)
    assert player.sent - player.played <= player.lead + FRAME_SAMPLES
    assert abs(player.sent / SAMPLE_RATE - 0.7) < 0.03  # half a second played, 200 ms ahead
    assert audio(later)


def test_the_clock_says_what_was_heard_to_the_word_and_marks_follow_each_words_audio() -> None:
    _, player = turn_with(4, "one two", " six ten")
    out = run(player, 0.0, 0.6)
    heard = [o for o in out if isinstance(o, Heard)]
    assert heard[-1] == Heard(4, 0, 7)  # two words (0.5 s) played: all of chunk 0, none of chunk 1
    marks = [o for o in out if isinstance(o, Mark)]
    assert [m.word for m in marks] == ["one", "two", "six"]  # sent 200 ms ahead: "six" too
    assert player.mark_position(4, marks[0].mark) == (0, 3)
    assert player.mark_position(4, marks[2].mark) == (1, 4)  # " six"
    out = run(player, 0.62, 1.5)
    assert [o for o in out if isinstance(o, Heard)][-1] == Heard(4, 1, len(" six ten"))
    assert Done(4) not in out  # finish() was not called: the turn may go on
    assert player.finish(4) == [Done(4)]


def test_done_comes_when_the_last_of_a_finished_turn_has_played() -> None:
    _, player = turn_with(2, "one two six ten")
    player.tick(0.0)
    assert player.finish(2) == []
    out = run(player, 0.02, 0.9)
    assert Done(2) not in out
    assert Done(2) in run(player, 0.92, 1.1)


def test_a_pause_stops_the_audio_and_a_resume_goes_on_with_nothing_lost_or_repeated() -> None:
    _, player = turn_with(1, "one two six ten red tan")
    whole = player._clips[0].pcm
    out = run(player, 0.0, 0.4)
    paused = player.pause(0.42)
    assert not [o for o in paused if isinstance(o, Audio)]  # nothing is sent after the pause
    out += paused
    played_at_pause = player.played
    during = run(player, 0.44, 2.0)
    assert not audio(during) and player.played == played_at_pause  # silent, clock frozen
    player.resume(2.0)
    out += run(player, 2.0, 4.0)
    assert audio(out) == whole


def test_a_clear_stops_the_turn_and_the_next_turn_plays_from_where_the_caller_is() -> None:
    text, player = turn_with(1, "one two six ten red tan")
    run(player, 0.0, 0.5)
    heard = player.clear(1, 0.52)
    assert heard == [Heard(1, 0, 7)]  # "one two", 0.5 s; and no audio: nothing is sent after a clear
    assert player.sent == int(player.played)  # what was sent ahead is gone with the client's buffer
    after = run(player, 0.54, 2.0)
    assert not [o for o in after if isinstance(o, Audio | Mark | Heard) and o.turn == 1]
    next_text = TurnText(2)
    next_text.add(0, "big dog")
    next_text.complete = True
    (phrase,) = next_text.phrases()
    player.add(next_text, phrase, speech_for(phrase.text))
    player.add(text, phrase, speech_for(phrase.text))  # a late phrase of the cleared turn: dropped
    more = run(player, 2.02, 3.0)
    assert {o.turn for o in more if isinstance(o, Audio)} == {2}
    assert len(audio(more)) == len(speech_for("big dog").pcm)


def test_a_rewind_sends_again_what_the_client_threw_away_and_its_marks() -> None:
    """A phone carrier cannot pause, only clear: the player rewinds to what was played, and the
    caller then hears every sample once, in order (a phrase boundary falls inside the lead too)."""
    text = TurnText(1)
    text.add(0, "one two. ")
    text.add(1, "six ten red tan")
    text.complete = True
    player = Player(lead_ms=200)
    for phrase in text.phrases():
        player.add(text, phrase, speech_for(phrase.text))
    whole = b"".join(c.pcm for c in player._clips)
    out = run(player, 0.0, 0.42)  # "one two." is all sent by now, but not all played
    marks_before = [o.word for o in out if isinstance(o, Mark)]
    paused = player.pause(0.44)
    player.rewind(0.44)
    played = int(player.played)
    assert player.sent == played  # the client's buffer is gone: nothing is ahead of the caller
    player.resume(1.0)
    after = run(player, 1.0, 4.0)
    # what the caller heard: up to where it was, then everything again from there, once
    heard_pcm = audio(out)[: played * SAMPLE_WIDTH] + audio(after)
    assert heard_pcm == whole
    assert not [o for o in paused if isinstance(o, Audio)]
    marks_after = [o.word for o in after if isinstance(o, Mark)]
    assert marks_before[-1] in marks_after  # the mark sent ahead was thrown away: sent again
    assert [w for w in marks_after if w][-1] == "tan"  # (a phrase's own mark has no word)
