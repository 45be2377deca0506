"""What an agent is to the runtime, and how other agent styles plug in.

bargein's own agent is a function ``agent(session: SessionInfo)`` (sync or async) that returns the
session's bridge or bridges. Other styles (Line 0.1's ``handle_new_call(system, call_request)``, say)
are turned into the same thing by an :class:`AgentAdapter`, which their package registers with
:func:`register_adapter` when it is imported; the runtime asks the registered adapters first and
never knows any of them by name.

What the runtime runs for a session is an :class:`AgentSession`: the bridges, which bridge's output
reaches the caller, a hook once the routes run (to say a greeting), and a hook to stop.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from bargein.agent.routes import Bridge
from bargein.errors import BargeinError
from bargein.wire.session_info import SessionInfo

AgentResult = Bridge | list[Bridge] | tuple[Bridge, ...]
Agent = Callable[..., Any]
"""``agent(session) -> Bridge | list[Bridge]`` (or an awaitable of one), or any callable a registered
:class:`AgentAdapter` accepts."""

Greeter = Callable[[Bridge, str], Awaitable[None]]
"""``greet(bridge, text)``: say ``text`` as a turn of ``bridge``, once per session."""


class AgentSession:
    """One session's agent, as the runtime drives it. The base class is a plain agent's."""

    def __init__(self, bridges: list[Bridge], speaking_bridge: Bridge | None = None) -> None:
        self.bridges = bridges
        # None: every bridge's output reaches the caller; otherwise only this one's does, and the
        # others' broadcasts are heard by the session's bridges alone (background reasoning)
        self.speaking_bridge = speaking_bridge

    async def running(self, greet: Greeter) -> None:
        """Called once the routes run and the nodes have started."""

    async def stop(self) -> None:
        """Called when the session stops running in this process."""


class AgentAdapter(Protocol):
    def accepts(self, agent: Agent) -> bool:
        """Whether ``agent`` is of this adapter's style."""

    async def launch(self, agent: Agent, session: SessionInfo) -> AgentSession:
        """Build one session's agent."""


_ADAPTERS: list[AgentAdapter] = []


def register_adapter(adapter: AgentAdapter) -> None:
    """Let the runtime run agents of another style (later registrations are asked first)."""
    if adapter not in _ADAPTERS:
        _ADAPTERS.insert(0, adapter)


async def launch_agent(agent: Agent, session: SessionInfo) -> AgentSession:
    for adapter in _ADAPTERS:
        if adapter.accepts(agent):
            return await adapter.launch(agent, session)
    return AgentSession(await build_bridges(agent, session))


async def build_bridges(agent: Agent, session: SessionInfo) -> list[Bridge]:
    """Call a plain agent and check what it returned."""
    _check_plain(agent)
    result: Any = agent(session)
    if inspect.isawaitable(result):
        result = await result
    bridges = [result] if isinstance(result, Bridge) else list(result or [])
    if not bridges or not all(isinstance(b, Bridge) for b in bridges):
        raise BargeinError(f"agent {agent!r} must return a Bridge or a list of Bridges, got {result!r}")
    return bridges


def _check_plain(agent: Agent) -> None:
    try:
        inspect.signature(agent).bind(None)
    except TypeError:
        raise BargeinError(
            f"agent {agent!r} must take one argument, the SessionInfo (its signature is "
            f"{inspect.signature(agent)}); an agent of another style needs its adapter registered, "
            "which importing its package does (a Line-style handle_new_call: any bargein.line module)"
        ) from None
    except ValueError:  # no signature to check (some builtins): let the call decide
        return
