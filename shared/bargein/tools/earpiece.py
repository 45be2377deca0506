"""The caller's loudspeaker, simulated: the agent's audio played at real time as the edge sends it.

A client that hears the agent (``audio=pcm16``) buffers what arrives and plays it at real time; on
``pause`` it stops and keeps its buffer, on ``resume`` it goes on, on ``clear`` it drops the buffer.
:class:`Earpiece` does exactly that against the wall clock, so ``bargein call --save-audio``, the
end-to-end bench and the tests hear what a caller would: it records the agent's channel as played
(silence where nothing played), beside the caller's own audio, and says which audio marks have
been played (for ``played`` reports) and when the agent's voice stopped.
"""

from __future__ import annotations

import collections
import wave
from pathlib import Path

import numpy as np

from bargein.agent.events import SAMPLE_RATE, SAMPLE_WIDTH


class Earpiece:
    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.buffer = bytearray()  # received, not yet played
        self.agent = bytearray()  # the agent's channel, one sample per sample of wall time
        self.caller = bytearray()  # the caller's channel, likewise
        self.received = 0  # samples ever put in the buffer (what mark positions count)
        self.played = 0  # samples of the agent's audio played
        self.paused = False
        self.marks: collections.deque[tuple[int, int, int]] = collections.deque()  # (at, turn, mark)
        self.last_audible: float | None = None  # wall time the agent's voice last played

    @property
    def playing(self) -> bool:
        return bool(self.buffer) and not self.paused

    def _wall_samples(self, now: float) -> int:
        return max(0, int((now - self.t0) * SAMPLE_RATE))

    def advance(self, now: float) -> list[tuple[int, int]]:
        """Play up to ``now``; the (turn, mark)s whose audio has now been played."""
        due = self._wall_samples(now) - len(self.agent) // SAMPLE_WIDTH
        if due <= 0:
            return []
        take = 0 if self.paused else min(due, len(self.buffer) // SAMPLE_WIDTH)
        if take:
            self.agent += self.buffer[: take * SAMPLE_WIDTH]
            del self.buffer[: take * SAMPLE_WIDTH]
            self.played += take
            self.last_audible = self.t0 + len(self.agent) // SAMPLE_WIDTH / SAMPLE_RATE
        self.agent += bytes((due - take) * SAMPLE_WIDTH)
        reached = []
        while self.marks and self.marks[0][0] <= self.played:
            _, turn, mark = self.marks.popleft()
            reached.append((turn, mark))
        return reached

    def audio(self, pcm: bytes, now: float) -> list[tuple[int, int]]:
        reached = self.advance(now)
        self.buffer += pcm
        self.received += len(pcm) // SAMPLE_WIDTH
        return reached

    def mark(self, turn: int, mark: int, now: float) -> list[tuple[int, int]]:
        reached = self.advance(now)
        self.marks.append((self.received, turn, mark))
        return reached + self.advance(now)

    def pause(self, now: float) -> list[tuple[int, int]]:
        reached = self.advance(now)
        self.paused = True
        return reached

    def resume(self, now: float) -> list[tuple[int, int]]:
        reached = self.advance(now)
        self.paused = False
        return reached

    def clear(self, now: float) -> list[tuple[int, int]]:
        """Stop now and drop what was buffered (and the marks in it)."""
        reached = self.advance(now)
        self.received -= len(self.buffer) // SAMPLE_WIDTH
        self.buffer.clear()
        self.marks.clear()
        self.paused = False
        return reached

    def said(self, pcm: bytes, now: float) -> None:
        """The caller sent ``pcm`` at ``now`` (recorded on its own channel)."""
        at = self._wall_samples(now) * SAMPLE_WIDTH
        if len(self.caller) < at:
            self.caller += bytes(at - len(self.caller))
        self.caller += pcm

    def save(self, path: Path) -> float:
        """The call as a stereo WAV (the caller left, the agent right); its length in seconds."""
        n = max(len(self.agent), len(self.caller)) // SAMPLE_WIDTH
        both = np.zeros((n, 2), dtype="<i2")
        agent = np.frombuffer(bytes(self.agent), dtype="<i2")
        caller = np.frombuffer(bytes(self.caller[: len(self.caller) // 2 * 2]), dtype="<i2")
        both[: len(caller), 0] = caller
        both[: len(agent), 1] = agent
        with wave.open(str(path), "wb") as wav:
            wav.setnchannels(2)
            wav.setsampwidth(SAMPLE_WIDTH)
            wav.setframerate(SAMPLE_RATE)
            wav.writeframes(both.tobytes())
        return n / SAMPLE_RATE
