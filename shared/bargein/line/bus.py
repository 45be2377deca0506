"""``line.bus``: the :class:`Message` routes, filters and handlers receive.

It is bargein's :class:`bargein.agent.message.Message`, which has Line's ``.event``, ``.source``, ``.id``
and ``.timestamp`` and adds where the event sits in the session (``.session``, ``.turn``, ``.seq``,
``.epoch``). Line's in-memory ``Bus`` is not provided: in bargein the session runtime and RabbitMQ
carry the events, and agents never touch the bus directly.
"""

from __future__ import annotations

from bargein.agent.message import Message

__all__ = ["Message"]
