"""``line.nodes.conversation_context``: :class:`ConversationContext`.

``get_committed_events()`` returns the same shape as Line's (the history with each assistant turn as
one ``AgentResponse``), but exactly: the runtime cuts an interrupted answer to the chunks the edge
reported delivered, instead of Line's after-the-fact alignment of generated text with
``AgentSpeechSent``.
"""

from __future__ import annotations

from bargein.agent.context import ConversationContext

__all__ = ["ConversationContext"]
