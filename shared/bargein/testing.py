"""Test an agent in one process: ``async with LocalSession(agent) as s``.

``LocalSession`` runs the real session runtime on the in-memory transport and state store, and
plays the two outer roles itself: the caller (``emit``) and the client edge (``next``). As the edge
it applies the same turn fence the broadcast service does, so after an interrupt no chunk of the
interrupted turn is ever returned, even one that was already queued; and it reports each chunk
it hands out as delivered, so the agent's history keeps exactly the text your test consumed.

``emit`` returns once the event has been dispatched and whatever that caused at the edge (a
``TurnInterrupted``) has been applied, which makes interrupt tests deterministic.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from types import TracebackType
from typing import Any, TypeVar

from bargein.envelope import Envelope, new_session_id
from bargein.events import AgentGenerationComplete, AgentResponse, Event, SpeechDelivered, TurnInterrupted
from bargein.fence import TurnFence
from bargein.host import SessionHost
from bargein.memory import MemoryBroker, MemoryStateStore, MemoryTransport
from bargein.names import IN, OUT, TIER_EDGE
from bargein.nodes import Node
from bargein.runtime import Agent, SessionInfo, SessionRuntime

E = TypeVar("E", bound=Event)


class LocalSession:
    def __init__(
        self,
        agent: Agent,
        *,
        session_id: str | None = None,
        options: dict[str, Any] | None = None,
        report_delivery: bool = True,
    ) -> None:
        self.agent = agent
        self.session_id = session_id or new_session_id()
        self.options = dict(options or {})
        self.report_delivery = report_delivery
        self.broker = MemoryBroker()
        self.transport = MemoryTransport(self.broker)
        self.store = MemoryStateStore()
        self.fence = TurnFence()
        self.interrupted_turns: list[int] = []
        self.received: list[tuple[Envelope, Event]] = []  # everything handed out by next()
        self._buffer: collections.deque[tuple[Envelope, Event]] = collections.deque()
        self._arrived = asyncio.Event()
        self._seq = itertools.count()
        self._hosts = itertools.count(1)
        self.host: SessionHost | None = None
        self._edge: Any = None

    @property
    def info(self) -> SessionInfo:
        return SessionInfo(self.session_id, dict(self.options), edge_reports_delivery=self.report_delivery)

    @property
    def runtime(self) -> SessionRuntime:
        if self.host is None or self.session_id not in self.host.sessions:
            raise RuntimeError("the session is not running")
        return self.host.sessions[self.session_id].runtime

    @property
    def nodes(self) -> list[Node]:
        return self.runtime.nodes

    async def __aenter__(self) -> LocalSession:
        self._edge = await self.transport.open_mailbox(self.session_id, TIER_EDGE, OUT, self._on_output)
        await self._start_host()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.host is not None:
            await self.host.close_all()
        await self.transport.close()

    async def _start_host(self) -> None:
        self.host = SessionHost(self.transport, self.store, self.agent, owner=f"local-{next(self._hosts)}")
        await self.host.open(self.info)

    async def restart(self) -> None:
        """Stop the session's owner (checkpointing, releasing its lease) and let a fresh one adopt it,
        with a new agent instance, as another process would."""
        if self.host is not None:
            await self.host.close_all()
        await self._start_host()

    # --- the caller ------------------------------------------------------------------------------

    async def emit(self, event: Event) -> None:
        envelope = Envelope.wrap(self.session_id, event, seq=next(self._seq), source="user")
        await self.transport.publish(envelope, IN)
        await self.broker.settle()

    # --- the edge --------------------------------------------------------------------------------

    async def _on_output(self, envelope: Envelope, event: Event) -> None:
        if isinstance(event, TurnInterrupted):
            if self.fence.interrupt(event.turn):
                self.interrupted_turns.append(event.turn)
                kept = [item for item in self._buffer if not self.fence.is_fenced(item[0].turn)]
                self.fence.dropped["interrupted_turn"] += len(self._buffer) - len(kept)
                self._buffer = collections.deque(kept)
            return
        if self.fence.admit(envelope):
            self._buffer.append((envelope, event))
            self._arrived.set()

    async def next_envelope(self, timeout: float = 5.0) -> tuple[Envelope, Event]:
        async with asyncio.timeout(timeout):
            while not self._buffer:
                self._arrived.clear()
                await self._arrived.wait()
        envelope, event = self._buffer.popleft()
        self.received.append((envelope, event))
        if self.report_delivery and isinstance(event, AgentResponse):
            report = SpeechDelivered(turn=envelope.turn, seq=envelope.seq)
            await self.transport.publish(Envelope.wrap(self.session_id, report, source="edge"), IN)
        return envelope, event

    async def next(self, timeout: float = 5.0) -> Event:
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
        await self.broker.settle()
        out = [event for _, event in self._buffer]
        self.received.extend(self._buffer)
        self._buffer.clear()
        return out
