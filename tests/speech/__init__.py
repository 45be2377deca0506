"""Tests of the speech tier: Silero VAD (batched and not), the turn-taking policy, the service.

The audio fixtures are made by ``scripts/make_fixtures.py`` (espeak-ng + sox); ``marks.json`` says
where the script put speech in each file. Helpers here are shared with the integration test.
"""

from __future__ import annotations

import functools
import json
import wave
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "audio"
TOLERANCE_MS = 100.0  # the acceptance: detected starts and ends within ±100 ms of the marks
FRAME_BYTES = 640  # 20 ms of 16 kHz PCM16, what a client typically sends


@functools.cache
def pcm(name: str) -> bytes:
    """The fixture's samples as 16 kHz mono PCM16 little-endian bytes."""
    with wave.open(str(FIXTURES / name), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 16_000), name
        return wav.readframes(wav.getnframes())


@functools.cache
def _marks() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "marks.json").read_text())
    return data


def speech_marks(name: str) -> list[tuple[float, float]]:
    """(start_ms, end_ms) of each utterance the script placed in ``name``."""
    return [(float(a), float(b)) for a, b in _marks()["files"][name]["speech"]]


def frames(data: bytes, size: int = FRAME_BYTES) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]
