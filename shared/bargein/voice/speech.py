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
