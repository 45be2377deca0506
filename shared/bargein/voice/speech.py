"""What a speech engine returns for one phrase: its audio, and where each word sits in it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import soxr

from bargein.agent.events import SAMPLE_RATE, SAMPLE_WIDTH

_WORD = re.compile(r"\S+")


@dataclass(frozen=True)
class WordTiming:
    """One word of a phrase: its characters in the phrase's text (``text[start:end]``) and the
    sample of the phrase's audio where it begins."""

    start: int
    end: int
    sample: int


@dataclass(frozen=True)
class Speech:
    """A phrase's audio (PCM16 mono at :data:`SAMPLE_RATE`) and its words in order.

    ``estimated`` says the word timings are not the engine's own but spread over the audio by
    the length of each word (an engine that reports none)."""

    pcm: bytes
    words: tuple[WordTiming, ...] = field(default=())
    estimated: bool = False

    @property
    def samples(self) -> int:
        return len(self.pcm) // SAMPLE_WIDTH

    @property
    def duration_s(self) -> float:
        return self.samples / SAMPLE_RATE


def to_pcm16(samples: np.ndarray, rate: int) -> bytes:
    """Mono samples (int16 or float) at ``rate`` as PCM16 at :data:`SAMPLE_RATE`, resampled by soxr."""
    if rate != SAMPLE_RATE:
        samples = soxr.resample(samples, rate, SAMPLE_RATE)
    if samples.dtype != np.int16:
        samples = np.clip(samples, -32768, 32767).astype(np.int16)
    return samples.astype("<i2").tobytes()


def estimate_words(text: str, samples: int) -> tuple[WordTiming, ...]:
    """Word timings for an engine that gives none: the audio shared among the words by their
    length (a space counted with each), which is right to within a word on ordinary speech."""
    words = list(_WORD.finditer(text))
    weights = [len(w.group()) + 1 for w in words]
    total = sum(weights) or 1
    out: list[WordTiming] = []
    at = 0
    for word, weight in zip(words, weights, strict=True):
        out.append(WordTiming(word.start(), word.end(), round(at * samples / total)))
        at += weight
    return tuple(out)


def complete_words(text: str, found: tuple[WordTiming, ...], samples: int) -> tuple[WordTiming, ...]:
    """Every word of ``text`` with a timing, so that every word gets its mark (docs/protocol.md):
    the engine's timings where it gave one, and each word it skipped placed between its timed
    neighbours by length, as :func:`estimate_words` does for a whole phrase. eSpeak NG reports no
    word event for many an unstressed "the" or "a": it says them run into the next word."""
    words = list(_WORD.finditer(text))
    timed = [any(w.start() <= t.start < w.end() for t in found) for w in words]
    if all(timed):
        return found
    anchors = {
        i: next(t.sample for t in found if w.start() <= t.start < w.end())
        for i, w in enumerate(words)
        if timed[i]
    }
    placed: list[WordTiming] = []
    previous: int | None = None  # the last timed word before the run being placed
    i = 0
    while i < len(words):
        if timed[i]:
            previous, i = i, i + 1
            continue
        run_end = i
        while run_end < len(words) and not timed[run_end]:
            run_end += 1
        start = anchors[previous] if previous is not None else 0
        end = anchors[run_end] if run_end < len(words) else samples
        members = ([previous] if previous is not None else []) + list(range(i, run_end))
        weights = [len(words[m].group()) + 1 for m in members]
        total, at = sum(weights), 0
        for member, weight in zip(members, weights, strict=True):
            if member != previous:
                sample = start + round(max(end - start, 0) * at / total)
                placed.append(WordTiming(words[member].start(), words[member].end(), sample))
            at += weight
        i = run_end
    return tuple(sorted((*found, *placed), key=lambda t: (t.start, t.sample)))
