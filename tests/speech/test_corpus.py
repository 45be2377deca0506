"""The barge-in corpus as a test: real interruptions spoken over the agent cut it off, and
backchannels and noises do not, through a speech session with the real VAD and the bundled Whisper
model, at the pace of real time (``bargein bench bargein-decisions`` runs the whole corpus and
prints the figures; this runs one voice of it, with thresholds generous enough for a noisy CI box)."""

from __future__ import annotations

import pytest

from bargein.settings import SpeechSettings, load
from bargein.speech.transcriber import NullTranscriber
from bargein.speech.whisper import WhisperTranscriber
from bargein.tools import corpus
from bargein.tools.bench_decisions import decide_all, score

MIN_RECALL = 0.85  # the bench's targets are 95 % and 90 %
MIN_REJECTION = 0.75


@pytest.fixture(scope="module")
def clips() -> list[corpus.Clip]:
    return corpus.build(voices=("en-us",), rates=(170,))


async def test_interruptions_cut_the_agent_off_and_backchannels_and_noises_do_not(
    clips: list[corpus.Clip],
) -> None:
    decisions = await decide_all(clips, WhisperTranscriber(), settings=load(SpeechSettings), concurrency=2)
    scores = score(decisions)
    wrong = [(d.clip.name, d.transcript) for d in decisions if d.interrupted != d.clip.should_interrupt]
    assert scores.recall >= MIN_RECALL, wrong
    assert scores.rejection >= MIN_REJECTION, wrong
    noises = [d for d in decisions if d.clip.kind == "noise"]
    assert noises and not any(d.interrupted for d in noises), wrong
    cut = [d for d in decisions if d.interrupted and d.clip.should_interrupt]
    assert all(d.delay_ms is not None and d.delay_ms > 0 for d in cut)


async def test_without_words_every_burst_over_the_agent_cuts_it_off(clips: list[corpus.Clip]) -> None:
    """The baseline the words improve on: the same backchannels, judged by timing alone."""
    backchannels = [c for c in clips if c.kind == "backchannel"][:6]
    decisions = await decide_all(backchannels, NullTranscriber(), realtime=False)
    assert sum(d.interrupted for d in decisions) >= 5


async def test_uh_huh_is_heard_as_uh_huh_not_as_no() -> None:
    """ "Uh-uh" means no and is not a backchannel (issue 28); unprimed, the tiny model heard
    eSpeak NG's "Uh-huh." as "Uh-uh." in 3 of these 4 clips and cut the agent off. The engine's
    prompt (BARGEIN_STT_PROMPT) spells it for the model: none of them cuts it now."""
    clips = corpus.build(
        voices=("en-us", "en-gb"), rates=(140, 190), interruptions=(), backchannels=("Uh-huh.",), noises=0
    )
    decisions = await decide_all(clips, WhisperTranscriber(), settings=load(SpeechSettings), concurrency=2)
    cut = [(d.clip.name, d.transcript) for d in decisions if d.interrupted]
    assert len(cut) <= 1, cut  # one spare for a noisy machine
