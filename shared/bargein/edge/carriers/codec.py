"""A phone line's audio: G.711 at 8 kHz on the line, PCM16 at 16 kHz inside bargein.

What we send is always μ-law (PCMU: every carrier's bidirectional default); what the caller's
side sends is μ-law or, on a Telnyx call it could not transcode, A-law (PCMA, the European G.711)
or G.722 (wideband, 16 kHz: an HD-voice call). The G.711 codecs are ``audioop``'s: the standard
library's up to Python 3.12, and the maintained ``audioop-lts`` package (the same module, same C
code) from 3.13, where the standard library dropped it. G.722 is FFmpeg's ADPCM codec through
PyAV, whose decoder keeps its state from one 20 ms packet to the next as the codec requires.

Resampling is FFmpeg's too (libswresample, through PyAV), streaming, so that each direction keeps
its filter's state from one frame to the next (no click at every frame edge). Not soxr's stream,
which the rest of bargein uses on whole clips: it works in blocks, and held the audio back 80 ms
each way (measured with an impulse in 20 ms frames), which made a phone turn 0.2 s slower than the
web's and a barge-in on the phone 0.16 s slower to stop the agent (``bench e2e``, issue 28).
libswresample's windowed-sinc filter holds back a millisecond or two.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Literal

import av
import numpy as np

from bargein.agent.events import SAMPLE_RATE
from bargein.edge.carriers.abc import LINE_CODECS

with warnings.catch_warnings():  # Python 3.11-3.12 warn that audioop leaves the standard library
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

LINE_RATE = 8000
LINE_FRAME_MS = 20
LINE_FRAME_BYTES = LINE_RATE * LINE_FRAME_MS // 1000  # μ-law: one byte a sample


G722_RATE = 16000  # G.722's audio (its RTP clock says 8000, for historical reasons)


class G722:
    """One direction of a G.722 stream (FFmpeg's codec): PCM16 at 16 kHz in, 64 kbit/s out, or back."""

    def __init__(self, mode: Literal["r", "w"]) -> None:
        self._codec = av.CodecContext.create("g722", mode)
        self._codec.sample_rate = G722_RATE
        self._codec.layout = "mono"
        if mode == "w":
            self._codec.format = "s16"

    def decode(self, payload: bytes) -> bytes:
        return _pcm(self._codec.decode(av.Packet(payload)))

    def encode(self, pcm: bytes) -> bytes:
        return b"".join(bytes(packet) for packet in self._codec.encode(_frame(pcm, G722_RATE)))


def _pcm(frames: Iterable[av.AudioFrame]) -> bytes:
    """FFmpeg's frames (s16 mono) as PCM16."""
    return b"".join(np.asarray(f.to_ndarray(), dtype="<i2").tobytes() for f in frames)


def _frame(pcm: bytes, rate: int) -> av.AudioFrame:
    """PCM16 mono as FFmpeg's frame."""
    samples = np.frombuffer(pcm, dtype="<i2").reshape(1, -1)
    frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
    frame.sample_rate = rate
    return frame


class Resampler:
    """One direction's streaming resampler (PCM16 mono); :meth:`reset` forgets what it holds."""

    def __init__(self, from_rate: int, to_rate: int) -> None:
        self.from_rate, self.to_rate = from_rate, to_rate
        self.reset()

    def reset(self) -> None:
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=self.to_rate)

    def __call__(self, pcm: bytes) -> bytes:
        if len(pcm) < 2:
            return b""
        return _pcm(self._resampler.resample(_frame(pcm, self.from_rate)))


class LineAudio:
    """One call's conversions, in both directions (``encoding``: the caller's, PCMU, PCMA or G722)."""

    def __init__(self, encoding: str = "PCMU") -> None:
        if encoding not in LINE_CODECS:
            raise ValueError(f"not a phone line's encoding: {encoding!r}")
        self._g722 = G722("r") if encoding == "G722" else None
        self._decode = audioop.alaw2lin if encoding == "PCMA" else audioop.ulaw2lin
        self._up = Resampler(LINE_RATE, SAMPLE_RATE)
        self._down = Resampler(SAMPLE_RATE, LINE_RATE)
        self._pending = b""  # line audio not yet a whole frame

    def from_line(self, payload: bytes) -> bytes:
        """The caller's audio (G.711 at 8 kHz, or G.722) → PCM16 at 16 kHz, for the speech tier."""
        if self._g722 is not None:
            return self._g722.decode(payload)  # 16 kHz already
        return self._up(self._decode(payload, 2))

    def to_line(self, pcm: bytes) -> list[bytes]:
        """The agent's PCM16 at 16 kHz → whole 20 ms frames of μ-law at 8 kHz (the rest waits for
        the next call, so every frame sent is a full one)."""
        self._pending += audioop.lin2ulaw(self._down(pcm), 2)
        whole = len(self._pending) - len(self._pending) % LINE_FRAME_BYTES
        frames = [self._pending[i : i + LINE_FRAME_BYTES] for i in range(0, whole, LINE_FRAME_BYTES)]
        self._pending = self._pending[whole:]
        return frames

    def drop_pending(self) -> None:
        """A clear: the part-frame of the cut-off audio is not sent either."""
        self._pending = b""
        self._down.reset()


def encode_ulaw(pcm8k: bytes) -> bytes:
    """PCM16 at 8 kHz → μ-law (for a carrier simulator's fixtures)."""
    return audioop.lin2ulaw(pcm8k, 2)


def decode_ulaw(ulaw: bytes) -> bytes:
    """μ-law → PCM16 at the same rate."""
    return audioop.ulaw2lin(ulaw, 2)


def encode_alaw(pcm8k: bytes) -> bytes:
    """PCM16 at 8 kHz → A-law (for a carrier simulator's fixtures)."""
    return audioop.lin2alaw(pcm8k, 2)
