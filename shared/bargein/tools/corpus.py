"""The barge-in corpus: what callers say and do while the agent speaks, made on this machine.

Three kinds of clip, each a caller's microphone while the agent talks:

* ``interruption``: the caller takes the floor ("Wait, stop.", "Okay, but wait a second."); it must
  cut the agent off;
* ``backchannel``: the caller only shows they listen ("Uh-huh.", "Got it."); it must not;
* ``noise``: a cough, a knock, a breath; it must not either.

Speech is espeak-ng in several voices and rates (:mod:`bargein.tools.synth`); noises are shaped
noise bursts. Under everything runs a faint echo of the agent's own voice and a noise floor, as a
phone microphone picks up. Clips are deterministic (fixed seed, espeak-ng and sox without dither),
so two runs judge the same audio. ``bargein bench bargein-decisions`` and the corpus test use it.
"""

from __future__ import annotations

import functools
import itertools
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

import numpy as np

from bargein.tools.synth import RATE, noise_burst, synthesize, to_pcm16

Kind = Literal["interruption", "backchannel", "noise"]

INTERRUPTIONS = (
    "Wait, stop.",
    "No, that is not what I asked.",
    "Hold on a second.",
    "Sorry, can you repeat that?",
    "Actually, I want to change my order.",
    "Stop.",
    "Excuse me.",
    "What do you mean?",
    "No, no, no.",
    "Can I ask something?",
    "Okay, but wait a second.",
    "Yeah, but that is wrong.",
)
BACKCHANNELS = (
    "Uh-huh.",
    "Yeah.",
    "Okay.",
    "Mm-hmm.",
    "Right.",
    "Yes.",
    "Sure.",
    "Got it.",
    "I see.",
    "Okay, okay.",
    "Yeah, yeah.",
    "Alright.",
)
# (name, length ms, smoothing in samples, decay): a cough is dull and decays, a knock is sharp and short
NOISES = (
    ("cough", 260.0, 16, 4.0),
    ("double cough", 0.0, 16, 4.0),
    ("knock", 90.0, 3, 9.0),
    ("breath", 420.0, 96, 1.5),
    ("thump", 180.0, 48, 6.0),
)
VOICES = ("en-us", "en-gb", "en-us+f3")
RATES = (140, 190)
AGENT_LINE = (
    "The forecast for this weekend is mostly sunny, with a light breeze from the west and "
    "temperatures around twenty degrees, so it is a good time for a walk in the park."
)
LEAD_MS = 700.0  # the agent talking before the caller does anything
TAIL_MS = 1100.0  # after it: more than the silence that ends a burst
ECHO_GAIN = 0.003  # the agent's voice left in the caller's microphone after echo cancellation, about -50 dB
FLOOR_DBFS = -60.0
SEED = 20261201


@dataclass(frozen=True)
class Clip:
    name: str
    kind: Kind
    text: str  # what was said ("" for a noise)
    voice: str
    audio: bytes  # 16 kHz mono PCM16
    event_ms: float  # where the caller's speech or noise starts in ``audio``
    end_ms: float  # ... and where it ends

    @property
    def should_interrupt(self) -> bool:
        return self.kind == "interruption"


def _noise(name: str, ms: float, smooth: int, decay: float, rng: np.random.Generator) -> np.ndarray:
    if name == "double cough":
        one = noise_burst(220.0, rng, smooth=smooth, decay=decay)
        return np.concatenate([one, np.zeros(int(RATE * 0.12)), noise_burst(200.0, rng, smooth=smooth)])
    level = 0.35 if name == "breath" else 1.0
    return noise_burst(ms, rng, smooth=smooth, decay=decay) * level


def _place(event: np.ndarray, echo: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    lead, tail = int(RATE * LEAD_MS / 1000), int(RATE * TAIL_MS / 1000)
    signal = np.concatenate([np.zeros(lead), event, np.zeros(tail)])
    reps = -(-len(signal) // len(echo))
    signal = signal + np.tile(echo, reps)[: len(signal)] * ECHO_GAIN
    signal = signal + rng.standard_normal(len(signal)) * 32767 * 10 ** (FLOOR_DBFS / 20)
    return signal


def build(
    *,
    voices: Sequence[str] = VOICES,
    rates: Sequence[int] = RATES,
    interruptions: Sequence[str] = INTERRUPTIONS,
    backchannels: Sequence[str] = BACKCHANNELS,
    noises: int = len(NOISES),
) -> list[Clip]:
    """Every phrase in every voice at every rate, and as many takes of each noise as voices."""
    rng = np.random.default_rng(SEED)
    clips: list[Clip] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        echo = synthesize(AGENT_LINE, work, "agent").astype(np.float64)
        said: list[tuple[Kind, str]] = [("interruption", t) for t in interruptions]
        said += [("backchannel", t) for t in backchannels]
        for n, ((kind, text), voice, rate) in enumerate(itertools.product(said, voices, rates)):
            speech = synthesize(text, work, f"c{n}", voice=voice, rate=rate).astype(np.float64)
            audio = to_pcm16(_place(speech, echo, rng)).tobytes()
            end = LEAD_MS + len(speech) * 1000 / RATE
            clips.append(
                Clip(f"{kind}: {text} ({voice}, {rate} wpm)", kind, text, voice, audio, LEAD_MS, end)
            )
        for (name, ms, smooth, decay), take in itertools.product(NOISES[:noises], range(len(voices))):
            noise = _noise(name, ms, smooth, decay, rng)
            audio = to_pcm16(_place(noise, echo, rng)).tobytes()
            end = LEAD_MS + len(noise) * 1000 / RATE
            clips.append(Clip(f"noise: {name} #{take + 1}", "noise", "", "", audio, LEAD_MS, end))
    return clips


class CorpusSize(NamedTuple):
    """Which part of the corpus a run uses (None: all of it)."""

    voices: Sequence[str] | None = None
    rates: Sequence[int] | None = None
    phrases: int | None = None


@functools.cache
def standard() -> tuple[Clip, ...]:
    """The whole corpus, made once per process."""
    return tuple(build())


def sized(
    voices: Sequence[str] | None = None, rates: Sequence[int] | None = None, phrases: int | None = None
) -> list[Clip]:
    """The corpus, or a part of it: some voices, some rates, the first ``phrases`` of each kind."""
    if voices is None and rates is None and phrases is None:
        return list(standard())
    n = phrases if phrases is not None else max(len(INTERRUPTIONS), len(BACKCHANNELS), len(NOISES))
    return build(
        voices=voices or VOICES,
        rates=rates or RATES,
        interruptions=INTERRUPTIONS[:n],
        backchannels=BACKCHANNELS[:n],
        noises=min(n, len(NOISES)),
    )
