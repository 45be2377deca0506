"""``line.nodes.conversation_context``: :class:`ConversationContext`.

``get_committed_events()`` returns the same shape as Line's (the history with each assistant turn as
one ``AgentResponse``). bargein's own history is already exact (the runtime cuts an interrupted
answer to the chunks the edge reported delivered), so it comes back as it is; a history holding
``AgentSpeechSent`` is aligned by text as Line did (:mod:`bargein.agent.committed`).
"""

from __future__ import annotations

from bargein.agent.context import ConversationContext

__all__ = ["ConversationContext"]
