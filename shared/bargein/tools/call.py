"""``bargein call``: talk to a running stack through its client edge, as any client would.

The client speaks only the public protocol (``docs/protocol.md``): ``POST /v1/sessions`` on the
edge, then the session's WebSocket as ``caller``. It streams a WAV file as the caller's microphone
(20 ms binary frames, at real time), or sends text turns, and prints a live timeline of what the
server reports: the user's speech starting and stopping, the agent's text as it streams, each turn
completed or cut off, errors, the end of the session. ``--json`` writes the same entries as JSON
lines (one object per entry) for scripts.

What the barge-in figure measures (``✂ turn T cleared N ms after ...``), all on this client's
monotonic clock, from a moment this client knows to the arrival of ``clear``:

* with audio, **from the barge-in audio**: the send time of the first frame of the speech run that
  was going on when ``clear`` arrived. The client finds speech runs in the audio it sends with a
  plain energy gate (a 20 ms frame above ``ONSET_DBFS`` starts a run; ``RUN_HANGOVER_MS`` of
  quieter frames end it), which is exact for clean recordings like the test fixtures and an
  estimate for noisy ones. The figure includes everything a caller waits for: the speech the
  service needs before a burst counts as a barge-in (``min_interruption_ms``), detection, the
  broker hops, the cancellation, and the way back. When the server's ``user_started_speaking``
  frame for that speech arrives before ``clear``, the time from it to ``clear`` is shown beside it
  ("after speech detection"); the edge may as well send ``clear`` first, then there is none;
* with text, from the moment the interrupting ``text`` frame was sent.

The edge announces a text turn to its clients as a burst of speech (``user_started_speaking``
then ``user_stopped_speaking``); a text call does not show that echo of its own turns.

The call ends when the server ends the session, or once the input is done (the WAV sent, or every
text turn sent and answered), no agent turn is streaming and nothing has arrived for
``listen_after_s``. While it listens after a WAV it keeps sending silence, as a phone line does,
so speech detection sees the caller's last turn end. It always hangs up with ``{"type": "end"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import sys
import time
import wave
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlencode, urlsplit, urlunsplit

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from bargein.agent.events import SAMPLE_RATE, SAMPLE_WIDTH
from bargein.edge.protocol import (
    AgentChunk,
    AudioFormat,
    AudioMark,
    Clear,
    DtmfFrame,
    End,
    ErrorCode,
    ErrorFrame,
    LogMetricFrame,
    Pause,
    Played,
    ProtocolError,
    Resume,
    ServerFrame,
    SpeakingStarted,
    SpeakingStopped,
    TextTurn,
    ToolCallFrame,
    ToolResultFrame,
    TransferFrame,
    TurnComplete,
    UserTranscript,
    frame_json,
    parse_server_frame,
)
from bargein.tasks import cancel_and_wait
from bargein.tools.earpiece import Earpiece
from bargein.tools.timeline import Timeline

FRAME_MS = 20
FRAME_BYTES = SAMPLE_RATE * FRAME_MS // 1000 * SAMPLE_WIDTH  # 640: 20 ms of 16-bit mono
ONSET_DBFS = -40.0  # a frame louder than this is speech for the barge-in measurement
RUN_HANGOVER_MS = 300.0  # this much quieter audio ends a speech run (pauses between words do not)

DEFAULT_LISTEN_AFTER_S = 3.0
ANSWER_WAIT_S = 20.0  # after the caller's turn ended, how long an answer may take to begin
GREETING_WAIT_S = 0.8  # before the first text, how long the agent has to start a greeting
MAX_LINGER_S = 120.0  # after the input is done, the call ends after this whatever is going on
HANGUP_WAIT_S = 3.0  # after sending "end", how long the "ended" frame may take
HTTP_TIMEOUT_S = 10.0

EXIT_OK = 0
EXIT_FAILED = 1  # the edge could not be reached, refused the session or broke the connection
EXIT_USAGE = 2  # a bad argument or input file (argparse uses 2 as well)


# what plays raw 16 kHz PCM16 on this machine's loudspeaker, in order of preference
PLAYERS = (
    ("play", ["-q", "-t", "raw", "-r", "16000", "-e", "signed-integer", "-b", "16", "-c", "1", "-"]),
    ("aplay", ["-q", "-t", "raw", "-f", "S16_LE", "-r", "16000", "-c", "1"]),
)


class CallError(Exception):
    """A failure to report in one line (no traceback) and exit with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- input -----------------------------------------------------------------------------------------


def read_wav(path: Path) -> bytes:
    """The PCM of a 16 kHz mono 16-bit WAV file. Anything else is refused, not converted: the
    protocol carries exactly that format, and a silent conversion would hide what was sent."""
    try:
        with wave.open(str(path), "rb") as wav:
            rate, channels, width = wav.getframerate(), wav.getnchannels(), wav.getsampwidth()
            if (rate, channels, width) != (SAMPLE_RATE, 1, SAMPLE_WIDTH):
                raise CallError(
                    f"{path}: {rate} Hz, {channels} channel(s), {8 * width}-bit; bargein call needs "
                    f"16000 Hz mono 16-bit PCM (e.g. sox IN.wav -r 16000 -c 1 -b 16 OUT.wav)",
                    EXIT_USAGE,
                )
            pcm = wav.readframes(wav.getnframes())
    except FileNotFoundError:
        raise CallError(f"{path}: no such file", EXIT_USAGE) from None
    except (wave.Error, EOFError) as exc:
        raise CallError(f"{path}: not a PCM WAV file ({exc})", EXIT_USAGE) from None
    except OSError as exc:
        raise CallError(f"{path}: cannot read it ({exc})", EXIT_USAGE) from None
    if not pcm:
        raise CallError(f"{path}: the file holds no audio", EXIT_USAGE)
    return pcm


def frames_of(pcm: bytes) -> list[bytes]:
    """``pcm`` cut into 20 ms frames (the last one shorter, still whole samples)."""
    return [pcm[i : i + FRAME_BYTES] for i in range(0, len(pcm), FRAME_BYTES)]


def frame_dbfs(frame: bytes) -> float:
    """The frame's RMS level in dB relative to full scale (-inf for digital silence)."""
    samples = memoryview(frame).cast("h")
    if not len(samples):
        return -math.inf
    mean_square = sum(s * s for s in samples) / len(samples)
    return -math.inf if mean_square == 0 else 10 * math.log10(mean_square / 32768.0**2)


class SpeechRuns:
    """Where speech runs begin in the audio this client sent, on its clock (see the module doc).

    ``onset()`` answers "when did the caller start the speech that is going on (or just ended)",
    which is the barge-in moment the ``clear`` latency is measured from."""

    def __init__(self, threshold_dbfs: float = ONSET_DBFS, hangover_ms: float = RUN_HANGOVER_MS) -> None:
        self.threshold_dbfs = threshold_dbfs
        self.hangover_s = hangover_ms / 1000
        self._run_start: float | None = None  # send time of the current (or last) run's first frame
        self._last_voiced: float | None = None

    def sent(self, frame: bytes, at: float) -> None:
        if frame_dbfs(frame) < self.threshold_dbfs:
            return
        if self._last_voiced is None or at - self._last_voiced > self.hangover_s:
            self._run_start = at
        self._last_voiced = at

    def onset(self, now: float, within_s: float = 2.0) -> float | None:
        """The start of the speech run going on at ``now``, or that ended at most ``within_s``
        before it; None if the caller has been quiet longer (that speech explains nothing now)."""
        if self._last_voiced is None or now - self._last_voiced > within_s:
            return None
        return self._run_start


# --- output ----------------------------------------------------------------------------------------

STALE_DETECTION_S = 10.0  # a user_started_speaking older than this explains no clear


def describe_clear(
    turn: int, now: float, *, onset: float | None, text_sent_at: float | None, detected_at: float | None
) -> tuple[str, dict[str, Any]]:
    """The timeline line and JSON fields for ``clear`` of ``turn`` arriving at ``now`` (monotonic).

    ``onset``: where the speech going on began in the audio sent (audio calls); ``text_sent_at``:
    when the interrupting text went out (text calls); ``detected_at``: the last
    ``user_started_speaking`` frame, which counts only if it belongs to this barge-in (it came
    after the onset or the text; the edge may also send it just after ``clear``)."""
    reference = onset if onset is not None else text_sent_at
    if detected_at is not None and (
        (reference is not None and detected_at < reference) or now - detected_at > STALE_DETECTION_S
    ):
        detected_at = None
    detection_ms = None if detected_at is None else (now - detected_at) * 1000
    fields: dict[str, Any] = {"turn": turn}
    if onset is not None:
        ms = (now - onset) * 1000
        after = "" if detection_ms is None else f" ({detection_ms:.0f} ms after speech detection)"
        text = f"✂ turn {turn} cleared {ms:.0f} ms after the barge-in audio{after}"
        fields.update(ms=round(ms, 1), measured_from="barge_in_audio")
    elif text_sent_at is not None:
        ms = (now - text_sent_at) * 1000
        text = f"✂ turn {turn} cleared {ms:.0f} ms after the interrupting text was sent"
        fields.update(ms=round(ms, 1), measured_from="text_sent")
    elif detection_ms is not None:
        text = f"✂ turn {turn} cleared {detection_ms:.0f} ms after speech detection"
        fields.update(ms=round(detection_ms, 1), measured_from="speech_detection")
    else:
        text = f"✂ turn {turn} cleared"
        fields.update(ms=None, measured_from=None)
    fields["ms_after_detection"] = None if detection_ms is None else round(detection_ms, 1)
    return text, fields


class CallTimeline:
    """The call's entries, printed for a person (:class:`~bargein.tools.timeline.Timeline`) or written as
    JSON lines (``{"t": seconds, "event": name, ...}``) for a script. Every entry goes through
    :meth:`entry`, so the two forms always say the same things."""

    def __init__(self, out: TextIO, *, json_lines: bool, t0: float | None = None) -> None:
        self.out = out
        self.json_lines = json_lines
        self.timeline = Timeline(out)
        if t0 is not None:  # share the clock of lines printed before the call (bargein demo)
            self.timeline.t0 = t0
        self._stream_turn: int | None = None

    def entry(self, event: str, who: str, line: str, **fields: Any) -> None:
        """One timeline entry: ``line`` for a person, ``event`` and ``fields`` for a script."""
        if self.json_lines:
            record = {"t": round(self.timeline.elapsed(), 3), "event": event, **fields}
            print(json.dumps(record, ensure_ascii=False), file=self.out, flush=True)
            return
        self._stream_turn = None
        self.timeline.line(who, line)

    def note(self, who: str, message: str) -> None:
        self.entry("note", who, f"({message})", message=message)

    def transcript(self, text: str, *, backchannel: bool = False) -> None:
        """What speech-to-text heard the caller say (a backchannel did not cut the agent off)."""
        line = f"  “{text}”" + (" (listening: not an interruption)" if backchannel else "")
        self.entry("user_transcript", "user", line, text=text, backchannel=backchannel)

    def action(
        self, frame: ToolCallFrame | ToolResultFrame | LogMetricFrame | DtmfFrame | TransferFrame
    ) -> None:
        """What the agent did besides speaking: a tool call or result, a metric, a key, a transfer."""
        if isinstance(frame, ToolCallFrame):
            line = f"⚙ calls {frame.name}({json.dumps(frame.arguments, ensure_ascii=False)})"
        elif isinstance(frame, ToolResultFrame):
            outcome = (
                f"failed: {frame.error}" if frame.error else json.dumps(frame.result, ensure_ascii=False)
            )
            line = f"⚙ {frame.name} → {outcome}"
        elif isinstance(frame, LogMetricFrame):
            line = f"▪ metric {frame.name} = {json.dumps(frame.value, ensure_ascii=False)}"
        elif isinstance(frame, DtmfFrame):
            line = f"☎ presses {frame.button}"
        else:
            line = f"☎ transfers the call to {frame.target_phone_number}" + (
                f" ({frame.reason})" if frame.reason else ""
            )
        fields = frame_json(frame)
        self.entry(str(fields.pop("type")), "agent", line, **fields)

    def chunk(self, turn: int, seq: int, text: str) -> None:
        if self.json_lines:
            self.entry("agent_chunk", "agent", text, turn=turn, seq=seq, text=text)
            return
        if self._stream_turn != turn:
            self.timeline.end_stream()
            self._stream_turn = turn
        self.timeline.stream(text)

    def close(self) -> None:
        if not self.json_lines:
            self.timeline.end_stream()


# --- the call --------------------------------------------------------------------------------------


@dataclass
class _Joined:
    session_id: str
    ws_url: str


def _base_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CallError(f"{url!r} is not the edge's base URL (http://host:port)", EXIT_USAGE)
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


async def create_session(
    base: str, *, agent_options: dict[str, Any] | None = None, turn_taking: dict[str, Any] | None = None
) -> tuple[_Joined, str]:
    """``POST /v1/sessions``; the session and its caller token, or a :class:`CallError`."""
    body: dict[str, Any] = {}
    if agent_options:
        body["agent_options"] = agent_options
    if turn_taking:
        body["turn_taking"] = turn_taking
    try:
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT_S) as http:
            response = await http.post(f"{base}/v1/sessions", json=body)
    except httpx.HTTPError as exc:
        raise CallError(f"cannot reach the edge at {base}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 201:
        detail = response.text[:300]
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            error = response.json()["error"]
            detail = f"{error['code']}: {error['message']}"
        raise CallError(f"the edge refused the session: HTTP {response.status_code} ({detail})")
    try:
        answer = response.json()
        joined = _Joined(str(answer["session_id"]), str(answer["ws_url"]))
        token = str(answer["token"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CallError(f"the edge's session answer is not what docs/protocol.md says: {exc!r}") from None
    return joined, token


class Loudspeaker:
    """This machine's loudspeaker (``--play``): the agent's voice as the earpiece plays it, piped to
    sox's ``play`` or ALSA's ``aplay``."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.fed = 0  # bytes of the earpiece's agent channel handed over so far

    @classmethod
    async def open(cls) -> Loudspeaker:
        for name, args in PLAYERS:
            path = shutil.which(name)
            if path is not None:
                proc = await asyncio.create_subprocess_exec(
                    path, *args, stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
                )
                return cls(proc)
        names = " or ".join(name for name, _ in PLAYERS)
        raise CallError(
            f"--play needs {names} on the PATH (apt-get install sox); --save-audio needs nothing", EXIT_USAGE
        )

    async def feed(self, ear: Earpiece) -> None:
        """Hand over what the earpiece has played since the last call."""
        pcm = bytes(ear.agent[self.fed :])
        self.fed += len(pcm)
        if pcm and self.proc.stdin is not None and self.proc.returncode is None:
            with contextlib.suppress(ConnectionError):
                self.proc.stdin.write(pcm)
                await self.proc.stdin.drain()

    async def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        with contextlib.suppress(TimeoutError, ProcessLookupError):
            async with asyncio.timeout(5):
                await self.proc.wait()
        if self.proc.returncode is None:
            self.proc.kill()


class Call:
    """One call: the WebSocket, the input being sent, and the timeline of what comes back."""

    def __init__(
        self,
        ws: ClientConnection,
        timeline: CallTimeline,
        *,
        audio: bytes | None,
        texts: Sequence[str],
        realtime: bool,
        listen_after_s: float,
        barge_in_after: int | None,
        earpiece: Earpiece | None = None,
        loudspeaker: Loudspeaker | None = None,
    ) -> None:
        self.ws = ws
        self.tl = timeline
        self.loudspeaker = loudspeaker
        self.earpiece = earpiece  # the agent's audio is played (and recorded) here, if any
        self.reports: list[tuple[int, int]] = []  # audio marks played, to report
        self.audio = audio
        self.texts = list(texts)
        self.realtime = realtime
        self.listen_after_s = listen_after_s
        self.barge_in_after = barge_in_after
        self.runs = SpeechRuns()
        self.changed = asyncio.Event()  # set on every frame from the server
        self.input_done = asyncio.Event()
        self.ended_reason: str | None = None
        self.fatal: str | None = None  # an error frame the server closes the connection after
        self.streaming: int | None = None  # the turn whose chunks are arriving
        self.chunks: dict[int, int] = {}  # turn -> chunks received
        self.finished_turns: set[int] = set()  # completed or cleared
        self.fenced_upto = 0  # chunks of turns up to this one were cleared: never shown
        self.last_activity = time.monotonic()
        self.answer_due: float | None = None  # the caller's turn ended then; no answer yet
        self.detected_at: float | None = None  # last user_started_speaking frame
        self.text_sent_at: float | None = None
        # the edge announces each text turn to every client as a burst of speech (a
        # user_started_speaking, user_stopped_speaking pair): not the caller talking, not shown
        self.text_echoes = 0
        self.echoing = False

    # --- receiving -------------------------------------------------------------------------------

    async def receive(self) -> None:
        async for message in self.ws:
            self.last_activity = time.monotonic()
            if isinstance(message, bytes):
                if self.earpiece is None:
                    self.tl.note("edge", f"ignored a {len(message)}-byte binary frame")
                else:
                    self.reports += self.earpiece.audio(message, self.last_activity)
            else:
                self.on_frame(message)
            await self.report_played()
            self.changed.set()

    async def play(self) -> None:
        """Keep the earpiece playing at real time, and report the marks it passes."""
        assert self.earpiece is not None
        while True:
            await asyncio.sleep(FRAME_MS / 1000)
            self.reports += self.earpiece.advance(time.monotonic())
            await self.report_played()
            if self.loudspeaker is not None:
                await self.loudspeaker.feed(self.earpiece)

    async def report_played(self) -> None:
        reports, self.reports = self.reports, []
        for turn, mark in reports:
            await self.ws.send(json.dumps(frame_json(Played(type="played", turn=turn, mark=mark))))

    def on_frame(self, raw: str) -> None:
        try:
            frame = parse_server_frame(raw)
        except ProtocolError:
            self.tl.note("edge", f"ignored a frame that is not protocol JSON: {raw[:80]!r}")
            return
        self.dispatch(frame)

    def dispatch(self, frame: ServerFrame) -> None:
        now = time.monotonic()
        if isinstance(frame, AgentChunk):
            turn = frame.turn
            if turn <= self.fenced_upto or turn in self.finished_turns:
                return  # the edge guarantees this never happens; a client must not show it anyway
            if turn not in self.chunks:  # a new turn: the answer that was due has begun
                self.answer_due = None
            self.streaming = turn
            self.chunks[turn] = self.chunks.get(turn, 0) + 1
            self.tl.chunk(turn, frame.seq, frame.text)
        elif isinstance(frame, TurnComplete):
            turn = frame.turn
            self.finished_turns.add(turn)
            if self.streaming == turn:
                self.streaming = None
            self.answer_due = None
            self.tl.entry("turn_complete", "agent", f"▪ turn {turn} complete", turn=turn)
        elif isinstance(frame, Clear):
            self.on_clear(frame.turn, now)
        elif isinstance(frame, SpeakingStarted):
            if self.text_echoes and not self.echoing:
                self.echoing = True
                return
            self.detected_at = now
            self.tl.entry("user_started_speaking", "user", "▸ starts speaking")
        elif isinstance(frame, SpeakingStopped):
            if self.echoing:
                self.echoing = False
                self.text_echoes -= 1
                return
            self.answer_due = now
            self.tl.entry("user_stopped_speaking", "user", "▸ stops speaking")
        elif isinstance(frame, UserTranscript):
            self.tl.transcript(frame.text, backchannel=frame.backchannel)
        elif isinstance(frame, ToolCallFrame | ToolResultFrame | LogMetricFrame | DtmfFrame | TransferFrame):
            self.tl.action(frame)
        elif isinstance(frame, ErrorFrame):
            if frame.code in ErrorCode.FATAL:
                self.fatal = f"{frame.code}: {frame.message}"
            self.tl.entry(
                "error", "edge", f"✗ {frame.code}: {frame.message}", code=frame.code, message=frame.message
            )
        elif isinstance(frame, AudioFormat | AudioMark | Pause | Resume):
            self.on_audio_frame(frame, now)
        else:
            self.ended_reason = frame.reason
            self.tl.entry("ended", "system", f"session ended ({self.ended_reason})", reason=self.ended_reason)

    def on_audio_frame(self, frame: AudioFormat | AudioMark | Pause | Resume, now: float) -> None:
        ear = self.earpiece
        if ear is None:
            return
        if isinstance(frame, AudioMark):
            self.reports += ear.mark(frame.turn, frame.mark, now)
        elif isinstance(frame, Pause):
            audible = ear.playing
            self.reports += ear.pause(now)
            onset = self.runs.onset(now) if self.audio is not None else None
            after = "" if onset is None else f" {(now - onset) * 1000:.0f} ms after you began speaking"
            if audible:
                self.tl.entry("pause", "edge", f"⏸ the agent's voice paused{after}", turn=frame.turn)
        elif isinstance(frame, Resume):
            self.reports += ear.resume(now)
            self.tl.entry(
                "resume", "edge", "▶ it was not a barge-in: the agent's voice goes on", turn=frame.turn
            )

    def on_clear(self, turn: int, now: float) -> None:
        if self.earpiece is not None:
            self.reports += self.earpiece.clear(now)
        self.fenced_upto = max(self.fenced_upto, turn)
        self.finished_turns.add(turn)
        if self.streaming is not None and self.streaming <= turn:
            self.streaming = None
        onset = self.runs.onset(now) if self.audio is not None else None
        text_at = self.text_sent_at if self.audio is None else None
        text, fields = describe_clear(
            turn, now, onset=onset, text_sent_at=text_at, detected_at=self.detected_at
        )
        fields["chunks_before"] = self.chunks.get(turn, 0)
        self.tl.entry("clear", "edge", text, **fields)

    # --- sending ---------------------------------------------------------------------------------

    async def send_audio(self, audio: bytes) -> None:
        frames = frames_of(audio)
        start = time.monotonic()
        for i, frame in enumerate(frames):
            if self.realtime:
                await _sleep_until(start + i * FRAME_MS / 1000)
            self.runs.sent(frame, time.monotonic())
            if self.earpiece is not None:
                self.earpiece.said(frame, time.monotonic())
            await self.ws.send(frame)
        self.tl.entry(
            "audio_done",
            "user",
            f"(all {len(audio) / 2 / SAMPLE_RATE:.2f} s of audio sent; silence from now on)",
            seconds=round(len(audio) / 2 / SAMPLE_RATE, 3),
        )
        self.last_activity = time.monotonic()
        self.input_done.set()
        silence = bytes(FRAME_BYTES)
        start = time.monotonic()
        for i in range(1, 1 << 62):  # the line stays open until the call ends (this task is cancelled)
            await _sleep_until(start + i * FRAME_MS / 1000)
            self.runs.sent(silence, time.monotonic())
            await self.ws.send(silence)

    async def send_texts(self) -> None:
        await self._let_the_agent_greet()
        for i, text in enumerate(self.texts):
            if i:
                await self._before_next_text()
            self.text_echoes += 1
            await self.ws.send(json.dumps(frame_json(TextTurn(type="text", text=text))))
            self.text_sent_at = self.answer_due = time.monotonic()
            self.tl.entry("user_text", "user", f'"{text}"', text=text)
        self.last_activity = time.monotonic()
        self.input_done.set()

    async def _let_the_agent_greet(self) -> None:
        """A caller lets the agent's greeting finish before speaking (else the first text cuts it
        off, and the greeting's end is taken for the answer to that text): wait for a greeting to
        begin, briefly, and if one does, for its end."""
        began = time.monotonic()
        while self.ended_reason is None and not self.chunks and time.monotonic() - began < GREETING_WAIT_S:
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.05)
        deadline = time.monotonic() + ANSWER_WAIT_S
        while self.ended_reason is None and self.streaming is not None and time.monotonic() < deadline:
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.1)

    async def _before_next_text(self) -> None:
        """Wait for the previous answer: its end, or with ``barge_in_after`` that many of its chunks."""
        deadline = time.monotonic() + ANSWER_WAIT_S + MAX_LINGER_S
        while time.monotonic() < deadline and self.ended_reason is None:
            turn = self.streaming
            if turn is None and self.answer_due is None:
                return  # answered (or cleared)
            if (
                turn is not None
                and self.barge_in_after is not None
                and self.chunks.get(turn, 0) >= self.barge_in_after
            ):
                return
            if self.answer_due is not None and time.monotonic() - self.answer_due > ANSWER_WAIT_S:
                return  # no answer is coming; go on
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.1)

    async def until_done(self) -> None:
        """Return when the call is over: ended by the server, or the input done and the line quiet."""
        await self.input_done.wait()
        done_at = time.monotonic()
        while self.ended_reason is None and self.fatal is None:
            now = time.monotonic()
            if now - done_at > MAX_LINGER_S:
                self.tl.note("system", f"still busy {MAX_LINGER_S:.0f} s after the input ended; hanging up")
                return
            waiting_answer = self.answer_due is not None and now - self.answer_due < ANSWER_WAIT_S
            if (
                self.streaming is None
                and not waiting_answer
                and now - self.last_activity >= self.listen_after_s
            ):
                return
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.05)

    async def run(self) -> None:
        receiver = asyncio.create_task(self.receive(), name="call-receive")
        sender = asyncio.create_task(
            self.send_audio(self.audio) if self.audio is not None else self.send_texts(), name="call-send"
        )
        done = asyncio.create_task(self.until_done(), name="call-done")
        pending: set[asyncio.Task[None]] = {receiver, sender, done}
        player = asyncio.create_task(self.play(), name="call-play") if self.earpiece is not None else None
        try:
            while receiver in pending and done in pending:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if sender in finished and not sender.cancelled():
                    failure = sender.exception()
                    # a closed connection ends the receiver too, after it has read what was buffered
                    if failure is not None and not isinstance(failure, ConnectionClosed):
                        raise failure
        finally:
            for task in (sender, done, *([player] if player is not None else [])):
                with contextlib.suppress(ConnectionClosed):
                    await cancel_and_wait(task)
        if receiver.done():
            receiver.result()  # raises ConnectionClosed on an abnormal close
        else:
            await self.hang_up(receiver)

    async def hang_up(self, receiver: asyncio.Task[None]) -> None:
        """Send ``end`` and wait briefly for the server's ``ended`` and close."""
        if self.ended_reason is None:
            with contextlib.suppress(ConnectionClosed):
                await self.ws.send(json.dumps(frame_json(End(type="end"))))
                self.tl.entry("hangup", "user", "(hangs up)")
        try:
            await asyncio.wait_for(asyncio.shield(receiver), HANGUP_WAIT_S)
        except (TimeoutError, ConnectionClosed):
            pass
        finally:
            with contextlib.suppress(ConnectionClosed):
                await cancel_and_wait(receiver)


async def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    await asyncio.sleep(max(delay, 0.0))


def _join_url(ws_url: str, token: str, *, audio: bool = False) -> str:
    params = {"token": token, "role": "caller"}
    if audio:  # hear the agent, and report what was played
        params.update(audio="pcm16", reports="played")
    parts = urlsplit(ws_url)
    query = "&".join(q for q in (parts.query, urlencode(params)) if q)
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, ""))


async def run_call(
    url: str,
    wav: Path | None,
    text: str | Sequence[str] | None,
    *,
    json_lines: bool,
    out: TextIO = sys.stdout,
    realtime: bool = True,
    listen_after_s: float = DEFAULT_LISTEN_AFTER_S,
    barge_in_after: int | None = None,
    agent_options: dict[str, Any] | None = None,
    turn_taking: dict[str, Any] | None = None,
    err: TextIO = sys.stderr,
    t0: float | None = None,
    save_audio: Path | None = None,
    play: bool = False,
) -> int:
    """Run one call against the edge at ``url`` (``http://host:port``); the exit code.

    ``text`` may be several turns: each is sent once the previous one's answer ended, or, with
    ``barge_in_after=N``, once N chunks of it arrived (the next text then barges in). Failures are
    printed to ``err`` in one line and give a non-zero code (see ``EXIT_*``)."""
    texts = [text] if isinstance(text, str) else list(text or [])
    try:
        if (wav is None) == (not texts):
            raise CallError("give either a WAV file or text to send, not both or neither", EXIT_USAGE)
        audio = read_wav(wav) if wav is not None else None
        return await _call(
            _base_url(url),
            audio,
            texts,
            CallTimeline(out, json_lines=json_lines, t0=t0),
            realtime=realtime,
            listen_after_s=listen_after_s,
            barge_in_after=barge_in_after,
            agent_options=agent_options,
            turn_taking=turn_taking,
            save_audio=save_audio,
            play=play,
        )
    except CallError as exc:
        print(f"bargein call: {exc}", file=err, flush=True)
        return exc.exit_code


async def _call(
    base: str,
    audio: bytes | None,
    texts: list[str],
    tl: CallTimeline,
    *,
    realtime: bool,
    listen_after_s: float,
    barge_in_after: int | None,
    agent_options: dict[str, Any] | None,
    turn_taking: dict[str, Any] | None,
    save_audio: Path | None = None,
    play: bool = False,
) -> int:
    loudspeaker = await Loudspeaker.open() if play else None
    joined, token = await create_session(base, agent_options=agent_options, turn_taking=turn_taking)
    earpiece = Earpiece(time.monotonic()) if save_audio is not None or play else None
    tl.entry(
        "session", "system", f"session {joined.session_id} at {base}", session_id=joined.session_id, url=base
    )
    try:
        url = _join_url(joined.ws_url, token, audio=earpiece is not None)
        async with connect(url, open_timeout=HTTP_TIMEOUT_S) as ws:
            call = Call(
                ws,
                tl,
                audio=audio,
                texts=texts,
                realtime=realtime,
                listen_after_s=listen_after_s,
                barge_in_after=barge_in_after,
                earpiece=earpiece,
                loudspeaker=loudspeaker,
            )
            with contextlib.suppress(ConnectionClosed):
                await call.run()
            code, reason = ws.close_code, ws.close_reason
    except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
        raise CallError(f"cannot open the session's WebSocket {joined.ws_url}: {exc}") from None
    finally:
        if loudspeaker is not None:
            await loudspeaker.close()
        if earpiece is not None and save_audio is not None:
            earpiece.advance(time.monotonic())
            seconds = earpiece.save(save_audio)
            tl.note(
                "system", f"the call's audio ({seconds:.1f} s; you left, the agent right) is in {save_audio}"
            )
        tl.close()
    if call.fatal is not None:
        raise CallError(f"the edge closed the connection: {call.fatal}")
    if call.ended_reason is None and code not in (None, 1000):
        raise CallError(f"the edge closed the connection unexpectedly (code {code}: {reason or 'no reason'})")
    return EXIT_OK


def main(
    url: str,
    wav: Path | None = None,
    text: str | Sequence[str] | None = None,
    *,
    json_lines: bool = False,
    listen_after_s: float = DEFAULT_LISTEN_AFTER_S,
    barge_in_after: int | None = None,
    agent_options: dict[str, Any] | None = None,
    turn_taking: dict[str, Any] | None = None,
    save_audio: Path | None = None,
    play: bool = False,
) -> int:
    """``bargein call``: the synchronous entry point the CLI calls."""
    try:
        return asyncio.run(
            run_call(
                url,
                wav,
                text,
                json_lines=json_lines,
                listen_after_s=listen_after_s,
                barge_in_after=barge_in_after,
                agent_options=agent_options,
                turn_taking=turn_taking,
                save_audio=save_audio,
                play=play,
            )
        )
    except KeyboardInterrupt:
        return 130
