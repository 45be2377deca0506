"""``line.nodes``: the node classes and the context they reason over."""

from __future__ import annotations

from bargein.line.nodes.conversation_context import ConversationContext
from bargein.line.nodes.reasoning import Node, ReasoningNode

__all__ = ["ConversationContext", "Node", "ReasoningNode"]
