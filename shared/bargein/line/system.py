"""Line-style call wiring: ``async def handle_new_call(system, call_request)``.

Cartesia Line 0.1 agents do not return their bridges; they register them on a ``VoiceAgentSystem``,
call ``start()``, maybe ``send_initial_message(...)``, then ``wait_for_shutdown()`` for the rest of
the call. bargein runs such a function as a task of the session: the bridges are taken once
``start()`` is called (or the function returns), and ``wait_for_shutdown()`` returns when the
session ends or moves to another process. Only the speaking node's output reaches the caller;
other nodes' broadcasts are heard by the session's other bridges (background reasoning).

Because an adopting process runs ``handle_new_call`` again, ``send_initial_message`` sends only
once per session: the checkpoint remembers that it was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bargein.agent.nodes import Node
from bargein.agent.routes import Bridge
from bargein.errors import BargeinError, SessionRejected
from bargein.runtime.agents import Agent, AgentSession, Greeter
from bargein.wire.session_info import SessionInfo


@dataclass
class AgentConfig:
    """Line's per-call agent settings (``call_request.agent``)."""

    system_prompt: str | None = None
    introduction: str | None = None


@dataclass
class CallRequest:
    """What Line handed ``handle_new_call`` about the call; here built from the session start's
    options (``from``, ``to``, ``agent_call_id``, ``agent`` and ``metadata``, when given)."""

    call_id: str
    from_: str = "unknown"
    to: str = "unknown"
    agent_call_id: str = ""
    agent: AgentConfig = field(default_factory=AgentConfig)
    metadata: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.agent_call_id = self.agent_call_id or self.call_id

    @property
    def session_id(self) -> str:
        return self.call_id

    @classmethod
    def from_options(cls, session_id: str, options: dict[str, Any]) -> CallRequest:
        agent = options.get("agent")
        config = (
            AgentConfig(**{k: agent.get(k) for k in ("system_prompt", "introduction")})
            if isinstance(agent, dict)
            else AgentConfig()
        )
        metadata = options.get("metadata")
        return cls(
            call_id=session_id,
            from_=str(options.get("from", "unknown")),
            to=str(options.get("to", "unknown")),
            agent_call_id=str(options.get("agent_call_id", "")),
            agent=config,
            metadata=dict(metadata) if isinstance(metadata, dict) else {},
            options=dict(options),
        )


class VoiceAgentSystem:
    def __init__(self) -> None:
        self.bridges: list[Bridge] = []
        self.speaking_bridge: Bridge | None = None
        self.started = asyncio.Event()
        self.shutdown = asyncio.Event()
        self._send_initial: Greeter | None = None
        self._runtime_ready = asyncio.Event()

    def with_speaking_node(self, node: Node, bridge: Bridge) -> VoiceAgentSystem:
        """The node whose output the caller hears (one per call)."""
        if self.speaking_bridge is not None:
            raise BargeinError("a call has one speaking node; with_speaking_node was called twice")
        self._add(node, bridge)
        self.speaking_bridge = bridge
        return self

    def with_node(self, node: Node, bridge: Bridge) -> VoiceAgentSystem:
        """A background node: its broadcasts go to the other bridges, not to the caller."""
        self._add(node, bridge)
        return self

    def _add(self, node: Node, bridge: Bridge) -> None:
        if bridge.node is not node:
            raise BargeinError(f"bridge {bridge!r} belongs to {bridge.node!r}, not {node!r}")
        if bridge not in self.bridges:
            self.bridges.append(bridge)

    async def start(self) -> None:
        self.started.set()

    async def send_initial_message(self, text: str) -> None:
        """Say ``text`` first, as the speaking node (once per session, however often it is called
        again by processes that adopt the session)."""
        if self.speaking_bridge is None:
            raise BargeinError("send_initial_message needs a speaking node (with_speaking_node)")
        await self._runtime_ready.wait()
        assert self._send_initial is not None
        await self._send_initial(self.speaking_bridge, text)

    async def wait_for_shutdown(self) -> None:
        await self.shutdown.wait()

    def attach(self, send_initial: Greeter) -> None:
        """Called by the runtime once the routes run."""
        self._send_initial = send_initial
        self._runtime_ready.set()


def is_line_style(agent: Callable[..., Any]) -> bool:
    """``handle_new_call(system, call_request)`` takes two positional arguments."""
    try:
        params = [
            p
            for p in inspect.signature(agent).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
    except (TypeError, ValueError):
        return False
    return len(params) == 2


class LineCall(AgentSession):
    """A running ``handle_new_call``: its bridges, its speaking bridge, and the task it runs in."""

    def __init__(self, system: VoiceAgentSystem, task: asyncio.Task[Any]) -> None:
        super().__init__(list(system.bridges), system.speaking_bridge)
        self.system = system
        self.task = task

    async def running(self, greet: Greeter) -> None:
        self.system.attach(greet)

    async def stop(self) -> None:
        self.system.shutdown.set()
        if not self.task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(self.task), timeout=1.0)
        if not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task


class LineAdapter:
    """Runs Line-style agents on bargein's runtime (registered when :mod:`bargein.line` is imported)."""

    def accepts(self, agent: Agent) -> bool:
        return is_line_style(agent)

    async def launch(self, agent: Agent, session: SessionInfo) -> AgentSession:
        """Run ``handle_new_call`` until it has registered its bridges (``start()`` or return)."""
        request = CallRequest.from_options(session.session_id, dict(session.options))
        system = VoiceAgentSystem()
        task = asyncio.create_task(agent(system, request), name=f"call:{request.call_id}")
        started = asyncio.create_task(system.started.wait())
        done, _ = await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if task in done and task.exception() is not None:
            if isinstance(task.exception(), SessionRejected):
                raise task.exception()  # type: ignore[misc]  # the call is declined, not broken
            raise BargeinError(f"handle_new_call failed before start(): {task.exception()!r}")
        if not system.bridges:
            task.cancel()
            raise BargeinError("handle_new_call registered no bridges (with_speaking_node / with_node)")
        return LineCall(system, task)
