"""A caller on a phone line, simulated as a carrier carries it: what ``bench e2e`` compares the web with.

:class:`PhoneCaller` rings the edge's Twilio voice webhook (signed with the auth token, as Twilio
signs it), opens the ``<Stream>`` the reply names, and from there on is the carrier of
Twilio's Media Streams: the caller's microphone goes out as μ-law 8 kHz in 20 ms ``media``
messages at real time; the agent's ``media`` is played at real time in an
:class:`~bargein.tools.earpiece.Earpiece`; each ``mark`` is echoed once the audio before it has
played, and ``clear`` drops what was not played yet.

A line has no ``pause`` or ``resume``: the edge clears the line for the soft barge-in's pause too,
and sends the rest of the answer again when it goes on. So what a clear was is read afterwards
from the marks that follow it: marks of the same turn mean the agent went on (a pause, and its
``resume`` is the first audio after it), marks of a later turn or none mean it was cut. With that,
the bench reads a phone caller's record exactly as a web caller's (:meth:`frames`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from twilio.request_validator import RequestValidator
from websockets.asyncio.client import connect

from bargein.edge.carriers.abc import SESSION_PARAMETER
from bargein.edge.carriers.codec import LineAudio
from bargein.tools.audio_caller import AudioCaller, Received

ACCOUNT = "AC" + "0" * 32


@dataclass
class PhoneCaller(AudioCaller):
    stream_sid: str = field(default_factory=lambda: f"MZ{uuid.uuid4().hex}")
    call_sid: str = field(default_factory=lambda: f"CA{uuid.uuid4().hex}")
    line: LineAudio = field(default_factory=LineAudio)
    session_id: str = ""
    _sequence: int = 0

    @classmethod
    @contextlib.asynccontextmanager
    async def dialled(cls, edge_url: str, auth_token: str, listener_token: Callable[[str], str]) -> Any:
        """A call to the edge: its webhook rung, its stream started; the caller, until hung up.
        ``listener_token`` gives a listener's token for the call's session: a line carries no
        transcripts, so the caller also listens to the session as a screen would, and what
        speech-to-text heard (``user_transcript``) is in its record as on the web."""
        call_sid = f"CA{uuid.uuid4().hex}"
        url = f"{edge_url}/v1/twilio/voice"
        form = {"CallSid": call_sid, "AccountSid": ACCOUNT, "From": "+15550100", "To": "+15550199",
                "CallStatus": "ringing"}  # fmt: skip
        signature = RequestValidator(auth_token).compute_signature(url, form)
        async with httpx.AsyncClient(timeout=10) as client:
            reply = await client.post(url, data=form, headers={"X-Twilio-Signature": signature})
        reply.raise_for_status()
        stream_url, parameters = _stream_of(reply.text)
        session_id = parameters.get(SESSION_PARAMETER, "")
        screen = f"{edge_url.replace('http', 'ws', 1)}/v1/sessions/{session_id}/ws"
        async with connect(stream_url, max_size=None) as ws:
            caller = cls(ws, call_sid=call_sid, session_id=session_id)
            await caller._start_stream(parameters)
            caller.start()
            caller._tasks.append(asyncio.create_task(caller._listen(screen, listener_token(session_id))))
            try:
                yield caller
            finally:
                with contextlib.suppress(Exception):  # the caller hangs up
                    await caller._event("stop", stop={"accountSid": ACCOUNT, "callSid": call_sid})
                await caller.stop()

    async def _event(self, event: str, **body: Any) -> None:
        self._sequence += 1
        message = {"event": event, "sequenceNumber": str(self._sequence), "streamSid": self.stream_sid}
        await self.ws.send(json.dumps({**message, **body}))

    async def _start_stream(self, parameters: dict[str, str]) -> None:
        await self.ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await self._event("start", start={
            "accountSid": ACCOUNT, "streamSid": self.stream_sid, "callSid": self.call_sid,
            "tracks": ["inbound"], "customParameters": parameters,
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        })  # fmt: skip

    async def _listen(self, url: str, token: str) -> None:
        """What the session's screens see of the caller's words, into the record."""
        async with connect(f"{url}?token={token}&role=listener") as screen:
            async for message in screen:
                frame = json.loads(message) if isinstance(message, str) else None
                if frame is not None and frame.get("type") == "user_transcript":
                    self.received.append(Received(time.monotonic(), frame))

    # --- the line (AudioCaller's transport, in the carrier's messages) ---------------------------

    async def _send_frame(self, frame: bytes) -> None:
        for chunk in self.line.to_line(frame):
            payload = base64.b64encode(chunk).decode()
            await self._event("media", media={"track": "inbound", "payload": payload})

    async def played(self, turn: int, mark: int) -> None:
        await self._event("mark", mark={"name": f"{turn}.{mark}"})

    async def _receive(self) -> None:
        async for raw in self.ws:
            now = time.monotonic()
            message = json.loads(raw)
            event = message.get("event")
            if event == "media":
                pcm = self.line.from_line(base64.b64decode(message["media"]["payload"]))
                self.received.append(Received(now, None, pcm))
                reached = self.ear.audio(pcm, now)
            elif event == "mark":
                turn, mark = (int(n) for n in str(message["mark"]["name"]).split(".", 1))
                self.received.append(Received(now, {"type": "audio_mark", "turn": turn, "mark": mark}))
                reached = self.ear.mark(turn, mark, now)
            elif event == "clear":
                self.received.append(Received(now, {"type": "clear"}))
                reached = self.ear.clear(now)
            else:
                continue
            for turn_mark in reached:
                await self.played(*turn_mark)
            self.changed.set()

    # --- reading the record ----------------------------------------------------------------------

    def frames(self, kind: str, after: float = 0.0) -> list[Received]:
        """As a web caller's record would have them: a clear the same turn's marks follow was a
        ``pause``, and the first audio after it its ``resume``; the rest were ``clear``s."""
        if kind not in ("pause", "resume", "clear"):
            return super().frames(kind, after)
        found = []
        for i, r in enumerate(self.received):
            if r.frame is None or r.frame.get("type") != "clear":
                continue
            was_pause, resumed = self._went_on(i)
            if kind == "clear" and not was_pause:
                found.append(r)
            elif kind == "pause" and was_pause:
                found.append(Received(r.at, {"type": "pause"}))
            elif kind == "resume" and was_pause and resumed is not None:
                found.append(Received(resumed, {"type": "resume"}))
        return [r for r in found if r.at >= after]

    def _went_on(self, clear: int) -> tuple[bool, float | None]:
        """Whether the turn playing at clear ``clear`` went on after it, and when its audio came back."""
        before = [_turn_of(r) for r in self.received[:clear] if _turn_of(r) is not None]
        after = next((_turn_of(r) for r in self.received[clear + 1 :] if _turn_of(r) is not None), None)
        if not before or after != before[-1]:
            return False, None
        audio = next((r.at for r in self.received[clear + 1 :] if r.frame is None), None)
        return True, audio


def _turn_of(r: Received) -> int | None:
    """The turn of a mark; None for anything else."""
    if r.frame is None or r.frame.get("type") != "audio_mark":
        return None
    return int(r.frame["turn"])


def _stream_of(twiml: str) -> tuple[str, dict[str, str]]:
    """The ``<Connect><Stream>`` of the webhook's TwiML: its URL and its parameters."""
    stream = ET.fromstring(twiml).find("./Connect/Stream")
    if stream is None:
        raise ValueError(f"the voice webhook's reply connects no stream: {twiml[:200]!r}")
    return stream.attrib["url"], {p.attrib["name"]: p.attrib["value"] for p in stream.findall("Parameter")}
