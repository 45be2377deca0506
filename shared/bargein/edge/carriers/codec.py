"""A phone line's audio: G.711 at 8 kHz on the line, PCM16 at 16 kHz inside bargein.

What we send is always μ-law (PCMU: every carrier's bidirectional default); what the caller's
side sends is μ-law or, on a Telnyx call it could not transcode, A-law (PCMA, the European G.711).
The G.711 codecs are ``audioop``'s: the standard library's up to Python 3.12, and the maintained
``audioop-lts`` package (the same module, same C code) from 3.13, where the standard library
dropped it. Resampling is soxr's, streaming, so that each direction keeps its filter's state from
one 20 ms frame to the next (no click at every frame edge).
"""

from __future__ import annotations

import warnings

import numpy as np
import soxr

from bargein.agent.events import SAMPLE_RATE

with warnings.catch_warnings():  # Python 3.11-3.12 warn that audioop leaves the standard library
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

LINE_RATE = 8000
LINE_FRAME_MS = 20
LINE_FRAME_BYTES = LINE_RATE * LINE_FRAME_MS // 1000  # μ-law: one byte a sample


class LineAudio:
    """One call's conversions, in both directions (``encoding``: the caller's, PCMU or PCMA)."""

    def __init__(self, encoding: str = "PCMU") -> None:
        if encoding not in ("PCMU", "PCMA"):
            raise ValueError(f"not a G.711 encoding: {encoding!r}")
        self._decode = audioop.alaw2lin if encoding == "PCMA" else audioop.ulaw2lin
        self._up = soxr.ResampleStream(LINE_RATE, SAMPLE_RATE, 1, dtype="int16")
        self._down = soxr.ResampleStream(SAMPLE_RATE, LINE_RATE, 1, dtype="int16")
        self._pending = b""  # line audio not yet a whole frame

    def from_line(self, g711: bytes) -> bytes:
        """The caller's G.711 at 8 kHz → PCM16 at 16 kHz, for the speech tier."""
        linear = np.frombuffer(self._decode(g711, 2), dtype="<i2")
        return np.asarray(self._up.resample_chunk(linear), dtype="<i2").tobytes()

    def to_line(self, pcm: bytes) -> list[bytes]:
        """The agent's PCM16 at 16 kHz → whole 20 ms frames of μ-law at 8 kHz (the rest waits for
        the next call, so every frame sent is a full one)."""
        linear = np.asarray(self._down.resample_chunk(np.frombuffer(pcm, dtype="<i2")), dtype="<i2")
        self._pending += audioop.lin2ulaw(linear.tobytes(), 2)
        whole = len(self._pending) - len(self._pending) % LINE_FRAME_BYTES
        frames = [self._pending[i : i + LINE_FRAME_BYTES] for i in range(0, whole, LINE_FRAME_BYTES)]
        self._pending = self._pending[whole:]
        return frames

    def drop_pending(self) -> None:
        """A clear: the part-frame of the cut-off audio is not sent either."""
        self._pending = b""
        self._down.clear()


def encode_ulaw(pcm8k: bytes) -> bytes:
    """PCM16 at 8 kHz → μ-law (for a carrier simulator's fixtures)."""
    return audioop.lin2ulaw(pcm8k, 2)


def decode_ulaw(ulaw: bytes) -> bytes:
    """μ-law → PCM16 at the same rate."""
    return audioop.ulaw2lin(ulaw, 2)


def encode_alaw(pcm8k: bytes) -> bytes:
    """PCM16 at 8 kHz → A-law (for a carrier simulator's fixtures)."""
    return audioop.lin2alaw(pcm8k, 2)
