"""``line.nodes.base``: :class:`Node` (``start``, ``cleanup``, ``on_interrupt_generate``, ``generate``).

One difference from Line: a node created without ``node_id`` gets a deterministic id from the
runtime (its class name, numbered if repeated) instead of a random one, because a session's
checkpoint must find its nodes again in whichever process adopts the session.
"""

from __future__ import annotations

from bargein.agent.nodes import Node

__all__ = ["Node"]
