"""A stand-in OpenAI-compatible speech-to-text server on loopback: a real HTTP server answering
``POST /v1/audio/transcriptions`` (multipart form: ``file``, ``model``, ``language``,
``response_format``) with ``{"text": ...}``, so the real ``openai`` client is what the engine under
test uses. ``answer(wav_bytes, fields)`` decides each reply (the text, or an HTTP error status, after
an optional delay); every request is kept for tests to read."""

from __future__ import annotations

import email.parser
import email.policy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.loopback import Loopback


@dataclass
class Answer:
    text: str = ""
    status: int = 200
    delay_s: float = 0.0


@dataclass
class Upload:
    path: str
    authorization: str
    fields: dict[str, str]
    file: bytes
    filename: str


def parse_form(content_type: str, body: bytes) -> tuple[dict[str, str], bytes, str]:
    """(fields, file bytes, file name) of a multipart/form-data body."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    fields: dict[str, str] = {}
    data, filename = b"", ""
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if part.get_filename():
            data, filename = payload, part.get_filename() or ""
        elif name:
            fields[str(name)] = payload.decode()
    return fields, data, filename


class SttServer(Loopback):
    def __init__(self, answer: Callable[[bytes, dict[str, str]], Answer]) -> None:
        self.answer = answer
        self.uploads: list[Upload] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                fields, data, filename = parse_form(self.headers.get("content-type", ""), body)
                auth = self.headers.get("authorization", "")
                server.uploads.append(Upload(self.path, auth, fields, data, filename))
                reply = server.answer(data, fields)
                time.sleep(reply.delay_s)
                if self.path != "/v1/audio/transcriptions":
                    reply = Answer(status=404)
                payload: dict[str, Any] = (
                    {"text": reply.text} if reply.status == 200 else {"error": {"message": "failed"}}
                )
                out = json.dumps(payload).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:  # the client gave up waiting
                    pass

            def log_message(self, *_: Any) -> None:
                pass

        Loopback.__init__(self, Handler)
