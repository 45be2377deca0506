"""Testing agents in one process: ``async with LocalSession(agent) as s`` (see :mod:`.local`), and
the caller/edge role it plays over any transport (:class:`~bargein.testing.caller.Caller`)."""

from bargein.testing.caller import Caller
from bargein.testing.local import LocalSession

__all__ = ["Caller", "LocalSession"]
