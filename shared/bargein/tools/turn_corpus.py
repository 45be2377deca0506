"""The turn-taking corpus: callers who pause in the middle of a sentence, and callers who finish.

Two kinds of clip, each a caller's microphone while the agent is silent, waiting for them:

* ``paused``: an unfinished clause ("My account number is"), a pause of 0.5, 0.8 or 1.2 s, and the
  rest of the sentence; the agent must not answer in the pause (a *premature* answer);
* ``finished``: one whole sentence; the agent should answer as soon after its end as it can. Besides
  the corpus's own, the two sentences of the demo's call (``data/barge_in.wav``, the speech
  fixtures' recording), the second with a pause at its comma ("Wait, stop, I would rather ...").

Speech is espeak-ng in several voices and rates (:mod:`bargein.tools.synth`), under a noise floor
(white noise at ``FLOOR_DBFS``, and, in half the clips, a louder band of room noise); clips are
deterministic (fixed seed, espeak-ng and sox without dither). ``bargein bench turns`` and the
turn-taking tests use it.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from bargein.tools.synth import RATE, demo_recording, synthesize, to_pcm16

Kind = Literal["paused", "finished"]

# (what the caller says before the pause, what they say after it)
PAUSED = (
    ("My account number is", "four five six seven, and I cannot log in."),
    ("I would like to book a table for", "two people tomorrow evening."),
    ("The problem is that", "my card was declined twice."),
    ("I called yesterday and", "nobody answered the phone."),
    ("Can you tell me", "when the store opens on Sunday?"),
    ("What I need is a", "new password for my account."),
    ("I ordered a blue jacket and", "it arrived in the wrong size."),
    ("My phone number is five five five", "one two three four."),
)
FINISHED = (
    "I want a refund.",
    "What time does the store open?",
    "My card was declined.",
    "Thank you, that is all.",
    "Can you help me with my order?",
    "I would like to cancel my subscription.",
    "The parcel never arrived.",
    "Where is my nearest branch?",
)
PAUSES_MS = (500.0, 800.0, 1200.0)
VOICES = ("en-us", "en-gb", "en-us+f3")
RATES = (150, 185)
LEAD_MS = 600.0  # silence before the caller speaks
TAIL_MS = 3600.0  # after it: longer than the longest wait of any judge (Pipecat: 3 s)
FLOOR_DBFS = -60.0
ROOM_DBFS = -45.0  # the room noise mixed into every other clip: a fan, a street
SEED = 20261204


@dataclass(frozen=True)
class Clip:
    name: str
    kind: Kind
    text: str  # the whole sentence
    voice: str
    audio: bytes  # 16 kHz mono PCM16
    speech_ms: tuple[tuple[float, float], ...]  # where the caller speaks in ``audio``
    pause_ms: float = 0.0  # the pause in the middle (paused clips)

    @property
    def end_ms(self) -> float:
        """Where the caller's speech ends."""
        return self.speech_ms[-1][1]

    @property
    def pause_at_ms(self) -> tuple[float, float] | None:
        """Where the mid-sentence pause lies (paused clips)."""
        return (self.speech_ms[0][1], self.speech_ms[1][0]) if len(self.speech_ms) > 1 else None


def _room(n: int, rng: np.random.Generator) -> np.ndarray:
    """Low-passed noise: the hum of a room, louder than the floor, under the speech."""
    smooth = 24
    noise = np.convolve(rng.standard_normal(n + smooth - 1), np.ones(smooth) / smooth, mode="valid")[:n]
    return noise / (noise.std() or 1.0) * 32767 * 10 ** (ROOM_DBFS / 20)


def _mix(parts: Sequence[np.ndarray], rng: np.random.Generator, room: bool) -> tuple[np.ndarray, list[float]]:
    """Silence, the parts with silences between them as given, silence; with noise. Returns the
    signal and the boundaries (ms) of every part."""
    pieces: list[np.ndarray] = []
    bounds: list[float] = []
    at = 0
    for part in parts:
        pieces.append(part)
        if len(pieces) % 2 == 0:  # a speech part: where it lies
            bounds += [at * 1000 / RATE, (at + len(part)) * 1000 / RATE]
        at += len(part)
    signal = np.concatenate(pieces)
    signal = signal + rng.standard_normal(len(signal)) * 32767 * 10 ** (FLOOR_DBFS / 20)
    if room:
        signal = signal + _room(len(signal), rng)
    return signal, bounds


def _silence(ms: float) -> np.ndarray:
    return np.zeros(int(RATE * ms / 1000))


def build(
    *,
    voices: Sequence[str] = VOICES,
    rates: Sequence[int] = RATES,
    pauses_ms: Sequence[float] = PAUSES_MS,
    paused: Sequence[tuple[str, str]] = PAUSED,
    finished: Sequence[str] = FINISHED,
    recording: bool = False,
) -> list[Clip]:
    """Every paused sentence with every pause, and every finished one, in every voice and rate;
    with ``recording``, the demo call's sentences too."""
    rng = np.random.default_rng(SEED)
    clips: list[Clip] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        n = 0
        for (voice, rate), (first, rest) in itertools.product(itertools.product(voices, rates), paused):
            a = synthesize(first, work, f"a{n}", voice=voice, rate=rate).astype(np.float64)
            b = synthesize(rest, work, f"b{n}", voice=voice, rate=rate).astype(np.float64)
            for pause in pauses_ms:
                n += 1
                parts = [_silence(LEAD_MS), a, _silence(pause), b, _silence(TAIL_MS)]
                signal, bounds = _mix(parts, rng, room=n % 2 == 0)
                speech = ((bounds[0], bounds[1]), (bounds[2], bounds[3]))
                text = f"{first} {rest}"
                name = f"paused {pause:.0f} ms: {first} … {rest} ({voice}, {rate} wpm)"
                clips.append(Clip(name, "paused", text, voice, to_pcm16(signal).tobytes(), speech, pause))
        for (voice, rate), text in itertools.product(itertools.product(voices, rates), finished):
            n += 1
            said = synthesize(text, work, f"f{n}", voice=voice, rate=rate).astype(np.float64)
            signal, bounds = _mix([_silence(LEAD_MS), said, _silence(TAIL_MS)], rng, room=n % 2 == 0)
            name = f"finished: {text} ({voice}, {rate} wpm)"
            clips.append(
                Clip(name, "finished", text, voice, to_pcm16(signal).tobytes(), ((bounds[0], bounds[1]),))
            )
    if recording:
        clips += _recorded(rng)
    return clips


def _recorded(rng: np.random.Generator) -> list[Clip]:
    """Each sentence of the demo's call as a finished clip of its own, as recorded."""
    marks, pcm = demo_recording()
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    clips = []
    for (start, end), text in zip(marks["speech"], marks["text"], strict=True):
        said = samples[int(start * RATE / 1000) : int(end * RATE / 1000)]
        signal, bounds = _mix([_silence(LEAD_MS), said, _silence(TAIL_MS)], rng, room=False)
        name = f"finished: {text} (the demo's call)"
        clips.append(
            Clip(name, "finished", text, "recording", to_pcm16(signal).tobytes(), ((bounds[0], bounds[1]),))
        )
    return clips
