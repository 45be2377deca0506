"""Test an agent in one process: ``async with LocalSession(agent) as s``.

``LocalSession`` runs the real session runtime on the in-memory transport and state store; the test
is the caller and the client edge (see :class:`~bargein.testing.caller.Caller`: ``emit``, ``next``,
``expect``, ``collect_turn``, ``quiet``). ``emit`` returns once the event has been dispatched, the
routes that do not run as turns (``.map(node.add_event)``) have handled it, and whatever that
caused at the edge (a ``TurnInterrupted``) has been applied, which makes interrupt tests
deterministic. ``restart`` and ``crash`` hand the session to a new owner, as another process would
take it over.
"""

from __future__ import annotations

import asyncio
import itertools
from types import TracebackType
from typing import Any

from bargein.agent.nodes import Node
from bargein.hosting.host import SessionHost
from bargein.runtime.agents import Agent
from bargein.runtime.session import SessionRuntime
from bargein.testing.caller import Caller, Loudspeaker
from bargein.transport.memory import MemoryBroker, MemoryStateStore, MemoryTransport
from bargein.voice.speaker import Voice
from bargein.wire.envelope import new_session_id
from bargein.wire.names import TIER_REASONING
from bargein.wire.session_info import SessionInfo

SETTLE_TIMEOUT_S = 10.0  # a route's .map() that takes longer than this fails the emit that waits


class LocalSession(Caller):
    def __init__(
        self,
        agent: Agent,
        *,
        session_id: str | None = None,
        options: dict[str, Any] | None = None,
        report_delivery: bool = True,
        report_playback: bool = False,
        voice: Voice | None = None,
        loudspeaker: Loudspeaker | None = None,
        keep_received: bool = True,
    ) -> None:
        self.broker = MemoryBroker()
        super().__init__(
            MemoryTransport(self.broker),
            session_id or new_session_id(),
            report_delivery=report_delivery,
            report_playback=report_playback,
            settle=self._settle,
            voice=voice,
            loudspeaker=loudspeaker,
            keep_received=keep_received,
        )
        self.agent = agent
        self.options = dict(options or {})
        self.store = MemoryStateStore()
        self.host: SessionHost | None = None
        self._hosts = itertools.count(1)

    @property
    def info(self) -> SessionInfo:
        return SessionInfo(self.session_id, dict(self.options), edge_reports_delivery=self.report_delivery)

    @property
    def runtime(self) -> SessionRuntime:
        if self.host is None or self.session_id not in self.host.sessions:
            raise RuntimeError("the session is not running")
        runtime = self.host.sessions[self.session_id].runtime
        assert isinstance(runtime, SessionRuntime)
        return runtime

    @property
    def nodes(self) -> list[Node]:
        return self.runtime.nodes

    async def _settle(self) -> None:
        """What ``emit`` waits for: the broker has delivered what was published, the routes that do
        not run as turns have done their part (turns go on), and what that published has arrived."""
        await self.broker.settle()
        if self.host is not None and self.session_id in self.host.sessions:
            async with asyncio.timeout(SETTLE_TIMEOUT_S):
                await self.runtime.inline_routes_idle()
            await self.broker.settle()

    async def __aenter__(self) -> LocalSession:
        await self.attach()
        await self._start_host()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.host is not None:
            await self.host.close_all()
        await self.detach()
        await self.transport.close()

    async def _start_host(self) -> None:
        self.host = SessionHost.for_agent(
            self.transport, self.store, self.agent, owner=f"local-{next(self._hosts)}"
        )
        await self.host.open(self.info)

    async def restart(self) -> None:
        """Stop the owner gracefully (checkpoint, release the lease); a fresh owner with a new agent
        instance adopts the session, as another process would."""
        if self.host is not None:
            await self.host.close_all()
        await self._start_host()

    async def crash(self, *, adopt: bool = True) -> None:
        """The owner dies without a word (no checkpoint, no release); once its lease has run out a
        fresh owner adopts the session from the last checkpoint. With ``adopt=False`` nobody owns
        the session until :meth:`adopt`: what is emitted meanwhile waits in its mailbox."""
        if self.host is not None:
            await self.host.abandon_all()
        self.store.expire_lease(TIER_REASONING, self.session_id)
        if adopt:
            await self.adopt()

    async def adopt(self) -> None:
        """A fresh owner takes the session over (after :meth:`crash` with ``adopt=False``)."""
        await self._start_host()
