"""``line.nodes.reasoning``: :class:`ReasoningNode` (and :class:`Node`, which Line exported here too).

Subclass it and implement ``async def process_context(self, context)`` as in Line. What changes is
what the history keeps: an interrupted answer is recorded as the text the caller actually received
(by turn and seq, reported by the client edge), not everything the model had generated.
"""

from __future__ import annotations

from bargein.agent.nodes import Node, ReasoningNode

__all__ = ["Node", "ReasoningNode"]
