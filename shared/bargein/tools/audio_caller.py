"""A caller who talks and listens over a real edge: what the end-to-end bench and tests drive.

:class:`AudioCaller` joins a session with ``audio=pcm16`` (and ``reports=played``), streams its
microphone at real time (20 ms frames of silence, and the clips it is told to say), plays the
agent's voice in an :class:`~bargein.tools.earpiece.Earpiece` (pausing, resuming and clearing as
told), reports the marks it has played, and keeps every frame it received with the time it came.
From that record the bench reads its numbers: when the caller began to speak, when the agent's
voice stopped in the earpiece, when it came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from bargein.agent.events import SAMPLE_RATE, SAMPLE_WIDTH
from bargein.edge.protocol import Played, frame_json
from bargein.tasks import cancel_and_wait
from bargein.tools.call import FRAME_BYTES, FRAME_MS, frames_of
from bargein.tools.earpiece import Earpiece


@dataclass
class Received:
    at: float  # time.monotonic() when it arrived
    frame: dict[str, Any] | None  # a JSON frame, or None for audio
    audio: bytes = b""


@dataclass
class Said:
    started: float  # when its first frame went out
    ended: float | None = None  # when its last frame went out


@dataclass
class AudioCaller:
    ws: ClientConnection
    echo: bool = True  # echo the marks played (as ``played``); off: the test reports by hand
    ear: Earpiece = field(default_factory=lambda: Earpiece(time.monotonic()))
    received: list[Received] = field(default_factory=list)
    _clips: asyncio.Queue[tuple[bytes, Said]] = field(default_factory=asyncio.Queue)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    @contextlib.asynccontextmanager
    async def joined(cls, ws_url: str, token: str, *, reports: bool = True, echo: bool = True) -> Any:
        """Join as a caller who hears the agent; ``reports``: with ``reports=played`` (else the
        edge's clock says what was heard); ``echo``: report each mark once played."""
        query = "&reports=played" if reports else ""
        async with connect(f"{ws_url}?token={token}&role=caller&audio=pcm16{query}", max_size=None) as ws:
            caller = cls(ws, echo=echo and reports)
            caller.start()
            try:
                yield caller
            finally:
                await caller.stop()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._receive())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(Exception):
                await cancel_and_wait(task)

    def say(self, pcm: bytes) -> Said:
        """Speak ``pcm`` next (after what is being said); its times are filled in as it goes out."""
        said = Said(started=0.0)
        self._clips.put_nowait((pcm, said))
        return said

    async def played(self, turn: int, mark: int) -> None:
        await self.ws.send(json.dumps(frame_json(Played(type="played", turn=turn, mark=mark))))

    async def interrupt(self) -> None:
        await self.ws.send(json.dumps({"type": "interrupt"}))

    async def text(self, text: str) -> None:
        await self.ws.send(json.dumps({"type": "text", "text": text}))

    async def _send(self) -> None:
        start = time.monotonic()
        sent = 0
        silence = bytes(FRAME_BYTES)
        while True:
            frames = [silence]
            said: Said | None = None
            if not self._clips.empty():
                pcm, said = self._clips.get_nowait()
                frames = frames_of(pcm)
            for i, frame in enumerate(frames):
                sent += 1
                await asyncio.sleep(max(0.0, start + sent * FRAME_MS / 1000 - time.monotonic()))
                now = time.monotonic()
                if said is not None and i == 0:
                    said.started = now
                self.ear.said(frame, now)
                await self._send_frame(frame)
            if said is not None:
                said.ended = time.monotonic()

    async def _send_frame(self, frame: bytes) -> None:
        """20 ms of the microphone, as the edge takes it (a phone line: :mod:`.phone_caller`)."""
        await self.ws.send(frame)

    async def _receive(self) -> None:
        async for message in self.ws:
            now = time.monotonic()
            if isinstance(message, bytes):
                self.received.append(Received(now, None, message))
                reached = self.ear.audio(message, now)
            else:
                frame = json.loads(message)
                self.received.append(Received(now, frame))
                reached = self._on_frame(frame, now)
            if self.echo:
                for turn, mark in reached:
                    await self.played(turn, mark)
            self.changed.set()

    def _on_frame(self, frame: dict[str, Any], now: float) -> list[tuple[int, int]]:
        kind = frame.get("type")
        if kind == "audio_mark":
            return self.ear.mark(frame["turn"], frame["mark"], now)
        if kind == "pause":
            return self.ear.pause(now)
        if kind == "resume":
            return self.ear.resume(now)
        if kind == "clear":
            return self.ear.clear(now)
        return self.ear.advance(now)

    # --- reading the record ----------------------------------------------------------------------

    def frames(self, kind: str, after: float = 0.0) -> list[Received]:
        return [
            r for r in self.received if r.frame is not None and r.frame.get("type") == kind and r.at >= after
        ]

    def audio_after(self, at: float) -> float:
        """Seconds of the agent's audio that arrived after ``at``."""
        return (
            sum(len(r.audio) for r in self.received if r.frame is None and r.at > at)
            / SAMPLE_WIDTH
            / SAMPLE_RATE
        )

    async def wait_for(self, kind: str, *, after: float = 0.0, timeout: float = 15.0) -> Received:
        deadline = time.monotonic() + timeout
        while True:
            found = self.frames(kind, after)
            if found:
                return found[0]
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {kind} frame within {timeout} s")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.1))

    async def wait_audio(self, seconds: float, *, after: float = 0.0, timeout: float = 15.0) -> float:
        """Wait until ``seconds`` of the agent's audio arrived after ``after``; when it had."""
        deadline = time.monotonic() + timeout
        while self.audio_after(after) < seconds:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{seconds} s of the agent's audio did not arrive within {timeout} s")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.1)
        return time.monotonic()

    def silent_since(self) -> float | None:
        """When the agent's voice last stopped in the earpiece (None: it is playing)."""
        self.ear.advance(time.monotonic())
        return None if self.ear.playing else self.ear.last_audible
