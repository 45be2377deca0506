"""Speech and noise made on this machine, for fixtures, corpora and demos: espeak-ng speaks, sox
converts to 16 kHz mono PCM16 and trims the quiet at both ends, numpy mixes.

The trim is what makes marks exact: a clip starts at its first sample above ``TRIM_ABOVE`` and ends
at its last, so whoever places it knows where the speech is without asking a voice activity
detector. espeak-ng is deterministic and sox runs without dither, so the same text, voice and rate
give the same samples on every run.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import wave
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

RATE = 16_000
VOICE = "en-us"
WORDS_PER_MINUTE = 160
# sox silence effect: trim until 10 ms in a row are above 1% of full scale (-40 dBFS), at both ends
TRIM_ABOVE = "1%"
TRIM_DURATION_S = "0.01"
NEEDED = "apt-get install espeak-ng sox"


class MissingTool(RuntimeError):
    """espeak-ng or sox is not installed."""


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise MissingTool(f"{tool} is not installed ({NEEDED})")
    return path


def demo_recording() -> tuple[dict[str, Any], bytes]:
    """The call ``bargein demo`` plays (``data/barge_in.wav``, 16 kHz PCM16) and its marks (where
    each utterance is, and its words), both made by ``scripts/make_fixtures.py``."""
    data = resources.files("bargein") / "data"
    marks: dict[str, Any] = json.loads((data / "barge_in.json").read_text())
    with wave.open(io.BytesIO((data / "barge_in.wav").read_bytes())) as wav:
        return marks, wav.readframes(wav.getnframes())


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as wav:
        if (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) != (1, 2, RATE):
            raise ValueError(f"{path}: expected 16 kHz mono PCM16")
        return np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").copy()


def write_wav(path: Path, samples: np.ndarray) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(samples.astype("<i2").tobytes())


def synthesize(
    text: str, workdir: Path, name: str, *, voice: str = VOICE, rate: int = WORDS_PER_MINUTE
) -> np.ndarray:
    """``text`` spoken by espeak-ng ``voice`` at ``rate`` words a minute: 16 kHz mono PCM16 samples,
    trimmed of quiet at both ends."""
    raw = workdir / f"{name}.raw.wav"
    trimmed = workdir / f"{name}.wav"
    subprocess.run([need("espeak-ng"), "-v", voice, "-s", str(rate), "-w", str(raw), text], check=True)
    convert = ["-r", str(RATE), "-c", "1", "-b", "16", "-e", "signed-integer"]
    trim = ["silence", "1", TRIM_DURATION_S, TRIM_ABOVE]
    # -D: no dither (sox adds random dither when it resamples, which would make every run differ);
    # trim the start, reverse, trim the (old) end, reverse back
    subprocess.run(
        [need("sox"), "-D", str(raw), *convert, str(trimmed), *trim, "reverse", *trim, "reverse"], check=True
    )
    return read_wav(trimmed)


def noise_burst(ms: float, rng: np.random.Generator, *, smooth: int = 16, decay: float = 4.0) -> np.ndarray:
    """Low-passed noise under a fast-attack, slow-decay envelope: roughly a cough or a knock
    (``smooth`` samples of moving average: higher is duller)."""
    n = int(RATE * ms / 1000)
    noise = np.convolve(rng.standard_normal(n + smooth - 1), np.ones(smooth) / smooth, mode="valid")[:n]
    t = np.arange(n) / n
    envelope = np.minimum(t / 0.05, 1.0) * np.exp(-decay * t)
    peak = np.abs(noise * envelope).max()
    return np.asarray(noise * envelope / peak * 0.4 * 32767, dtype=np.float64)


def to_pcm16(signal: np.ndarray) -> np.ndarray:
    return np.clip(np.round(signal), -32768, 32767).astype(np.int16)
