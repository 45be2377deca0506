"""The caller's side of a session, over any transport: emit events, receive what a client would.

:class:`Caller` plays the two outer roles of a conversation for tests, benchmarks and the demo: the
caller (``emit``) and the client edge (``next``). As the edge it applies the same
:class:`~bargein.wire.fence.TurnFence` the broadcast service does, so after an interrupt no chunk of the
interrupted turn is ever returned, even one already queued; and it reports the chunks it hands out
as delivered, so the agent's history keeps exactly the text that was consumed. As the edge does,
it reports coalesced: at most every ``report_interval_s`` while chunks stream, and at once before
anything else it publishes, when it settles, when a turn completes and when a turn is cut off, so
a report is never overtaken by what the caller does next.

Given a :class:`~bargein.voice.speaker.Voice`, it is an edge whose caller hears the agent: the
chunks it hands out are spoken, played at real time into a :class:`Loudspeaker` (the demo's
recording), and what the caller heard is what was played, to the word, as the broadcast service
reports it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from bargein.agent.events import (
    AgentGenerationComplete,
    AgentPlayback,
    AgentResponse,
    EndCall,
    Event,
    HeardRecord,
    InterruptPolicy,
    SpeechDelivered,
    TurnInterrupted,
)
from bargein.agent.message import Source
from bargein.errors import UnroutableError
from bargein.tasks import cancel_and_wait
from bargein.transport.abc import EdgeQueue, Subscription, Transport
from bargein.voice import player
from bargein.voice.player import FRAME_MS
from bargein.voice.speaker import Voice
from bargein.wire.envelope import Envelope
from bargein.wire.fence import TurnFence
from bargein.wire.heard import HeardLog
from bargein.wire.names import IN, OUT, TIER_EDGE
from bargein.wire.playback import Playback

E = TypeVar("E", bound=Event)

REPORT_INTERVAL_S = 0.2  # as the broadcast service's default (BARGEIN_REPORT_INTERVAL_MS)


class Loudspeaker(Protocol):
    """Where a caller who hears the agent plays its voice (``tools.earpiece.Earpiece`` is one)."""

    def audio(self, pcm: bytes, now: float) -> object: ...

    def pause(self, now: float) -> object: ...

    def resume(self, now: float) -> object: ...

    def clear(self, now: float) -> object: ...


class Caller:
    def __init__(
        self,
        transport: Transport,
        session_id: str,
        *,
        report_delivery: bool = True,
        report_playback: bool = False,
        settle: Callable[[], Awaitable[None]] | None = None,
        voice: Voice | None = None,
        loudspeaker: Loudspeaker | None = None,
        report_interval_s: float = REPORT_INTERVAL_S,
        keep_received: bool = True,
    ) -> None:
        self.transport = transport
        self.voice = voice  # the caller hears the agent: chunks are spoken, heard is what played
        self.loudspeaker = loudspeaker
        self._voice_turn = 0  # the turn whose audio played last
        self._cut: set[int] = set()
        self.paused = False  # a soft barge-in holds the agent's voice
        self._player: asyncio.Task[None] | None = None
        self.session_id = session_id
        self.report_delivery = report_delivery
        self.report_playback = report_playback  # tell a speech tier when the agent speaks, as the edge does
        self.playback = Playback()
        self._settle = settle
        self.fence = TurnFence()
        self.heard = HeardLog()  # handed to every owner as it starts, as the broadcast service does
        self.interrupted_turns: list[int] = []
        self.policy: set[str] = set()  # what the owner says always interrupts (InterruptPolicy)
        self.ended = False
        # everything handed out by next(), for a test to look back on (a long-running caller, a
        # benchmark's, keeps none: each chunk kept is memory and work for the garbage collector)
        self.received: list[tuple[Envelope, Event]] = []
        self.keep_received = keep_received
        self._buffer: collections.deque[tuple[Envelope, Event]] = collections.deque()
        self._arrived = asyncio.Event()  # what wait_interrupted waits for
        self._reader: asyncio.Future[None] | None = None  # ... and next(), more cheaply
        self._loop: asyncio.AbstractEventLoop | None = None
        self._seq = itertools.count()
        self._edge: Subscription | None = None
        self._edge_queue: EdgeQueue | None = None
        self.report_interval_s = report_interval_s
        self._reported_at = 0.0  # when delivery was last reported (monotonic)
        self._report_timer: asyncio.TimerHandle | None = None
        self._late_reports: set[asyncio.Task[None]] = set()

    async def attach(self, edge: EdgeQueue | None = None) -> None:
        """Start receiving the session's output: in an edge mailbox of its own, or, as a broadcast
        process's callers do, from the ``edge`` queue many sessions share (whose handler hands each
        of this session's messages to :meth:`receive`)."""
        if edge is not None:
            await edge.add_session(self.session_id)
            self._edge_queue = edge
        else:
            self._edge = await self.transport.open_mailbox(self.session_id, TIER_EDGE, OUT, self.receive)
        if self.voice is not None:
            self._player = asyncio.create_task(self._play(), name=f"caller-voice:{self.session_id}")

    async def detach(self) -> None:
        if self._report_timer is not None:
            self._report_timer.cancel()
            self._report_timer = None
        for task in list(self._late_reports):
            task.cancel()
        await cancel_and_wait(self._player)
        self._player = None
        if self.voice is not None:
            await self.voice.aclose()
        if self._edge is not None:
            await self._edge.cancel()
            self._edge = None
        if self._edge_queue is not None:
            await self._edge_queue.remove_session(self.session_id)
            self._edge_queue = None

    async def settle(self) -> None:
        await self.report_now()
        if self._settle is not None:
            await self._settle()

    # --- the caller ------------------------------------------------------------------------------

    async def emit(self, event: Event, *, settle: bool = True) -> Envelope:
        """Say ``event``; ``settle=False`` returns once it is published, not once the in-memory
        broker has handed it over (a test that races it against something else)."""
        await self.report_now()  # what the caller got before what it does now
        envelope = Envelope.wrap(self.session_id, event, seq=next(self._seq), source=Source.USER)
        await self.transport.publish(envelope, IN)
        if settle:
            await self.settle()
        return envelope

    # --- the edge --------------------------------------------------------------------------------

    async def receive(self, envelope: Envelope, event: Event) -> None:
        """One message of the session's output, as the edge hands it over."""
        if isinstance(event, InterruptPolicy):  # an owner starts: tell it what the caller heard
            self.policy = set(event.events)
            if self.report_delivery:
                with contextlib.suppress(UnroutableError):  # the owner is gone already
                    await self._report(self.heard.record())
            return
        if isinstance(event, TurnInterrupted):
            await self.report_now()
            await self.cut(event.turn)
            await self._tell_speech(self.playback.cleared(event.turn))
            if self.fence.interrupt(event.turn):
                self.interrupted_turns.append(event.turn)
                kept = [item for item in self._buffer if not self.fence.is_fenced(item[0].turn)]
                self.fence.dropped["interrupted_turn"] += len(self._buffer) - len(kept)
                self._buffer = collections.deque(kept)
            self._arrived_now()
            return
        if self.fence.admit(envelope):
            self._buffer.append((envelope, event))
            self._arrived_now()

    async def wait_interrupted(self, turn: int, timeout: float = 5.0) -> None:
        """Wait until the edge has seen turn ``turn`` interrupted."""
        async with asyncio.timeout(timeout):
            while turn not in self.interrupted_turns:
                self._arrived.clear()
                await self._arrived.wait()

    async def next_envelope(self, timeout: float | None = 5.0) -> tuple[Envelope, Event]:
        """The next envelope and event a client would receive; ``timeout=None`` waits for ever."""
        if not self._buffer:  # (no timer when something is waiting: that is every chunk of a stream)
            if timeout is None:
                await self._arrival()
            else:
                async with asyncio.timeout(timeout):
                    await self._arrival()
        envelope, event = self._buffer.popleft()
        await self._hand_out(envelope, event)
        return envelope, event

    async def _arrival(self) -> None:
        """Return once something is in the buffer (a bare future: an asyncio.Event asks for the
        running loop at every wait, a system call on Python 3.11, and this is every chunk's)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        while not self._buffer:
            self._reader = self._loop.create_future()
            await self._reader

    def _arrived_now(self) -> None:
        self._arrived.set()
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.set_result(None)

    async def _hand_out(self, envelope: Envelope, event: Event) -> None:
        """The caller has this event now: a chunk is reported heard, the agent's hang-up ends the
        session (as the broadcast edge does)."""
        if self.keep_received:
            self.received.append((envelope, event))
        if isinstance(event, AgentResponse) and self.voice is not None:
            self.heard.sent(envelope.turn, envelope.seq, event.content)
            self.voice.text(envelope.turn, envelope.seq, event.content)
        elif isinstance(event, AgentResponse):
            if self.report_playback:  # (nothing else asks what the playback is)
                await self._tell_speech(self.playback.sent(envelope.turn, envelope.seq))
                await self._tell_speech(self.playback.heard(envelope.turn, envelope.seq))
            self.heard.sent(envelope.turn, envelope.seq, event.content)
            self.heard.heard(envelope.turn, envelope.seq)
            await self._report_soon()
        if isinstance(event, AgentGenerationComplete) and self.voice is not None:
            self.voice.complete(envelope.turn)
        elif isinstance(event, AgentGenerationComplete):
            await self.report_now()  # the whole answer was handed out
            await self._tell_speech(self.playback.complete(envelope.turn))
        if isinstance(event, EndCall) and envelope.source not in Source.CALLER_SIDE:
            # the agent hung up and everything before it was handed out: end the session, as the
            # broadcast edge does, so its owners let it go
            hangup = EndCall(reason="agent ended the call")
            await self.transport.publish(Envelope.wrap(self.session_id, hangup, source=Source.EDGE), IN)
            self.ended = True

    # --- the agent's voice -----------------------------------------------------------------------

    @property
    def agent_audible(self) -> bool:
        return self.voice is not None and self.voice.player.playing

    async def barge_in(self) -> None:
        """The caller spoke over the agent: cut off whatever of its voice still plays (the answer's
        text may have ended long ago, so its owner has nothing to interrupt), as the edge does."""
        if self.agent_audible:
            await self.cut(self._voice_turn)

    async def soft_pause(self) -> bool:
        """The caller may be starting to speak (``UserSpeechOnset``): silence the agent's voice now.
        Whether it was audible (and is now paused)."""
        if self.voice is None or self.paused or not self.voice.player.playing:
            return False
        now = time.monotonic()
        await self._voice_outputs(self.voice.pause(now))
        if self.loudspeaker is not None:
            self.loudspeaker.pause(now)
        self.paused = True
        return True

    def soft_resume(self) -> bool:
        """It was not a barge-in: the agent's voice goes on where it paused. Whether it was paused."""
        if self.voice is None or not self.paused:
            return False
        now = time.monotonic()
        self.voice.resume(now)
        if self.loudspeaker is not None:
            self.loudspeaker.resume(now)
        self.paused = False
        return True

    async def cut(self, turn: int) -> None:
        """No more of ``turn`` is played: tell the owner how far the caller heard it (``final``)."""
        if self.voice is None or turn in self._cut:
            return
        self._cut.add(turn)
        self.paused = False
        now = time.monotonic()
        await self._voice_outputs(self.voice.clear(turn, now))
        if self.loudspeaker is not None:
            self.loudspeaker.clear(now)
        self.heard.cut(turn)
        await self.report_now()  # how far the caller heard it, final
        await self._tell_speech(self.playback.cleared(turn))

    async def _play(self) -> None:
        assert self.voice is not None
        while True:
            await asyncio.sleep(FRAME_MS / 1000)
            await self._voice_outputs(self.voice.tick(time.monotonic()))

    async def _voice_outputs(self, outputs: list[player.Output]) -> None:
        for out in outputs:
            if isinstance(out, player.Audio):
                self._voice_turn = out.turn
                await self._tell_speech(self.playback.sent(out.turn, 0))
                if self.loudspeaker is not None:
                    self.loudspeaker.audio(out.pcm, time.monotonic())
            elif isinstance(out, player.Heard):
                if self.heard.heard(out.turn, out.seq, out.chars):
                    await self._report_soon()
            elif isinstance(out, player.Done):
                await self._tell_speech(self.playback.played_out(out.turn))

    async def _tell_speech(self, speaking: bool | None) -> None:
        if speaking is None or not self.report_playback:
            return
        with contextlib.suppress(UnroutableError):  # no speech tier runs for this session
            envelope = Envelope.wrap(self.session_id, AgentPlayback(speaking=speaking), source=Source.EDGE)
            await self.transport.publish(envelope, IN)

    async def _report(self, report: SpeechDelivered | HeardRecord) -> None:
        await self.transport.publish(Envelope.wrap(self.session_id, report, source=Source.EDGE), IN)

    # --- delivery reports, coalesced -------------------------------------------------------------

    async def report_now(self) -> None:
        """Tell the owner what the caller got since the last report (one report a turn)."""
        if not self.heard.unreported:
            return
        self._reported_at = time.monotonic()
        reports = self.heard.take_reports()
        if not self.report_delivery:
            return
        for report in reports:
            with contextlib.suppress(UnroutableError):  # the owner is gone already
                await self._report(report)

    async def _report_soon(self) -> None:
        """Chunks are streaming: report now if the last report is ``report_interval_s`` old, and
        otherwise once it is (a timer, in case nothing more arrives meanwhile)."""
        wait = self._reported_at + self.report_interval_s - time.monotonic()
        if wait <= 0:
            await self.report_now()
        elif self._report_timer is None:
            self._report_timer = asyncio.get_running_loop().call_later(wait, self._report_late)

    def _report_late(self) -> None:
        self._report_timer = None
        if not self.heard.unreported:  # reported meanwhile
            return
        task = asyncio.get_running_loop().create_task(self.report_now())
        self._late_reports.add(task)
        task.add_done_callback(self._late_reports.discard)

    async def next(self, timeout: float | None = 5.0) -> Event:
        """The next event the agent broadcast that a client would receive."""
        return (await self.next_envelope(timeout))[1]

    async def expect(self, event_type: type[E], timeout: float = 5.0) -> E:
        event = await self.next(timeout)
        if not isinstance(event, event_type):
            raise AssertionError(f"expected {event_type.__name__}, got {event!r}")
        return event

    async def collect_turn(self, timeout: float = 10.0) -> list[Event]:
        """Events up to and including the next ``AgentGenerationComplete``."""
        events: list[Event] = []
        async with asyncio.timeout(timeout):
            while True:
                event = await self.next(timeout)
                events.append(event)
                if isinstance(event, AgentGenerationComplete):
                    return events

    async def quiet(self, seconds: float) -> list[Event]:
        """Wait ``seconds`` and return whatever arrived (tests use it to assert 'nothing more')."""
        await asyncio.sleep(seconds)
        await self.settle()
        drained = list(self._buffer)
        self._buffer.clear()
        for envelope, event in drained:  # handed out like any other (chunks are reported heard)
            await self._hand_out(envelope, event)
        return [event for _, event in drained]
