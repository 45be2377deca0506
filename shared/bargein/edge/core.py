"""The edge's core: sessions, connections, fencing, and the bus on both sides.

Each broadcast process has one queue of its own (:meth:`Transport.open_edge_queue`) bound to the
sessions it has clients for; :meth:`Edge.on_event` takes every event from it, in order, and turns
it into frames for that session's connections. Nothing of an interrupted turn passes the session's
:class:`~bargein.wire.fence.TurnFence`; frames already queued for a connection are purged on ``clear``.

Each connection has a bounded :class:`Outbox` drained by its own writer task, so one slow client
can only fill its own outbox; when that overflows the client is told ``slow_client`` and cut off.

A session with a connection that joined with ``audio=pcm16`` also has a
:class:`~bargein.voice.speaker.Voice` (when the process has a speech engine, ``BARGEIN_TTS``): the
agent's text is spoken, the audio paced to those connections by one ticker for the whole process
(:meth:`Edge._voice_loop`), and what the caller heard is then what was played, to the word.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from starlette.websockets import WebSocket

from bargein import metrics
from bargein.agent.events import (
    SAMPLE_WIDTH,
    AgentError,
    AgentGenerationComplete,
    AgentPlayback,
    AgentResponse,
    AudioFrame,
    DTMFInputEvent,
    DTMFOutputEvent,
    EndCall,
    Event,
    FalseInterruption,
    InterruptPolicy,
    LogMetric,
    OutputMissed,
    SessionError,
    ToolCall,
    ToolResult,
    TransferCall,
    TurnInterrupted,
    UserBackchannel,
    UserOnsetDismissed,
    UserSpeechOnset,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.message import Source
from bargein.edge.limits import ClientLimits
from bargein.edge.protocol import (
    TURN_FRAMES,
    AgentChunk,
    AnyClientMessage,
    AnyServerFrame,
    AudioFormat,
    AudioMark,
    Clear,
    DtmfFrame,
    End,
    Ended,
    ErrorCode,
    ErrorFrame,
    Interrupt,
    KeyPress,
    LogMetricFrame,
    Pause,
    Played,
    Resume,
    SpeakingStarted,
    SpeakingStopped,
    TextTurn,
    ToolCallFrame,
    ToolResultFrame,
    TransferFrame,
    TurnComplete,
    UserTranscript,
    frame_json,
)
from bargein.edge.records import DirectoryKeeper
from bargein.edge.tokens import Role
from bargein.errors import BrokerUnavailable, UnroutableError
from bargein.hosting.load import LoopLag
from bargein.hosting.sessions import create_session, end_session, forget_unowned_sides
from bargein.metrics import Counted
from bargein.settings import BroadcastSettings, VoiceSettings
from bargein.tasks import cancel_and_wait
from bargein.transport.abc import EdgeQueue, StateStore, Transport
from bargein.voice import player
from bargein.voice.engines import Synthesizer
from bargein.voice.phrases import PhraseRules
from bargein.voice.player import FRAME_MS
from bargein.voice.speaker import Voice
from bargein.wire.envelope import Envelope, new_session_id
from bargein.wire.fence import TurnFence
from bargein.wire.heard import HeardLog
from bargein.wire.names import IN, TIER_REASONING, TIER_SPEECH, VOICE_OPTION
from bargein.wire.order import Gap, TurnOrder
from bargein.wire.playback import Playback
from bargein.wire.session_info import SessionInfo

log = logging.getLogger("bargein.edge")


@dataclass(frozen=True)
class AudioOut:
    """The agent's audio for one connection: a binary frame (PCM16 at 16 kHz) of ``turn``."""

    turn: int
    pcm: bytes


Frame = AnyServerFrame | AudioOut
CLOSE_SLOW = 1013
CLOSE_GOING_AWAY = 1001
HISTORY_FRAMES = 512  # replayed to a session's first connection (a greeting sent before it joined)
IDLE_FORGET_S = 60.0  # a session with no connections here is dropped from this process after this
BACKLOG_INTERVAL_S = 0.5
HOUSEKEEPING_S = 5.0  # how often sessions with no connections here are looked at
HANG_UP_RETRY_S = 0.5  # between tellings of a hang-up the broker did not take
STALLED_AFTER = 3  # a turn silent this many BARGEIN_RESEND_WAIT_MS without its end is asked for the rest
SESSIONS_PER_STEP = 1_000  # the report loop lets what waits go first after this many sessions


AGENT_ACTIONS = (ToolCall, ToolResult, LogMetric, DTMFOutputEvent, TransferCall)


def action_frame(envelope: Envelope, event: Event) -> Frame:
    """What the agent did besides speaking, as the frame clients get (Line's harness outputs)."""
    at = {"turn": envelope.turn, "seq": envelope.seq}
    if isinstance(event, ToolCall):
        return ToolCallFrame(**at, name=event.tool_name, arguments=event.tool_args, id=event.tool_call_id)
    if isinstance(event, ToolResult):
        return ToolResultFrame(
            **at, name=event.tool_name, result=event.result, error=event.error, id=event.tool_call_id
        )
    if isinstance(event, LogMetric):
        return LogMetricFrame(**at, name=event.name, value=event.value)
    if isinstance(event, DTMFOutputEvent):
        return DtmfFrame(**at, button=event.button)
    if isinstance(event, TransferCall):
        return TransferFrame(**at, target_phone_number=event.target_phone_number, reason=event.reason)
    raise TypeError(f"not an agent action: {type(event).__name__}")


def _turn_of(frame: Frame) -> int:
    """The turn a frame belongs to (0: none; session-level frames are never purged)."""
    return frame.turn if isinstance(frame, (*TURN_FRAMES, AudioOut)) else 0


class Outbox:
    """Frames waiting to be written to one connection, at most ``limit`` of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.frames: collections.deque[Frame] = collections.deque()
        self._ready = asyncio.Event()
        self._sent = asyncio.Event()  # set while the writer waits with nothing left to send

    def put(self, frame: Frame) -> bool:
        if len(self.frames) >= self.limit:
            return False
        self.frames.append(frame)
        self._ready.set()
        self._sent.clear()
        return True

    def put_first(self, frame: Frame) -> None:
        """Control frames (``clear``, errors) go ahead of everything queued, whatever the limit."""
        self.frames.appendleft(frame)
        self._ready.set()
        self._sent.clear()

    def purge_audio(self) -> None:
        """The client's buffer was cleared for a pause: the audio queued behind is sent again later."""
        self.frames = collections.deque(f for f in self.frames if not isinstance(f, AudioOut | AudioMark))

    def purge_turns(self, upto: int) -> int:
        kept = [f for f in self.frames if not 0 < _turn_of(f) <= upto]
        dropped = len(self.frames) - len(kept)
        self.frames = collections.deque(kept)
        return dropped

    async def get(self) -> Frame:
        """The next frame (for the writer, which asks again once it has sent the last one)."""
        while not self.frames:
            self._sent.set()
            self._ready.clear()
            await self._ready.wait()
        return self.frames.popleft()

    async def all_sent(self) -> None:
        """Return once the writer has sent everything queued and waits for more."""
        await self._sent.wait()


class Wire(Protocol):
    """How frames reach one client: the edge's own protocol (:class:`JsonWire`) or a phone
    carrier's (:mod:`bargein.edge.phone`), which says the same things in its own messages."""

    drops_buffer_on_pause: bool  # it cannot pause playback, only clear it (a carrier's `clear`)

    async def send(self, frame: Frame) -> None: ...

    async def close(self, code: int, last: AnyServerFrame | None) -> None: ...


class JsonWire:
    """docs/protocol.md: JSON frames, and the agent's audio as binary frames."""

    drops_buffer_on_pause = False

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    async def send(self, frame: Frame) -> None:
        if isinstance(frame, AudioOut):
            await self.ws.send_bytes(frame.pcm)
        else:
            await self.ws.send_json(frame_json(frame))

    async def close(self, code: int, last: AnyServerFrame | None) -> None:
        if last is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):  # a stuck client may never take it
                    await self.ws.send_json(frame_json(last))
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self.ws.close(code)


class Connection:
    def __init__(
        self,
        wire: Wire,
        session: EdgeSession,
        role: Role,
        reports_played: bool,
        limit: int,
        limits: ClientLimits,
        audio: str | None = None,
    ) -> None:
        self.wire = wire
        self.session = session
        self.role = role
        self.reports_played = reports_played
        self.audio = audio  # the format it asked for (``pcm16``), or None: text only
        self.outbox = Outbox(limit)
        self.limits = limits
        self.closed = False
        self.told_unavailable = False  # one `unavailable` frame per outage for dropped audio
        self.writer: asyncio.Task[None] | None = None

    @property
    def counts_as_sent(self) -> bool:
        """A caller's text that was sent counts as heard: it reports nothing and hears no audio."""
        return self.role == "caller" and not self.reports_played and self.audio is None

    @property
    def clock_counts(self) -> bool:
        """A caller hearing the agent's audio who does not report playback: the server's clock
        says what it heard."""
        return self.role == "caller" and not self.reports_played and self.audio is not None

    def start(self) -> None:
        self.writer = asyncio.create_task(self._write(), name=f"ws-writer:{self.session.session_id}")

    def send(self, frame: Frame) -> None:
        if self.closed:
            return
        if not self.outbox.put(frame):
            self.closed = True  # from now on nothing more is queued for it
            self.session.edge.count("slow_clients")
            log.warning(
                "session %s: a %s fell %d frames behind; disconnecting it",
                self.session.session_id,
                self.role,
                self.outbox.limit,
            )
            slow = ErrorFrame(code=ErrorCode.SLOW_CLIENT, message="too far behind")
            self.session.edge.spawn(self._shut(CLOSE_SLOW, slow))

    async def _write(self) -> None:
        try:
            while True:
                frame = await self.outbox.get()
                await self.wire.send(frame)
                if isinstance(frame, AgentChunk) and self.counts_as_sent:
                    self.session.delivered(frame.turn, frame.seq)
        except Exception as exc:  # the socket went away; the endpoint's receive loop notices too
            log.debug("writer for session %s stopped: %s", self.session.session_id, exc)
            self.closed = True

    async def close_when_sent(self, code: int = 1000, within_s: float = 2.0) -> None:
        """Close once what is queued for this connection has gone out (or ``within_s`` has passed)."""
        if not self.closed and self.writer is not None and not self.writer.done():
            # waited for, not polled: a thousand callers hanging up at once polling every 10 ms
            # kept the event loop too busy to send what they were waiting for
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within_s):
                    await self.outbox.all_sent()
        await self.close(code)

    async def close(self, code: int = 1000, last: AnyServerFrame | None = None) -> None:
        if self.closed:
            return
        self.closed = True
        await self._shut(code, last)

    async def _shut(self, code: int, last: AnyServerFrame | None) -> None:
        if self.writer is not None:
            self.writer.cancel()
        await self.wire.close(code, last)


class EdgeSession:
    """One session as this edge process sees it."""

    def __init__(self, edge: Edge, session_id: str, *, from_start: bool = False) -> None:
        """``from_start``: this edge created the session (heard it before its owner could speak)."""
        self.edge = edge
        self.session_id = session_id
        self.connections: set[Connection] = set()
        self.fence = TurnFence()
        # what came after a lost chunk waits for it
        self.order: TurnOrder[Event] = TurnOrder(from_start=from_start)
        self.order_timers: dict[int, asyncio.TimerHandle] = {}  # per turn: when to stop waiting
        self.owner_epoch = 0  # the reasoning owner's epoch, as confirmed by the state store
        self.policy: set[str] = set()
        self.highest_turn = 0
        self.highest_began = 0.0  # when the highest turn's first chunk reached this edge (wall clock)
        self.completed: set[int] = set()
        self.history: collections.deque[Frame] = collections.deque(maxlen=HISTORY_FRAMES)
        self.joined_once = False
        self.heard = HeardLog()  # what every owner is told when it starts
        self.ended = False
        self.end_reason: str | None = None
        self.idle_since: float | None = time.monotonic()
        # when the call is over unless a caller is connected (wall clock, as the store keeps it;
        # None: this edge only listens, the one that created the session keeps the first deadline)
        self.alone_until: float | None = None
        self.playback = Playback()  # told to the speech tier as it changes, in order
        self.playback_lock = asyncio.Lock()
        self.voice: Voice | None = None  # the agent's voice, once a connection wants audio
        self.paused_since: float | None = None  # a soft barge-in holds the voice since then
        self._audio_turn = 0  # the turn whose audio went out last
        self.turn_ended_at: float | None = None  # the caller's last turn ended then (monotonic)
        self._last_seq: dict[int, int] = {}  # per recent turn, the last chunk sent

    def broadcast(self, frame: Frame) -> None:
        self.history.append(frame)
        for connection in list(self.connections):
            connection.send(frame)

    def attach(self, connection: Connection) -> None:
        replay = (
            list(self.history)
            if not self.joined_once
            else [
                f
                for f in self.history
                if _turn_of(f) == self.highest_turn and self.highest_turn not in self.completed
            ]
        )
        self.joined_once = True
        self.connections.add(connection)
        self.idle_since = None
        for frame in replay:
            if not self.fence.is_fenced(_turn_of(frame)):
                connection.send(frame)

    def detach(self, connection: Connection) -> None:
        self.connections.discard(connection)
        if not self.connections:
            self.idle_since = time.monotonic()
        if connection.role == "caller" and not self.has_caller:  # the call may be over: a grace to rejoin
            self.alone_until = time.time() + self.edge.settings.reconnect_grace_s

    @property
    def has_caller(self) -> bool:
        return any(c.role == "caller" for c in self.connections)

    def clear(self, turn: int, why: str, since: float | None = None) -> None:
        """Cut ``turn`` off for every connection now (``since``: when the barge-in was published)."""
        if turn <= 0 or not self.fence.interrupt(turn):
            return
        self.order.forget(turn)  # nothing of a cut turn waits for a lost chunk any more
        if since is not None:
            metrics.INTERRUPT_TO_CLEAR.observe(metrics.since(since))
        self.edge.count("clears")
        dropped = 0
        for connection in self.connections:
            dropped += connection.outbox.purge_turns(turn)
            connection.outbox.put_first(Clear(turn=turn))
        self.history = collections.deque(
            (f for f in self.history if not 0 < _turn_of(f) <= turn), maxlen=HISTORY_FRAMES
        )
        if self.voice is not None:  # what the caller heard up to now, and no more of it
            self.voice_outputs(self.voice.clear(turn, time.monotonic()))
            self.paused_since = None
        self.heard.cut(turn)
        self.edge.report_soon(self)  # how far the caller heard it: the owner cuts its history there
        self.tell_speech(self.playback.cleared(turn))
        log.info(
            "session %s: turn %d cleared (%s); %d queued frames dropped", self.session_id, turn, why, dropped
        )

    @property
    def agent_audible(self) -> bool:
        """The agent's voice is still playing to the caller (its text may have ended long ago)."""
        return self.voice is not None and self.voice.player.playing

    def barged_in(self, why: str, since: float, published_at: float | None = None) -> None:
        """The caller began a turn (``UserStartedSpeaking``): cut off what plays now, if the owner's
        policy says that turn always ends so (``InterruptPolicy``; otherwise the owner decides, and
        says so with ``TurnInterrupted``). ``published_at``: see :meth:`cuttable`."""
        cut = self.cuttable(published_at)
        if UserStartedSpeaking.type_name() in self.policy and cut:
            self.clear(cut, why, since=since)

    def cuttable(self, published_at: float | None = None) -> int:
        """The turn a barge-in now cuts off: one still streaming, or one whose audio still plays.
        With ``published_at`` (a barge-in from the bus: when it was published), none that reached
        this edge only after that: it may be the answer to the very turn the barge-in began (a
        caller's typed text, whose own barge-in came back from the broker after its answer's first
        chunk, cleared the answer), and the owner, which has the caller's events in their order,
        says with ``TurnInterrupted`` whether it is cut."""
        if published_at is not None and self.highest_began >= published_at:
            return 0
        if self.highest_turn not in self.completed or self.agent_audible:
            return self.highest_turn
        return 0

    def delivered(self, turn: int, seq: int, chars: int | None = None) -> None:
        self.heard.heard(turn, seq, chars)  # reported by the report loop
        self.tell_speech(self.playback.heard(turn, seq))

    # --- the agent's voice -----------------------------------------------------------------------

    def speak(self, turn: int, seq: int, text: str) -> None:
        """A chunk went out as text: the voice speaks it (or, without one, it reaches the caller now)."""
        self._last_seq[turn] = seq
        if len(self._last_seq) > HISTORY_FRAMES:
            self._last_seq.pop(min(self._last_seq))
        if self.voice is not None:
            self.voice.text(turn, seq, text)
        else:
            self.tell_speech(self.playback.sent(turn, seq))

    def spoken(self, turn: int) -> None:
        """The agent finished ``turn``'s text."""
        if self.voice is not None:
            self.voice.complete(turn)
        else:
            self.tell_speech(self.playback.complete(turn))

    def voice_outputs(self, outputs: list[player.Output]) -> None:
        """Send what the voice's player produced: audio and marks to the connections that hear the
        agent; what the clock says was heard, for the callers that do not report it themselves."""
        listeners = [c for c in self.connections if c.audio is not None]
        for out in outputs:
            if isinstance(out, player.Audio):
                if out.turn != self._audio_turn:
                    self._audio_turn = out.turn
                    if self.turn_ended_at is not None:  # the answer's first sound
                        metrics.TURN_TO_FIRST_AUDIO.observe(time.monotonic() - self.turn_ended_at)
                        self.turn_ended_at = None
                self.tell_speech(self.playback.sent(out.turn, self._last_seq.get(out.turn, 0)))
                for connection in listeners:
                    connection.send(AudioOut(out.turn, out.pcm))
            elif isinstance(out, player.Mark):
                mark = AudioMark(turn=out.turn, mark=out.mark, seq=out.seq, chars=out.chars, word=out.word)
                for connection in listeners:
                    connection.send(mark)
            elif isinstance(out, player.Heard):
                if any(c.clock_counts for c in listeners):
                    self.delivered(out.turn, out.seq, out.chars)
            elif isinstance(out, player.Done):
                self.tell_speech(self.playback.played_out(out.turn))

    def played_mark(self, turn: int, mark: int) -> None:
        """A client that reports playback has played audio mark ``mark`` of ``turn``."""
        position = self.voice.player.mark_position(turn, mark) if self.voice is not None else None
        if position is None:
            self.edge.count("unknown_marks")
            return
        self.delivered(turn, *position)

    def soft_pause(self, now: float) -> bool:
        """The caller may be starting to speak: silence the agent now, and wait for the verdict.
        Whether its voice was playing (and is now paused)."""
        if self.voice is None or self.paused_since is not None or not self.voice.player.playing:
            return False
        self.voice_outputs(self.voice.pause(now))
        clearing = [c for c in self.connections if c.audio is not None and c.wire.drops_buffer_on_pause]
        if clearing:  # a phone line can only clear: what it drops is sent again on resume
            self.voice.player.rewind(now)
            for connection in clearing:
                connection.outbox.purge_audio()
        self.paused_since = now
        self.edge.count("soft_pauses")
        for connection in self.connections:
            if connection.audio is not None:
                connection.outbox.put_first(Pause(turn=self._audio_turn))
        log.info("session %s: the caller may be speaking; the agent's voice is paused", self.session_id)
        return True

    def soft_resume(self, now: float, why: str) -> None:
        """It was not a barge-in: the agent's voice goes on where it paused."""
        if self.voice is None or self.paused_since is None:
            return
        self.voice.resume(now)
        self.paused_since = None
        self.edge.count("soft_resumes")
        for connection in self.connections:
            if connection.audio is not None:
                connection.outbox.put_first(Resume(turn=self._audio_turn))
        log.info("session %s: the agent's voice resumes (%s)", self.session_id, why)

    def tell_speech(self, speaking: bool | None) -> None:
        """The agent started or stopped reaching the caller: tell the session's speech owner
        (:class:`AgentPlayback`, so a burst over the agent is judged by its words)."""
        if speaking is not None:
            self.edge.spawn(self.edge.playback(self, speaking))


class Edge:
    def __init__(
        self,
        transport: Transport,
        store: StateStore,
        settings: BroadcastSettings,
        *,
        owner: str,
        max_frame_bytes: int,
        overload_lag_ms: float = 500.0,
        synthesizer: Synthesizer | None = None,
        voice_settings: VoiceSettings | None = None,
        status_interval_s: float = 30.0,
    ) -> None:
        self.status_interval_s = status_interval_s  # the status line (BARGEIN_STATUS_INTERVAL_S)
        self.transport = transport
        self.store = store
        self.settings = settings
        self.synthesizer = synthesizer  # None: text only (BARGEIN_TTS=none)
        self.voice_settings = voice_settings or VoiceSettings()
        self.owner = owner
        self.max_frame_bytes = max_frame_bytes
        self.load = LoopLag(overload_lag_ms, name=f"edge {owner}", sessions=lambda: len(self.sessions))
        self.backlog = 0  # chunks waiting for this process in the broker, as last asked
        self.sessions: dict[str, EdgeSession] = {}
        self.voiced: dict[str, EdgeSession] = {}  # those with a voice: what the voice loop walks
        self.counters: collections.Counter[str] = Counted("edge")
        self.records = DirectoryKeeper(store, transport, self.count)  # what Redis lost with an owner
        self.queue: EdgeQueue | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self.stopping = False  # set as the edge starts sending its clients away
        self._seq = 0

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @property
    def consuming(self) -> bool:
        return self.queue is not None

    @property
    def overloaded(self) -> bool:
        """Behind on its queue, or its event loop running late: it takes no new sessions (and says
        it is not ready) until it has caught up; its sessions keep running."""
        return self.backlog > self.settings.overload_backlog or self.load.overloaded

    async def start(self) -> None:
        self.queue = await self.transport.open_edge_queue(self.owner, self.on_event)
        self.load.start()
        self._tasks = [
            asyncio.create_task(self._report_loop(), name="edge-reports"),
            asyncio.create_task(self._housekeeping(), name="edge-housekeeping"),
            asyncio.create_task(self._backlog_loop(), name="edge-backlog"),
            asyncio.create_task(self._caller_loop(), name="edge-callers"),
        ]
        if self.synthesizer is not None:
            self._tasks.append(asyncio.create_task(self._voice_loop(), name="edge-voice"))

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        await self.load.stop()
        await self.send_clients_away()
        if self.queue is not None:
            await self.queue.cancel()
            self.queue = None

    async def send_clients_away(self) -> None:
        """Tell every client connected here that this edge is stopping (``shutting_down``, then
        close 1001), so that it joins again through another edge; the sessions go on without it."""
        self.stopping = True
        going = ErrorFrame(code=ErrorCode.SHUTTING_DOWN, message="edge restarting")
        connections = [c for session in self.sessions.values() for c in session.connections if not c.closed]
        if connections:  # (none left when Edge.stop comes after the server's shutdown did this)
            log.info("stopping: sending %d client(s) to another edge", len(connections))
        # all at once: one by one, each may take its close's time-out, and a thousand took minutes
        await asyncio.gather(*(c.close(CLOSE_GOING_AWAY, going) for c in connections))

    # --- sessions --------------------------------------------------------------------------------

    async def create_session(
        self,
        agent_options: dict[str, Any],
        turn_taking: dict[str, Any],
        voice: str | None = None,
        *,
        join_within_s: float | None = None,
    ) -> str:
        """A new session; it ends unless its caller joins within ``join_within_s`` (by default the
        reconnect grace, ``BARGEIN_RECONNECT_GRACE_S``)."""
        session_id = new_session_id()
        # listen first: nothing the agent says first is missed, so its first chunk lost is a gap
        session = await self._track(session_id, from_start=True)
        session.alone_until = time.time() + (join_within_s or self.settings.reconnect_grace_s)
        await self.store.expect_callers({session_id: session.alone_until})
        options = {**agent_options, "turn_taking": turn_taking}
        if voice is not None:
            options[VOICE_OPTION] = voice
        info = SessionInfo(session_id, options, edge_reports_delivery=True)
        self.records.remember(session_id, info.encode())
        # the agent's tier last: by the time it can say anything (or decline the call) all exist
        await create_session(self.transport, self.store, info, tier=TIER_SPEECH)
        await create_session(self.transport, self.store, info, tier=TIER_REASONING)
        self.count("sessions_created")
        log.info("session %s created", session_id)
        return session_id

    async def _track(self, session_id: str, *, from_start: bool = False) -> EdgeSession:
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = EdgeSession(self, session_id, from_start=from_start)
            metrics.SESSIONS.labels("edge").set(len(self.sessions))
            assert self.queue is not None
            await self.queue.add_session(session_id)
        return session

    async def listen(self, session_id: str) -> None:
        """Receive ``session_id``'s output in this process from now on (a caller is about to join)."""
        await self._track(session_id)

    async def known(self, session_id: str) -> bool:
        """Whether a socket may join ``session_id`` here. A session that ended after its caller had
        joined is unknown at once, not only once this edge has forgotten it (``_end`` tidies up for a
        moment after the other tiers): its caller coming back is told ``unknown_session`` whichever
        edge it reaches. One that ended before any caller joined (a rejected call) stays known, so
        its caller hears why."""
        session = self.sessions.get(session_id)
        if session is not None:
            return not (session.ended and session.joined_once)
        return await self.store.session_info(TIER_REASONING, session_id) is not None

    async def join(
        self, session_id: str, wire: Wire, role: Role, reports_played: bool, audio: str | None = None
    ) -> Connection:
        session = await self._track(session_id)
        limits = ClientLimits(self.settings, self.max_frame_bytes)
        hears = audio if self.synthesizer is not None else None
        connection = Connection(wire, session, role, reports_played, self.settings.send_buffer, limits, hears)
        connection.start()
        if audio is not None and hears is None:
            connection.send(
                ErrorFrame(
                    code=ErrorCode.NO_AUDIO, message="this edge speaks no audio (BARGEIN_TTS=none): text only"
                )
            )
        elif hears is not None:
            connection.send(AudioFormat(frame_ms=FRAME_MS))
            if session.voice is None:
                session.voice = await self._voice_for(session)
                self.voiced[session_id] = session
        session.attach(connection)
        self.count("connections")
        if session.end_reason is not None:  # it ended before this caller joined (a rejected call)
            connection.send(Ended(reason=session.end_reason))
            self.spawn(connection.close_when_sent())
        return connection

    async def _voice_for(self, session: EdgeSession) -> Voice:
        """The session's voice: the one it was created with (``voice`` at ``POST /v1/sessions``), or
        the process's."""
        assert self.synthesizer is not None
        name = None
        with contextlib.suppress(Exception):  # the store is away: the process's voice will do
            raw = await self.store.session_info(TIER_REASONING, session.session_id)
            chosen = SessionInfo.decode(raw).options.get(VOICE_OPTION) if raw is not None else None
            name = chosen if isinstance(chosen, str) else None
        return Voice(
            self.synthesizer,
            voice=name,
            lead_ms=self.voice_settings.audio_lead_ms,
            count=self.count,
            name=session.session_id,
            rules=PhraseRules.from_settings(self.voice_settings),
        )

    def leave(self, connection: Connection) -> None:
        connection.session.detach(connection)
        if connection.writer is not None:
            connection.writer.cancel()

    async def _forget(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        self.voiced.pop(session_id, None)
        self.records.forget(session_id)
        metrics.SESSIONS.labels("edge").set(len(self.sessions))
        if session is not None and session.voice is not None:
            await session.voice.aclose()
        if session is not None and self.queue is not None and not self.stopping:
            # (a stopping edge's queues go with its connection: no unbinding one by one)
            await self.queue.remove_session(session_id)

    # --- from the bus ----------------------------------------------------------------------------

    async def on_event(self, envelope: Envelope, event: Event) -> None:
        session = self.sessions.get(envelope.session)
        if session is None or session.ended:
            return
        from_owner = envelope.source not in Source.CALLER_SIDE
        if (
            from_owner
            and envelope.epoch > session.owner_epoch
            and not await self._new_owner(session, envelope)
        ):
            return
        if (
            from_owner
            and envelope.turn > 0
            and not envelope.control
            and not session.fence.is_fenced(envelope.turn)
        ):  # an answer's chunks go on in order, whole: one the broker lost is asked for again
            ready, gap = session.order.arrive(envelope, event)
            if gap is not None:
                await self._ask_again(session, gap)
            for in_order, its_event in ready:
                await self._apply(session, in_order, its_event)
            return
        await self._apply(session, envelope, event)

    async def _ask_again(self, session: EdgeSession, gap: Gap) -> None:
        """Chunks of a turn are missing (a later one came): ask the owner for them, and let what
        waits behind them go after ``BARGEIN_RESEND_WAIT_MS`` if they do not come."""
        self.count("chunks_asked_again", gap.last - gap.first + 1)
        log.info(
            "session %s turn %d: chunks %d-%d did not arrive; asking the owner for them again",
            session.session_id,
            gap.turn,
            gap.first,
            gap.last,
        )
        try:
            missed = OutputMissed(turn=gap.turn, first=gap.first, last=gap.last)
            await self._publish(session.session_id, missed)
        except Exception as exc:  # the broker is away, or the owner's mailbox is gone: wait it out
            log.warning("session %s: could not ask for the missing chunks: %s", session.session_id, exc)
        timer = session.order_timers.pop(gap.turn, None)
        if timer is not None:
            timer.cancel()
        session.order_timers[gap.turn] = asyncio.get_running_loop().call_later(
            self.settings.resend_wait_ms / 1000, lambda: self.spawn(self._stop_waiting(session, gap.turn))
        )

    async def _ask_for_the_rest(self, session: EdgeSession, now: float) -> None:
        """A turn that has not ended and has heard nothing for a while may have lost its last
        message, which no later one would show: ask the owner for whatever follows."""
        for gap in session.order.stalled(now, STALLED_AFTER * self.settings.resend_wait_ms / 1000):
            self.count("turns_asked_for_the_rest")
            log.debug(
                "session %s turn %d: nothing after chunk %d for a while, and no end; asking for the rest",
                session.session_id,
                gap.turn,
                gap.first - 1,
            )
            missed = OutputMissed(turn=gap.turn, first=gap.first, last=gap.last)
            with contextlib.suppress(Exception):  # the broker is away: the next look asks again
                await self._publish(session.session_id, missed)

    async def _stop_waiting(self, session: EdgeSession, turn: int) -> None:
        """The chunks asked for did not all come in time: the caller hears the rest without them."""
        session.order_timers.pop(turn, None)
        released, lost = session.order.give_up(turn)
        if session.ended or not released:
            return
        self.count("chunks_lost", len(lost))
        log.warning(
            "session %s turn %d: chunks %s never came; going on without them",
            session.session_id,
            turn,
            lost,
        )
        for envelope, event in released:
            await self._apply(session, envelope, event)

    async def _apply(self, session: EdgeSession, envelope: Envelope, event: Event) -> None:
        """What a message from the bus does, in its turn."""
        if isinstance(event, InterruptPolicy):  # an owner starts: tell it what the caller heard
            session.policy = set(event.events)
            record = session.heard.record()
            try:
                await self._publish(session.session_id, record)
            except UnroutableError:  # the owner's mailbox is gone already (the session ended)
                self.count("heard_records_unroutable")
            if record.turns:
                log.info(
                    "session %s: owner epoch %d started; told it what the caller heard of turns %s",
                    session.session_id,
                    envelope.epoch,
                    [t.turn for t in record.turns],
                )
        elif isinstance(event, TurnInterrupted):
            session.clear(event.turn, "the agent's turn was interrupted")
        elif isinstance(event, UserSpeechOnset):
            if session.soft_pause(time.monotonic()):
                metrics.ONSET_TO_PAUSE.observe(metrics.since(envelope.ts))
        elif isinstance(event, UserOnsetDismissed):
            session.soft_resume(time.monotonic(), f"the burst was {event.outcome}")
        elif isinstance(event, UserStartedSpeaking):
            if envelope.source != Source.STOP_BUTTON:  # the stop button is not the caller speaking
                session.broadcast(SpeakingStarted())
            session.barged_in("the caller started speaking", since=envelope.ts, published_at=envelope.ts)
        elif isinstance(event, UserStoppedSpeaking):
            session.broadcast(SpeakingStopped())
            session.turn_ended_at = time.monotonic()
            session.soft_resume(time.monotonic(), "the caller's turn did not cut the agent off")
        elif isinstance(event, FalseInterruption):  # the burst ended without being a turn
            session.broadcast(SpeakingStopped(false_interruption=True))
            session.soft_resume(time.monotonic(), "a false interruption")
        elif isinstance(event, UserTranscriptionReceived) and envelope.source == Source.SPEECH:
            session.broadcast(UserTranscript(text=event.content))  # a text turn's client has its text
        elif isinstance(event, UserBackchannel):
            session.broadcast(UserTranscript(text=event.content, backchannel=True))
            session.soft_resume(time.monotonic(), "a backchannel")
        elif isinstance(event, AgentResponse):
            if session.fence.admit(envelope):
                if envelope.turn > session.highest_turn:
                    session.highest_turn, session.highest_began = envelope.turn, time.time()
                session.heard.sent(envelope.turn, envelope.seq, event.content)
                session.broadcast(AgentChunk(turn=envelope.turn, seq=envelope.seq, text=event.content))
                session.speak(envelope.turn, envelope.seq, event.content)
            else:
                self.count("dropped_chunks")
        elif isinstance(event, AGENT_ACTIONS):
            if session.fence.admit(envelope):
                session.broadcast(action_frame(envelope, event))
                if isinstance(event, TransferCall):  # the line goes elsewhere: this call is over
                    self.spawn(self._end(session, "transferred"))
            else:
                self.count("dropped_chunks")
        elif isinstance(event, AgentGenerationComplete):
            session.order.ended(envelope.turn)
            if session.fence.admit(envelope):
                session.completed.add(envelope.turn)
                session.broadcast(TurnComplete(turn=envelope.turn))
                session.spoken(envelope.turn)
        elif isinstance(event, SessionError):
            session.broadcast(ErrorFrame(code=event.code, message=event.message))
        elif isinstance(event, AgentError):
            session.order.ended(envelope.turn)  # a turn that failed: nothing more comes of it
            session.broadcast(ErrorFrame(code=ErrorCode.AGENT_ERROR, message=event.message))
        elif isinstance(event, EndCall):
            # ended aside (its connections' last frames, the speech tier's records, the bindings):
            # awaited here it held up every other session's output (one consumer drains the queue
            # in order), and when a thousand callers hung up at once, for minutes
            if envelope.source in Source.CALLER_SIDE:  # told by the edge its caller used
                self.spawn(self._end(session, "caller", owners_told=True))
            else:
                self.spawn(self._end(session, "rejected" if event.reason == EndCall.REJECTED else "agent"))

    async def _new_owner(self, session: EdgeSession, envelope: Envelope) -> bool:
        """A message says the session has a new owner (a higher epoch). Believe it only if the state
        store handed that epoch out: one forged message must not take the session's fence over."""
        try:
            current = await self.store.current_epoch(TIER_REASONING, session.session_id)
        except Exception as exc:  # cannot check now (Redis down): a forgery then is a second fault
            log.warning("session %s: cannot confirm epoch %d: %s", session.session_id, envelope.epoch, exc)
            current = envelope.epoch
        if envelope.epoch > current:
            self.count("forged_epochs")
            log.warning(
                "session %s: dropped a %s claiming epoch %d; the session's latest is %d",
                session.session_id,
                envelope.type,
                envelope.epoch,
                current,
            )
            return False
        session.owner_epoch = envelope.epoch
        return True

    async def _end(
        self,
        session: EdgeSession,
        reason: Literal["caller", "caller_left", "agent", "transferred", "rejected"],
        why: str = "agent ended the call",
        *,
        owners_told: bool = False,
    ) -> None:
        """The call is over: tell every connection (after what is queued for it), close, tidy up.
        A caller's hang-up is told to the owners here (unless ``owners_told``: this edge heard it
        from the broker), after the callers have heard ``ended``: see :meth:`_tell_hang_up`."""
        if session.ended:
            return
        session.ended = True
        for timer in session.order_timers.values():
            timer.cancel()
        session.end_reason = reason  # from now on a caller who joins is told at once (join)
        had_callers = session.joined_once
        for connection in list(session.connections):
            connection.send(Ended(reason=reason))
        await asyncio.sleep(0)
        for connection in list(session.connections):
            await connection.close_when_sent()
        if reason == "caller":
            if not owners_told:
                await self._tell_hang_up(session.session_id)
            with contextlib.suppress(Exception):  # the store is away: the sweep finds it over later
                # each owner ends its side on the hang-up; a side nobody owns is forgotten here
                await forget_unowned_sides(
                    self.transport, self.store, session.session_id, by=self.owner, reason="the caller hung up"
                )
                await self.store.forget_callers(session.session_id)
        else:  # the owners end their side when they hear it (a side nobody owns is forgotten here)
            await end_session(
                self.transport, self.store, session.session_id, by=self.owner, reason=why, source=Source.EDGE
            )
        if had_callers:
            await self._forget(session.session_id)
        elif (
            self.queue is not None and not self.stopping
        ):  # over before its caller joined: a late join is told so
            await self.queue.remove_session(session.session_id)  # (then forgotten as idle)
        log.info("session %s ended (%s)", session.session_id, reason)

    async def _tell_hang_up(self, session_id: str) -> None:
        """Tell the owners the caller hung up, until they have it. A hang-up is never refused: the
        caller has been told ``ended`` already, so a broker that is away, or slow (a thousand
        callers hanging up at once), or a mailbox that is full (the agent is behind) only delays
        it. Told again after a refusal, a queue that took it the first time (this edge's own, the
        speech mailbox) hears it twice, which ends nothing twice."""
        waited_since: float | None = None
        while True:
            try:
                await self._publish(session_id, EndCall(reason="the caller hung up"))
                break
            except BrokerUnavailable as exc:
                if waited_since is None:
                    waited_since = time.monotonic()
                    self.count("hang_ups_delayed")
                    log.warning(
                        "session %s: its hang-up waits for the broker (%s); told again", session_id, exc
                    )
                await asyncio.sleep(HANG_UP_RETRY_S)
            except Exception as exc:  # a bug, or the edge's transport closed: the caller deadline ends it
                self.count("hang_ups_untold")
                log.warning(
                    "session %s: its hang-up was not told: %s: %s", session_id, type(exc).__name__, exc
                )
                return
        if waited_since is not None:
            log.info(
                "session %s: its hang-up was told after %.1f s", session_id, time.monotonic() - waited_since
            )

    # --- from clients ----------------------------------------------------------------------------

    async def playback(self, session: EdgeSession, speaking: bool) -> None:
        """Publish :class:`AgentPlayback` for the session's speech owner (EdgeSession.tell_speech);
        one at a time per session, so the speech tier hears the changes in the order they happened."""
        async with session.playback_lock:
            try:
                await self._publish(session.session_id, AgentPlayback(speaking=speaking))
            except Exception as exc:  # no speech mailbox (the call is ending), or the broker is away
                self.count("playback_unsent")
                log.debug("session %s: playback %s not sent: %s", session.session_id, speaking, exc)

    async def _publish(self, session_id: str, event: Event, source: str = Source.EDGE) -> None:
        self._seq += 1
        await self.transport.publish(Envelope.wrap(session_id, event, seq=self._seq, source=source), IN)

    async def client_audio(self, connection: Connection, data: bytes) -> ErrorFrame | None:
        """Returns an error frame for the client, or None."""
        if len(data) > self.max_frame_bytes:
            self.count("bad_frames")
            too_large = f"frames are at most {self.max_frame_bytes} bytes"
            return ErrorFrame(code=ErrorCode.FRAME_TOO_LARGE, message=too_large)
        if len(data) % SAMPLE_WIDTH:
            self.count("bad_frames")
            return ErrorFrame(code=ErrorCode.BAD_AUDIO_FRAME, message="audio must be whole PCM16 samples")
        if not await connection.limits.audio(len(data)):
            return self._rate_limited(connection, "audio faster than real time allows")
        try:
            await self._publish(connection.session.session_id, AudioFrame(data=data))
        except BrokerUnavailable as exc:
            # audio is worthless by the time the broker is back: dropped, and said once per outage
            self.count("audio_dropped_unavailable")
            if connection.told_unavailable:
                return None
            connection.told_unavailable = True
            return ErrorFrame(code=ErrorCode.UNAVAILABLE, message=f"{exc}; audio is being dropped")
        connection.told_unavailable = False
        return None

    def _rate_limited(self, connection: Connection, what: str) -> ErrorFrame | None:
        self.count("rate_limited")
        if not connection.limits.should_tell():
            return None
        log.warning(
            "session %s: a client sends %s; dropping what is over its budget (rate_limited)",
            connection.session.session_id,
            what,
        )
        return ErrorFrame(code=ErrorCode.RATE_LIMITED, message=f"{what}; this was dropped, slow down")

    async def client_message(self, connection: Connection, message: AnyClientMessage) -> ErrorFrame | None:
        """Returns an error frame for the client, or None."""
        session = connection.session
        sid = session.session_id
        if not isinstance(message, Played) and not await connection.limits.message():
            return self._rate_limited(connection, "too many messages")
        if not isinstance(message, Played):
            await self._report(session)  # what the caller got before what the caller does now
        if isinstance(message, TextTurn):
            session.barged_in("the caller typed", since=time.time())  # at once: its echo cuts nothing later
            await self._publish(sid, UserStartedSpeaking())
            await self._publish(sid, UserTranscriptionReceived(content=message.text))
            await self._publish(sid, UserStoppedSpeaking())
        elif isinstance(message, Played):
            if connection.reports_played and message.seq is not None:
                session.delivered(message.turn, message.seq)
            elif connection.reports_played and message.mark is not None:
                session.played_mark(message.turn, message.mark)
        elif isinstance(message, Interrupt):
            # told to the agent as a barge-in, which every interruptible route listens for
            await self._publish(sid, UserStartedSpeaking(), source=Source.STOP_BUTTON)
            cut = session.cuttable()
            if cut:
                session.clear(cut, "the caller pressed stop", since=time.time())
        elif isinstance(message, KeyPress):
            await self._publish(sid, DTMFInputEvent(button=message.button))
        elif isinstance(message, End):  # aside: the caller's socket closes meanwhile
            self.spawn(self._end(session, "caller"))
        return None

    # --- background ------------------------------------------------------------------------------

    async def _report_loop(self) -> None:
        """What callers received goes back to the owner, coalesced (not one message per chunk).
        Every interval it walks every session: only those with news or a turn under way cost more
        than a glance, and the walk lets what waits go first every ``SESSIONS_PER_STEP`` (measured
        with 10,000 idle sessions: a 27 ms step five times a second, in which no chunk, barge-in or
        clear was handled)."""
        interval = max(self.settings.report_interval_ms, 1.0) / 1000
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for n, session in enumerate(list(self.sessions.values()), 1):
                if session.heard.unreported:
                    await self._report(session)
                if session.order.open_turns:
                    await self._ask_for_the_rest(session, now)
                if n % SESSIONS_PER_STEP == 0:
                    await asyncio.sleep(0)

    async def _report(self, session: EdgeSession) -> None:
        """What the session's callers received since the last report, one report a turn."""
        for report in session.heard.take_reports():
            with contextlib.suppress(Exception):
                await self._publish(session.session_id, report)

    def report_soon(self, session: EdgeSession) -> None:
        """Report now rather than at the next interval (a turn was cut off: its history is cut
        where the caller stopped hearing it)."""
        task = asyncio.get_running_loop().create_task(self._report(session))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _voice_loop(self) -> None:
        """Every frame, for every session that is heard: the audio due, the marks, what was heard;
        and a soft pause that no verdict ended in time resumes (the speech tier may have gone).
        Only the sessions with a voice are walked: fifty times a second over every session of a
        busy edge (text clients, listeners) was a cost in proportion to its idle callers."""
        longest = self.voice_settings.soft_pause_max_s
        while True:
            await asyncio.sleep(FRAME_MS / 1000)
            now = time.monotonic()
            for session in list(self.voiced.values()):
                assert session.voice is not None
                if session.paused_since is not None and now - session.paused_since > longest:
                    session.soft_resume(now, f"no verdict on the burst in {longest:g} s")
                session.voice_outputs(session.voice.tick(now))

    async def end_call(self, session_id: str, why: str) -> None:
        """End a session whose call is over though nobody said ``end`` (its caller left and did not
        come back, its phone stream never started, the carrier says the call ended), on every tier,
        whichever edge its caller used."""
        session = self.sessions.get(session_id)
        if session is not None and session.ended:
            return
        self.count("calls_ended_unattended")
        log.info("session %s: %s; ending it", session_id, why)
        if session is not None:
            await self._end(session, "caller_left", why)
        else:
            await end_session(
                self.transport, self.store, session_id, by=self.owner, reason=why, source=Source.EDGE
            )

    async def _caller_loop(self) -> None:
        """Tell the store which sessions have their caller here (their deadline moves on), end the
        sessions, wherever their caller was, whose deadline passed (docs/protocol.md, "Leaving"),
        and give back the directory entries of this edge's callers' sessions that Redis lost
        together with their owner (``edge/records.py``)."""
        grace = self.settings.reconnect_grace_s
        interval = min(HOUSEKEEPING_S, max(grace / 4, 0.05))
        while True:
            await asyncio.sleep(interval)
            now = time.time()
            deadlines = {
                sid: now + grace if session.has_caller else session.alone_until
                for sid, session in self.sessions.items()
                if not session.ended and (session.has_caller or session.alone_until is not None)
            }
            try:
                await self.store.expect_callers({sid: at for sid, at in deadlines.items() if at is not None})
                over = await self.store.callers_gone(now)
            except Exception as exc:  # the store is away: the deadlines are told again next time
                log.debug("callers not told to the store: %s", exc)
                continue
            for session_id in over:
                try:
                    await self.end_call(session_id, f"no caller for {grace:g} s")
                except Exception as exc:  # the broker is away: the owners end it when it goes quiet
                    log.warning("session %s: its end was not told: %s", session_id, exc)
            live = {
                sid: max(session.highest_turn, session.fence.interrupted_upto)
                for sid, session in self.sessions.items()
                if session.has_caller and not session.ended
            }
            epochs = {sid: self.sessions[sid].fence.epoch for sid in live}
            try:
                await self.records.look(live, epochs)
            except Exception as exc:  # the store is away: looked at again next time
                log.debug("the directory was not looked at: %s", exc)

    async def _backlog_loop(self) -> None:
        """Ask the broker how far behind this process is, twice a second."""
        behind = False
        while True:
            await asyncio.sleep(BACKLOG_INTERVAL_S)
            if self.queue is None:
                continue
            try:
                self.backlog = await self.queue.backlog()
                metrics.QUEUE_BACKLOG.set(self.backlog)
            except Exception as exc:  # the broker is away: readiness says so already
                log.debug("cannot ask for the backlog: %s", exc)
                continue
            if (self.backlog > self.settings.overload_backlog) != behind:
                behind = not behind
                if behind:
                    log.warning("edge %s overloaded: %d chunks wait for it", self.owner, self.backlog)
                else:
                    log.info("edge %s caught up (%d chunks wait)", self.owner, self.backlog)

    async def _housekeeping(self) -> None:
        said = time.monotonic()
        while True:
            await asyncio.sleep(HOUSEKEEPING_S)
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if session.idle_since is not None and now - session.idle_since > IDLE_FORGET_S:
                    await self._forget(session.session_id)
            if now - said < self.status_interval_s:
                continue
            said = now
            log.info(
                "edge %s: %d sessions, %d connections, backlog %d, loop lag %.0f ms, %s",
                self.owner,
                len(self.sessions),
                sum(len(s.connections) for s in self.sessions.values()),
                self.backlog,
                self.load.lag_ms,
                dict(self.counters),
            )
