"""``line.evals``: conversation tests for reasoning nodes, as Line 0.1 wrote them.

An expected conversation is a list of :class:`UserTurn` and :class:`AgentTurn`;
:class:`ConversationRunner` plays it to a node and checks each answer by meaning rather than by
exact text (see :mod:`bargein.line.evals.similarity_utils`: ``"*"`` and exact matches are decided
locally, everything else is judged by Gemini through the optional ``google-genai`` package)::

    await ConversationRunner(node, [UserTurn(text="hi"), AgentTurn(text="<greets the caller>")]).run()
"""

from __future__ import annotations

from bargein.line.evals.conversation_runner import ConversationRunner
from bargein.line.evals.turn import AgentTurn, Turn, UserTurn

__all__ = ["AgentTurn", "ConversationRunner", "Turn", "UserTurn"]
