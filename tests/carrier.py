"""A phone carrier, simulated from Twilio's public documentation (not from bargein's code): the
voice webhook signed as "Webhooks security" describes (HMAC-SHA1 of the URL and the sorted POST
parameters, base64, keyed with the auth token), the TwiML read back, and a Media Stream as "Media
Streams - WebSocket Messages" describes it: ``connected``, ``start`` with the custom parameters,
the caller's audio as base64 μ-law 8 kHz ``media`` every 20 ms at real time, ``dtmf``, ``stop``;
the server's ``media`` played at real time, each ``mark`` echoed once the audio before it has
played, and ``clear`` dropping what was not played and echoing the marks it dropped at once.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import hashlib
import hmac
import json
import time
import uuid
import warnings
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import httpx
import numpy as np
import soxr
import websockets
from websockets.asyncio.client import ClientConnection

from bargein.edge.carriers.codec import G722

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

FRAME_BYTES = 160  # 20 ms of μ-law at 8 kHz
FRAME_S = 0.02


def twilio_signature(auth_token: str, url: str, params: dict[str, str]) -> str:
    payload = url + "".join(f"{key}{params[key]}" for key in sorted(params))
    digest = hmac.new(auth_token.encode(), payload.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def to_line(pcm16k: bytes, encoding: str = "PCMU") -> bytes:
    """16 kHz PCM16 → what a phone line carries: 8 kHz G.711 (μ-law, or A-law for PCMA), or G.722
    (16 kHz, 64 kbit/s: 160 bytes every 20 ms like G.711)."""
    if encoding == "G722":
        encoder = G722("w")
        return b"".join(encoder.encode(pcm16k[i : i + 640]) for i in range(0, len(pcm16k), 640))
    samples = np.asarray(soxr.resample(np.frombuffer(pcm16k, dtype="<i2"), 16000, 8000), dtype="<i2")
    encode = audioop.lin2alaw if encoding == "PCMA" else audioop.lin2ulaw
    return encode(samples.tobytes(), 2)


def from_line(ulaw: bytes) -> np.ndarray:
    return np.frombuffer(audioop.ulaw2lin(ulaw, 2), dtype="<i2")


@dataclass
class Answer:
    status: int
    stream_url: str = ""
    parameters: dict[str, str] = field(default_factory=dict)
    body: str = ""
    attributes: dict[str, str] = field(default_factory=dict)  # of the <Stream>
    call_sid: str = ""  # the call the webhook was asked about (its stream's start names it too)

    @classmethod
    def read(cls, response: httpx.Response) -> Answer:
        """The webhook's reply: with a 200, the ``<Connect><Stream>`` the carrier connects to."""
        answer = cls(response.status_code, body=response.text)
        if response.status_code == 200:
            stream = ET.fromstring(response.text).find("./Connect/Stream")
            assert stream is not None, response.text
            answer.attributes = dict(stream.attrib)
            answer.stream_url = stream.attrib["url"]
            answer.parameters = {p.attrib["name"]: p.attrib["value"] for p in stream.findall("Parameter")}
        return answer


async def ring(
    base: str, auth_token: str, *, query: str = "", signature: str | None = None, **form: str
) -> Answer:
    """Twilio's request to the voice webhook when a call comes in, and the TwiML it gets back."""
    url = f"{base}/v1/twilio/voice{query}"
    params = {"CallSid": f"CA{uuid.uuid4().hex}", "AccountSid": "AC" + "0" * 32, "From": "+15550100",
              "To": "+15550199", "CallStatus": "ringing", **form}  # fmt: skip
    headers = {
        "X-Twilio-Signature": signature
        if signature is not None
        else twilio_signature(auth_token, url, params)
    }
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(url, data=params, headers=headers)
    answer = Answer.read(response)
    answer.call_sid = params["CallSid"]
    return answer


async def twilio_status(url: str, auth_token: str, *, forged: bool = False, **form: str) -> int:
    """Twilio's status callback (the call's, or the ``<Stream>``'s), signed as its webhooks are."""
    params = {"AccountSid": "AC" + "0" * 32, **form}
    signature = twilio_signature("not-the-token" if forged else auth_token, url, params)
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(url, data=params, headers={"X-Twilio-Signature": signature})
    return response.status_code


def telnyx_headers(private_key: Any, body: bytes, at: float | None = None) -> dict[str, str]:
    stamp = str(int(at if at is not None else time.time()))
    signature = base64.b64encode(private_key.sign(stamp.encode() + b"|" + body)).decode()
    return {"telnyx-signature-ed25519": signature, "telnyx-timestamp": stamp}


async def telnyx_event(url: str, private_key: Any, event_type: str, **payload: str) -> int:
    """A Call Control webhook event (JSON, Ed25519-signed), as Telnyx sends ``call.hangup``."""
    body = json.dumps({"data": {"record_type": "event", "id": str(uuid.uuid4()), "event_type": event_type,
                                "payload": payload}}).encode()  # fmt: skip
    headers = {**telnyx_headers(private_key, body), "content-type": "application/json"}
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(url, content=body, headers=headers)
    return response.status_code


@dataclass
class Heard:
    at: float  # monotonic
    kind: str  # "media", "mark", "clear"
    name: str = ""


class MediaStream:
    """One call's stream, from Twilio's side: it sends the caller and plays what comes back."""

    twilio = True  # Twilio's spelling; TelnyxStream says the same in Telnyx's

    def __init__(
        self, ws: ClientConnection, parameters: dict[str, str], call_sid: str = "", encoding: str = "PCMU"
    ) -> None:
        self.ws = ws
        self.parameters = parameters
        self.encoding = encoding  # Telnyx only: what its start announces (and its media carries)
        self.stream_sid = f"MZ{uuid.uuid4().hex}"
        self.call_sid = call_sid or f"CA{uuid.uuid4().hex}"
        self.sequence = 0
        self.received: list[Heard] = []
        self.played = bytearray()  # μ-law the caller heard, in order
        self.acked: list[str] = []  # marks echoed after their audio played
        self.dropped: list[str] = []  # marks echoed because a clear dropped them
        self._queue: collections.deque[bytes | str] = collections.deque()  # audio and marks to play
        self._tasks: list[asyncio.Task[None]] = []

    async def _send(self, message: dict[str, Any]) -> None:
        self.sequence += 1
        if self.twilio:
            await self.ws.send(json.dumps({**message, "sequenceNumber": str(self.sequence)}))
            return
        message = {("stream_id" if k == "streamSid" else k): v for k, v in message.items()}
        await self.ws.send(json.dumps({**message, "sequence_number": str(self.sequence)}))

    async def start(self) -> None:
        if not self.twilio:  # Telnyx's "Media Streaming": connected, then start, snake case
            await self.ws.send(json.dumps({"event": "connected", "version": "1.0.0"}))
            await self._send({
                "event": "start", "streamSid": self.stream_sid,
                "start": {"user_id": str(uuid.uuid4()), "call_control_id": self.call_sid,
                          "media_format": {"encoding": self.encoding, "sample_rate": 8000, "channels": 1},
                          "custom_parameters": self.parameters},
            })  # fmt: skip
            self._tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._play())]
            return
        await self.ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await self._send({
            "event": "start", "streamSid": self.stream_sid,
            "start": {"accountSid": "AC" + "0" * 32, "streamSid": self.stream_sid, "callSid": self.call_sid,
                      "tracks": ["inbound"], "customParameters": self.parameters,
                      "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}},
        })  # fmt: skip
        self._tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._play())]

    async def speak(self, pcm16k: bytes, then_silence_s: float = 0.0) -> None:
        """The caller's audio, at real time, then silence (the line never goes quiet in bytes)."""
        line = to_line(pcm16k + bytes(2 * int(then_silence_s * 16000)), self.encoding)
        started = time.monotonic()
        for chunk, offset in enumerate(range(0, len(line), FRAME_BYTES), start=1):
            payload = base64.b64encode(line[offset : offset + FRAME_BYTES]).decode()
            await self._send({"event": "media", "streamSid": self.stream_sid,
                              "media": {"track": "inbound", "chunk": str(chunk),
                                        "timestamp": str(int(offset / 8)), "payload": payload}})  # fmt: skip
            await asyncio.sleep(max(0.0, started + chunk * FRAME_S - time.monotonic()))

    async def press(self, digit: str) -> None:
        await self._send({"event": "dtmf", "streamSid": self.stream_sid,
                          "dtmf": {"track": "inbound_track", "digit": digit}})  # fmt: skip

    async def hang_up(self) -> None:
        await self._send({"event": "stop", "streamSid": self.stream_sid,
                          "stop": {"accountSid": "AC" + "0" * 32, "callSid": self.call_sid}})  # fmt: skip

    async def _listen(self) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for raw in self.ws:
                message = json.loads(raw)
                if self.twilio:
                    assert message.get("streamSid") == self.stream_sid, message  # every reply names it
                event, now = message["event"], time.monotonic()
                if event == "media":
                    self.received.append(Heard(now, "media"))
                    self._queue.append(base64.b64decode(message["media"]["payload"]))
                elif event == "mark":
                    self.received.append(Heard(now, "mark", message["mark"]["name"]))
                    self._queue.append(message["mark"]["name"])
                elif event == "clear":
                    self.received.append(Heard(now, "clear"))
                    for item in list(self._queue):  # the marks not reached are sent back at once
                        if isinstance(item, str):
                            await self._echo(item, dropped=True)
                    self._queue.clear()
                else:
                    raise AssertionError(f"Twilio does not know {event!r}")

    async def _echo(self, name: str, dropped: bool = False) -> None:
        (self.dropped if dropped else self.acked).append(name)
        await self._send({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}})

    async def _play(self) -> None:
        """The caller's earpiece: 20 ms of audio every 20 ms; a mark is echoed when reached."""
        with contextlib.suppress(websockets.ConnectionClosed):
            next_at = time.monotonic()
            while True:
                while self._queue and isinstance(self._queue[0], str):
                    await self._echo(str(self._queue.popleft()))
                if self._queue:
                    audio = self._queue[0]
                    assert isinstance(audio, bytes)
                    self.played += audio[:FRAME_BYTES]
                    if len(audio) > FRAME_BYTES:
                        self._queue[0] = audio[FRAME_BYTES:]
                    else:
                        self._queue.popleft()
                next_at += FRAME_S
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    def idle_for(self) -> float:
        """Seconds since the last message from the server, once all it sent has played."""
        if self._queue or not self.received:
            return 0.0
        return time.monotonic() - self.received[-1].at

    def marks(self, kind: str = "mark") -> list[Heard]:
        return [h for h in self.received if h.kind == kind]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.ws.close()


class TelnyxStream(MediaStream):
    twilio = False


async def ring_telnyx(base: str, private_key: Any, *, at: float | None = None, **form: str) -> Answer:
    """Telnyx's TeXML request, signed with Ed25519 over ``<timestamp>|<body>``, and its TeXML."""
    params = {"CallSid": f"v3:{uuid.uuid4().hex}", "From": "+15550100", "To": "+15550199", **form}
    body = httpx.QueryParams(params).__str__().encode()
    headers = {**telnyx_headers(private_key, body, at), "content-type": "application/x-www-form-urlencoded"}
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(f"{base}/v1/telnyx/voice", content=body, headers=headers)
    answer = Answer.read(response)
    answer.call_sid = params["CallSid"]  # TeXML's call control id: the stream's start names it
    assert answer.status != 200 or answer.attributes["bidirectionalMode"] == "rtp", answer.body
    return answer


@contextlib.asynccontextmanager
async def streamed(
    answer: Answer, kind: type[MediaStream] = MediaStream, encoding: str = "PCMU", **parameters: str
) -> AsyncIterator[MediaStream]:
    """The carrier connecting to the ``<Stream>`` of ``answer`` (``parameters`` replace its own)."""
    async with websockets.connect(answer.stream_url, max_size=None) as ws:
        stream = kind(ws, {**answer.parameters, **parameters}, answer.call_sid, encoding)
        await stream.start()
        try:
            yield stream
        finally:
            await stream.close()


class CarrierApi(BaseHTTPRequestHandler):
    """A stand-in for the carriers' REST APIs, as documented: Twilio's Calls resource (create a
    call; update one's TwiML, a transfer) with basic auth and forms, Telnyx's TeXML calls and Call
    Control transfer with a bearer key and JSON. Account ``AC123``, TeXML application
    ``texml-app-1``."""

    requests: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0))).decode()
        CarrierApi.requests.append(
            {"path": self.path, "auth": self.headers.get("authorization"), "body": body}
        )
        if self.path.startswith("/2010-04-01/Accounts/AC123/Calls.json"):
            reply: dict[str, Any] = {"sid": "CAdialled", "status": "queued"}
        elif self.path.startswith("/2010-04-01/Accounts/AC123/Calls/"):
            reply = {"sid": self.path.rsplit("/", 1)[1].removesuffix(".json"), "status": "in-progress"}
        elif self.path.startswith("/v2/calls/") and self.path.endswith("/actions/transfer"):
            reply = {"data": {"result": "ok"}}
        elif self.path == "/v2/texml/calls/texml-app-1":
            reply = {"call_sid": "v3:dialled", "status": "queued"}
        else:
            self.send_response(404)
            self.end_headers()
            return
        data = json.dumps(reply).encode()
        self.send_response(201)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass
