"""A stand-in for Google's Gemini API on loopback: a real HTTP server speaking the
``generateContent`` and ``streamGenerateContent`` (server-sent events) JSON shapes, so the real
``google-genai`` client (pointed at it with ``GOOGLE_GEMINI_BASE_URL``) is what the agents under test
use. Each reply is decided by ``answer(body)``: text pieces, streamed one event each, and function
calls. Every request is kept (path, headers, body), for tests to read what the agent sent.

Service processes reach it over loopback as well as the test's own agents do.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Reply:
    pieces: list[str] = field(default_factory=list)  # streamed one server-sent event each
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (function, args)
    delay_s: float = 0.0  # between pieces


def default_answer(request: dict[str, Any]) -> Reply:
    """Echo the last user text back in three pieces; ``[slow]`` streams them slowly, ``[bye]`` asks
    for ``end_call``."""
    text = last_user_text(request)
    if "[bye]" in text:
        return Reply(calls=[("end_call", {"goodbye_message": "Goodbye!"})])
    words = f"You said {text.replace('[slow]', '').strip()}.".split(" ")
    pieces = [" ".join(words[i : i + 2]) + " " for i in range(0, len(words), 2)]
    pieces[-1] = pieces[-1].rstrip()
    return Reply(pieces=pieces, delay_s=0.3 if "[slow]" in text else 0.0)


def contents(request: Request | dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of each entry of a request's conversation (a request, or its body)."""
    body = request.body if isinstance(request, Request) else request
    return [
        (entry.get("role", ""), "".join(part.get("text", "") for part in entry.get("parts", [])))
        for entry in body.get("contents", [])
    ]


def last_user_text(request: dict[str, Any]) -> str:
    return next((text for role, text in reversed(contents(request)) if role == "user"), "")


class GeminiStandIn:
    def __init__(self, answer: Callable[[dict[str, Any]], Reply] = default_answer) -> None:
        self.answer = answer
        self.requests: list[Request] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, name="gemini", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> GeminiStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                stand_in.requests.append(Request(self.path, dict(self.headers), body))
                reply = stand_in.answer(body)
                if re.search(r":streamGenerateContent", self.path):
                    self._stream(reply)
                else:
                    self._send(200, _response([{"text": "".join(reply.pieces)}, *_calls(reply)]))

            def _stream(self, reply: Reply) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                parts = [[{"text": piece}] for piece in reply.pieces] + (
                    [_calls(reply)] if reply.calls else []
                )
                try:
                    for i, part in enumerate(parts):
                        if i and reply.delay_s:
                            time.sleep(reply.delay_s)
                        self.wfile.write(f"data: {json.dumps(_response(part))}\r\n\r\n".encode())
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):  # the agent was cut off: fine
                    pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def _calls(reply: Reply) -> list[dict[str, Any]]:
    return [{"functionCall": {"name": name, "args": args}} for name, args in reply.calls]


def _response(parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}],
        "modelVersion": "stand-in",
    }
