"""A stand-in OpenAI-compatible speech server on loopback: a real HTTP server answering
``POST /v1/audio/speech`` (JSON: ``model``, ``voice``, ``input``, ``response_format``) with raw
16-bit mono PCM at 24 kHz, streamed in pieces, so the real ``openai`` client is what the engine
under test uses. Its "speech" is a tone per character (60 ms each, silence for spaces): what
matters is that its length follows the text. Every request is kept for tests to read."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import numpy as np

from tests.loopback import Loopback

RATE = 24_000
CHAR_S = 0.06


def speech_for(text: str) -> bytes:
    t = np.arange(int(RATE * CHAR_S)) / RATE
    tone = (np.sin(2 * np.pi * 220 * t) * 8000).astype("<i2").tobytes()
    silence = bytes(len(tone))
    return b"".join(silence if c.isspace() else tone for c in text)


@dataclass
class SpeechServer(Loopback):
    status: int = 200
    delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                server.requests.append(body)
                server.headers.append(dict(self.headers))
                time.sleep(server.delay_s)
                status = server.status if self.path == "/v1/audio/speech" else 404
                try:
                    if status != 200:
                        out = json.dumps({"error": {"message": "failed"}}).encode()
                        self.send_response(status)
                        self.send_header("content-type", "application/json")
                        self.send_header("content-length", str(len(out)))
                        self.end_headers()
                        self.wfile.write(out)
                        return
                    pcm = speech_for(str(body.get("input", "")))
                    self.send_response(200)
                    self.send_header("content-type", "audio/pcm")
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for i in range(0, len(pcm), 4800):  # 100 ms pieces, as a streaming server sends
                        piece = pcm[i : i + 4800]
                        self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:  # the client gave up waiting
                    pass

            def log_message(self, *_: Any) -> None:
                pass

        Loopback.__init__(self, Handler)
