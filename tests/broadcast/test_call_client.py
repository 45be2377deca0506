"""``bargein call`` (:mod:`bargein.tools.call`).

Two groups:

* Against a small protocol double of the edge written here from ``docs/protocol.md`` (a Starlette
  app served by uvicorn in the test's loop): the client's own behaviour, which the real stack
  cannot provoke on demand (refused sessions, a bad token, a clear at a known audio moment) and
  the byte-level facts (20 ms frames, real-time pacing, the JSON-lines form). The double is not
  what is tested; the client is, through its public entry point ``run_call``.
* Against the real stack (``conftest.stack``: the broadcast, reasoning and speech services as
  processes over RabbitMQ and Redis): a text conversation with a barge-in, and the fixture WAV
  with a question and a barge-in.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import struct
import time
import uuid
import wave
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from bargein.tools.call import EXIT_FAILED, EXIT_OK, EXIT_USAGE, FRAME_BYTES, run_call
from tests.broadcast.conftest import FIXTURES, Stack, free_port

RATE = 16_000

# --- a protocol double of the edge ------------------------------------------------------------------


@dataclass
class FakeSession:
    session_id: str
    frames: list[tuple[float, int]] = field(default_factory=list)  # (arrival time, bytes)
    texts: list[str] = field(default_factory=list)
    ended: bool = False


class FakeEdge:
    """Speaks the edge's side of docs/protocol.md with scripted behaviour: each user turn (a text,
    or a burst of loud audio followed by ``STOP_MS`` of quiet) gets an answer of ``words`` words,
    one every ``word_delay`` s; speech that lasts ``START_MS`` (or a text) while an answer streams
    clears it, as the real edge does on a barge-in."""

    START_MS = 100  # audio time of loud audio before user_started_speaking
    STOP_MS = 300  # audio time of quiet that ends the user's turn

    def __init__(self, *, words: int = 12, word_delay: float = 0.03) -> None:
        self.words = words
        self.word_delay = word_delay
        self.refuse_sessions = False
        self.reject_tokens = False
        self.end_after_answer = False  # the agent ends the call after its first answer
        self.greeting_delay: float | None = None  # the agent greets this long after the caller joins
        self.sessions: dict[str, FakeSession] = {}
        self.app = Starlette(
            routes=[
                Route("/v1/sessions", self.create, methods=["POST"]),
                WebSocketRoute("/v1/sessions/{session_id}/ws", self.join),
            ]
        )

    async def create(self, request: Request) -> JSONResponse:
        if self.refuse_sessions:
            return JSONResponse({"error": {"code": "bad_request", "message": "no sessions today"}}, 400)
        sid = uuid.uuid4().hex
        self.sessions[sid] = FakeSession(sid)
        host = request.headers["host"]
        return JSONResponse(
            {
                "session_id": sid,
                "token": f"caller-{sid}",
                "listener_token": f"listener-{sid}",
                "ws_url": f"ws://{host}/v1/sessions/{sid}/ws",
            },
            201,
        )

    async def join(self, ws: WebSocket) -> None:
        await ws.accept()
        sid = ws.path_params["session_id"]
        if self.reject_tokens or ws.query_params.get("token") != f"caller-{sid}":
            await ws.send_json({"type": "error", "code": "invalid_token", "message": "bad token"})
            await ws.close(4401)
            return
        await _FakeConnection(self, ws, self.sessions[sid]).run()


class _FakeConnection:
    def __init__(self, edge: FakeEdge, ws: WebSocket, session: FakeSession) -> None:
        self.edge = edge
        self.ws = ws
        self.session = session
        self.lock = asyncio.Lock()
        self.turn = 0
        self.answer: asyncio.Task[None] | None = None
        self.audio_ms = 0.0
        self.loud_ms = 0.0
        self.quiet_ms = 0.0
        self.speaking = False

    async def send(self, frame: dict[str, Any]) -> None:
        async with self.lock:
            await self.ws.send_json(frame)

    async def run(self) -> None:
        if self.edge.greeting_delay is not None:
            await asyncio.sleep(self.edge.greeting_delay)
            self.start_answer()
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("bytes") is not None:
                    await self.on_audio(message["bytes"])
                    continue
                frame = json.loads(message["text"])
                if frame["type"] == "text":
                    self.session.texts.append(frame["text"])
                    await self.barge_in()
                    self.start_answer()
                elif frame["type"] == "end":
                    self.session.ended = True
                    await self.send({"type": "ended", "reason": "caller hung up"})
                    await self.ws.close(1000)
                    return
        except WebSocketDisconnect:
            return
        finally:
            if self.answer is not None:
                self.answer.cancel()

    async def on_audio(self, data: bytes) -> None:
        self.session.frames.append((time.monotonic(), len(data)))
        samples = struct.unpack(f"<{len(data) // 2}h", data)
        loud = max((abs(s) for s in samples), default=0) > 1000
        ms = len(samples) / RATE * 1000
        self.audio_ms += ms
        if loud:
            self.loud_ms += ms
            self.quiet_ms = 0
            if not self.speaking and self.loud_ms >= FakeEdge.START_MS:
                self.speaking = True
                await self.send({"type": "user_started_speaking"})
                await self.barge_in()
        else:
            self.quiet_ms += ms
            self.loud_ms = 0
            if self.speaking and self.quiet_ms >= FakeEdge.STOP_MS:
                self.speaking = False
                await self.send({"type": "user_stopped_speaking"})
                self.start_answer()

    async def barge_in(self) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.cancel()
            await self.send({"type": "clear", "turn": self.turn})

    def start_answer(self) -> None:
        self.turn += 1
        self.answer = asyncio.create_task(self.stream(self.turn))

    async def stream(self, turn: int) -> None:
        for seq in range(self.edge.words):
            await asyncio.sleep(self.edge.word_delay)
            await self.send({"type": "agent_chunk", "turn": turn, "seq": seq, "text": f"w{turn}.{seq} "})
        await self.send({"type": "turn_complete", "turn": turn})
        if self.edge.end_after_answer:
            await self.send({"type": "ended", "reason": "agent"})
            await self.ws.close(1000)


@pytest.fixture
async def fake_edge() -> AsyncIterator[tuple[FakeEdge, str]]:
    edge = FakeEdge()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(edge.app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield edge, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)


# --- helpers ------------------------------------------------------------------------------------------


def write_wav(path: Path, pcm: bytes, *, rate: int = RATE, channels: int = 1, width: int = 2) -> Path:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(pcm)
    return path


def tone(ms: float, amplitude: int = 8000) -> bytes:
    n = int(RATE * ms / 1000)
    return struct.pack(f"<{n}h", *(int(amplitude * math.sin(2 * math.pi * 440 * i / RATE)) for i in range(n)))


def silence(ms: float) -> bytes:
    return bytes(int(RATE * ms / 1000) * 2)


def entries(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def of(records: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == event]


def chunks_after_clear(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chunks of a cleared turn (or an earlier one) shown after its clear: must be none."""
    bad = []
    fenced = 0
    for r in records:
        if r["event"] == "clear":
            fenced = max(fenced, r["turn"])
        elif r["event"] == "agent_chunk" and r["turn"] <= fenced:
            bad.append(r)
    return bad


# --- against the protocol double --------------------------------------------------------------------


async def test_text_turn_as_json_lines(fake_edge: tuple[FakeEdge, str]) -> None:
    edge, url = fake_edge
    out, err = io.StringIO(), io.StringIO()
    code = await run_call(url, None, "hello there", json_lines=True, out=out, err=err, listen_after_s=0.3)
    assert code == EXIT_OK, err.getvalue()
    records = entries(out)
    events = [r["event"] for r in records]
    assert events[0] == "session"
    assert events[1] == "user_text" and records[1]["text"] == "hello there"
    chunks = of(records, "agent_chunk")
    assert [c["seq"] for c in chunks] == list(range(edge.words))
    assert {c["turn"] for c in chunks} == {1}
    assert "".join(c["text"] for c in chunks).startswith("w1.0 w1.1 ")
    assert [r["turn"] for r in of(records, "turn_complete")] == [1]
    assert events[-2:] == ["hangup", "ended"]
    assert all(isinstance(r["t"], float) for r in records)
    session = edge.sessions[records[0]["session_id"]]
    assert session.texts == ["hello there"] and session.ended


async def test_text_barge_in_is_measured_from_the_text(fake_edge: tuple[FakeEdge, str]) -> None:
    edge, url = fake_edge
    edge.words, edge.word_delay = 40, 0.05
    out, err = io.StringIO(), io.StringIO()
    code = await run_call(
        url,
        None,
        ["first", "second"],
        json_lines=True,
        out=out,
        err=err,
        listen_after_s=0.3,
        barge_in_after=3,
    )
    assert code == EXIT_OK, err.getvalue()
    records = entries(out)
    (clear,) = of(records, "clear")
    assert clear["turn"] == 1 and clear["measured_from"] == "text_sent"
    assert clear["ms"] >= 0 and clear["chunks_before"] >= 3
    texts = of(records, "user_text")
    assert [t["text"] for t in texts] == ["first", "second"]
    assert texts[1]["t"] <= clear["t"]
    assert chunks_after_clear(records) == []
    assert [c["turn"] for c in of(records, "turn_complete")] == [2]


async def test_wav_streamed_in_20ms_frames_at_real_time_with_a_measured_barge_in(
    fake_edge: tuple[FakeEdge, str], tmp_path: Path
) -> None:
    edge, url = fake_edge
    edge.words, edge.word_delay = 30, 0.05
    # a question, the end of the turn, an answer starting, a barge-in over it, the end of that turn
    pcm = silence(200) + tone(400) + silence(500) + tone(400) + silence(500)
    wav = write_wav(tmp_path / "call.wav", pcm)
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    code = await run_call(url, wav, None, json_lines=True, out=out, err=err, listen_after_s=0.3)
    assert code == EXIT_OK, err.getvalue()
    records = entries(out)
    session = edge.sessions[records[0]["session_id"]]

    wav_frames = len(pcm) // FRAME_BYTES
    sizes = [n for _, n in session.frames]
    assert len(sizes) > wav_frames  # the WAV, then silence while listening
    assert set(sizes) == {FRAME_BYTES}
    arrivals = [at for at, _ in session.frames]
    assert (
        arrivals[wav_frames - 1] - arrivals[0] >= 0.9 * (wav_frames - 1) * 0.020
    )  # not faster than real time
    assert time.monotonic() - started >= 2.0

    events = [r["event"] for r in records]
    assert events.count("user_started_speaking") == 2 and events.count("user_stopped_speaking") == 2
    (clear,) = of(records, "clear")
    assert clear["turn"] == 1 and clear["measured_from"] == "barge_in_audio"
    # measured from the first loud frame of the second burst, which the double detects only after
    # 100 ms of it: the figure includes that (no lower bound asserted: pacing may bunch frames)
    assert clear["ms"] > 0
    assert clear["ms_after_detection"] is not None and clear["ms_after_detection"] <= clear["ms"]
    assert chunks_after_clear(records) == []
    assert [c["turn"] for c in of(records, "turn_complete")] == [2]
    assert of(records, "audio_done")[0]["seconds"] == pytest.approx(len(pcm) / 2 / RATE, abs=0.001)


async def test_human_timeline(fake_edge: tuple[FakeEdge, str]) -> None:
    edge, url = fake_edge
    edge.words, edge.word_delay = 30, 0.05
    out, err = io.StringIO(), io.StringIO()
    code = await run_call(
        url,
        None,
        ["first", "second"],
        json_lines=False,
        out=out,
        err=err,
        listen_after_s=0.3,
        barge_in_after=2,
    )
    assert code == EXIT_OK, err.getvalue()
    text = out.getvalue()
    lines = text.splitlines()
    assert any("session" in line and url in line for line in lines)
    assert any('"first"' in line for line in lines)
    cut = next(line for line in lines if "✂ turn 1 cleared" in line)
    assert "ms after the interrupting text was sent" in cut
    answer = next(line for line in lines if "w2.0 w2.1" in line)
    assert "agent" in answer and "w2.29" in answer  # the whole second answer on one streamed line
    assert any("turn 2 complete" in line for line in lines)
    assert all(line.startswith("[") for line in lines)


async def test_the_server_ending_the_session_ends_the_call(fake_edge: tuple[FakeEdge, str]) -> None:
    edge, url = fake_edge
    edge.end_after_answer = True
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    code = await run_call(url, None, "bye", json_lines=True, out=out, err=err, listen_after_s=30)
    assert code == EXIT_OK, err.getvalue()
    events = [r["event"] for r in entries(out)]
    assert events[-2:] == ["turn_complete", "ended"] and "hangup" not in events
    assert time.monotonic() - started < 30  # it did not wait for the quiet period


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("stereo", "16000 Hz mono 16-bit"),
        ("8khz", "8000 Hz"),
        ("8bit", "8-bit"),
        ("missing", "no such file"),
        ("garbage", "not a PCM WAV"),
        ("empty", "no audio"),
    ],
)
async def test_bad_wav_is_refused_before_connecting(tmp_path: Path, kind: str, message: str) -> None:
    path = tmp_path / f"{kind}.wav"
    if kind == "stereo":
        write_wav(path, silence(100) * 2, channels=2)
    elif kind == "8khz":
        write_wav(path, silence(100), rate=8000)
    elif kind == "8bit":
        write_wav(path, bytes(800), width=1)
    elif kind == "garbage":
        path.write_bytes(b"this is not a wav file at all")
    elif kind == "empty":
        write_wav(path, b"")
    out, err = io.StringIO(), io.StringIO()
    # nothing listens at this URL: a bad file must be reported before any connection is tried
    code = await run_call("http://127.0.0.1:9", path, None, json_lines=False, out=out, err=err)
    assert code == EXIT_USAGE
    assert message in err.getvalue() and err.getvalue().startswith("bargein call: ")
    assert out.getvalue() == ""


async def test_unreachable_edge() -> None:
    out, err = io.StringIO(), io.StringIO()
    url = f"http://127.0.0.1:{free_port()}"
    code = await run_call(url, None, "hi", json_lines=True, out=out, err=err)
    assert code == EXIT_FAILED
    assert f"cannot reach the edge at {url}" in err.getvalue()


async def test_refused_session(fake_edge: tuple[FakeEdge, str]) -> None:
    edge, url = fake_edge
    edge.refuse_sessions = True
    out, err = io.StringIO(), io.StringIO()
    code = await run_call(url, None, "hi", json_lines=True, out=out, err=err)
    assert code == EXIT_FAILED
    assert "HTTP 400 (bad_request: no sessions today)" in err.getvalue()


async def test_rejected_token(fake_edge: tuple[FakeEdge, str]) -> None:
    edge, url = fake_edge
    edge.reject_tokens = True
    out, err = io.StringIO(), io.StringIO()
    code = await run_call(url, None, "hi", json_lines=True, out=out, err=err)
    assert code == EXIT_FAILED
    assert "invalid_token" in err.getvalue()
    assert [r["code"] for r in of(entries(out), "error")] == ["invalid_token"]


async def test_text_and_wav_together_is_a_usage_error(tmp_path: Path) -> None:
    err = io.StringIO()
    wav = write_wav(tmp_path / "a.wav", silence(100))
    assert await run_call("http://127.0.0.1:9", wav, "hi", json_lines=False, out=io.StringIO(), err=err) == 2
    assert await run_call("http://127.0.0.1:9", None, None, json_lines=False, out=io.StringIO(), err=err) == 2


# --- against the real stack -------------------------------------------------------------------------


async def test_real_text_conversation_with_a_barge_in(stack: Stack) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = await run_call(
        stack.url,
        None,
        ["What is the weather like?", "Actually, tell me a story instead."],
        json_lines=True,
        out=out,
        err=err,
        listen_after_s=1.0,
        barge_in_after=3,
    )
    assert code == EXIT_OK, err.getvalue() + stack.logs()
    records = entries(out)
    clears = of(records, "clear")
    assert len(clears) == 1, records
    cut = clears[0]["turn"]
    assert clears[0]["measured_from"] == "text_sent" and clears[0]["ms"] >= 0
    assert chunks_after_clear(records) == []
    by_turn: dict[int, list[int]] = {}
    for c in of(records, "agent_chunk"):
        by_turn.setdefault(c["turn"], []).append(c["seq"])
    for turn, seqs in by_turn.items():
        assert seqs == list(range(len(seqs))), f"turn {turn}: seqs {seqs}"  # once, in order, no gaps
    assert len(by_turn[cut]) >= 3
    completed = [c["turn"] for c in of(records, "turn_complete")]
    assert len(completed) == 1 and completed[0] > cut
    answer = "".join(c["text"] for c in of(records, "agent_chunk") if c["turn"] == completed[0])
    assert len(answer.split()) >= 10
    assert of(records, "ended"), records  # the hang-up ended the session and the edge said so


async def test_real_wav_question_then_barge_in(stack: Stack) -> None:
    wav = FIXTURES / "barge_in.wav"
    out, err = io.StringIO(), io.StringIO()
    code = await run_call(stack.url, wav, None, json_lines=True, out=out, err=err, listen_after_s=1.5)
    assert code == EXIT_OK, err.getvalue() + stack.logs()
    records = entries(out)
    events = [r["event"] for r in records]
    assert events.count("user_started_speaking") >= 2, events
    assert events.count("user_stopped_speaking") >= 1, events
    first_chunk = events.index("agent_chunk")
    assert events.index("user_stopped_speaking") < first_chunk  # the answer follows the first turn
    clears = of(records, "clear")
    assert len(clears) == 1, records
    assert clears[0]["measured_from"] == "barge_in_audio"
    # the service waits min_interruption_ms of speech before a burst counts: the figure includes it
    assert clears[0]["ms"] > 0
    assert chunks_after_clear(records) == []


async def test_the_caller_lets_the_agents_greeting_finish_before_its_first_text(
    fake_edge: tuple[FakeEdge, str],
) -> None:
    # an agent that greets (Line's examples do): the first text used to cut the greeting off, and
    # the greeting's end was taken for the answer, so the second text cut off the first answer
    edge, url = fake_edge
    edge.greeting_delay, edge.words = 0.2, 5
    out, err = io.StringIO(), io.StringIO()
    code = await run_call(url, None, ["hello", "more"], json_lines=True, out=out, err=err, listen_after_s=0.3)
    assert code == EXIT_OK, err.getvalue()
    records = entries(out)
    assert of(records, "clear") == []  # nothing was cut off
    assert [r["turn"] for r in of(records, "turn_complete")] == [1, 2, 3]  # greeting, two answers
    events = [r["event"] for r in records]
    first_text = events.index("user_text")
    assert events.index("turn_complete") < first_text  # the greeting ended before the caller spoke


def test_the_timeline_shows_what_the_agent_did_besides_speaking_and_what_the_caller_said() -> None:
    from bargein.edge.protocol import DtmfFrame, LogMetricFrame, ToolCallFrame, ToolResultFrame, TransferFrame
    from bargein.tools.call import CallTimeline

    for json_lines in (True, False):
        out = io.StringIO()
        tl = CallTimeline(out, json_lines=json_lines)
        tl.transcript("Book a table.")
        tl.transcript("Uh-huh.", backchannel=True)
        tl.action(ToolCallFrame(turn=1, seq=1, name="record_answer", arguments={"answer": "42"}, id="c1"))
        tl.action(ToolResultFrame(turn=1, seq=2, name="record_answer", error="no such field"))
        tl.action(LogMetricFrame(turn=1, seq=3, name="form_completed", value=1))
        tl.action(DtmfFrame(turn=1, seq=4, button="5"))
        tl.action(TransferFrame(turn=1, seq=5, target_phone_number="+14155550100"))
        tl.close()
        if json_lines:
            records = [json.loads(line) for line in out.getvalue().splitlines()]
            kinds = ["user_transcript", "user_transcript", "tool_call", "tool_result", "log_metric"]
            assert [r["event"] for r in records] == [*kinds, "dtmf", "transfer"]
            assert records[1]["backchannel"] is True and records[2]["arguments"] == {"answer": "42"}
            assert (
                records[3]["error"] == "no such field" and records[6]["target_phone_number"] == "+14155550100"
            )
        else:
            text = out.getvalue()
            assert "“Book a table.”" in text and "not an interruption" in text
            assert 'calls record_answer({"answer": "42"})' in text and "failed: no such field" in text
            assert "metric form_completed = 1" in text and "presses 5" in text and "+14155550100" in text
