"""``bargein.line``: Cartesia Line 0.1's agent API, on bargein's runtime.

Line 0.2 removed the bridge/route API. An agent written for Line 0.1.x moves to bargein by replacing
``line`` with ``bargein.line`` in its imports: the modules below mirror Line 0.1's layout
(``bargein.line.events``, ``bargein.line.bridge``, ``bargein.line.nodes.reasoning``,
``bargein.line.nodes.conversation_context``, ``bargein.line.voice_agent_system``, ...), and every
name is bargein's own class, not a second implementation. The conversation then runs on bargein's
distributed runtime, with interrupts that cancel at once and histories that keep only what the
caller heard. ``docs/migrating-from-line.md`` lists what changes and what works that did not.

Line's top-level exports are here too::

    from bargein.line import Bridge, CallRequest, ReasoningNode, VoiceAgentApp, VoiceAgentSystem
"""

from __future__ import annotations

from bargein.line.bridge import Bridge
from bargein.line.bus import Bus, Message
from bargein.line.call_request import AgentConfig, CallRequest, PreCallResult
from bargein.line.nodes.conversation_context import ConversationContext
from bargein.line.nodes.reasoning import Node, ReasoningNode
from bargein.line.routes import RouteBuilder, RouteConfig
from bargein.line.system import LineAdapter
from bargein.line.user_bridge import register_observability_event
from bargein.line.voice_agent_app import VoiceAgentApp
from bargein.line.voice_agent_system import VoiceAgentSystem
from bargein.runtime.agents import register_adapter

# Importing any bargein.line module (every Line agent does) teaches the runtime Line's agent style.
register_adapter(LineAdapter())

__all__ = [
    "AgentConfig",
    "Bridge",
    "Bus",
    "CallRequest",
    "ConversationContext",
    "Message",
    "Node",
    "PreCallResult",
    "ReasoningNode",
    "RouteBuilder",
    "RouteConfig",
    "VoiceAgentApp",
    "VoiceAgentSystem",
    "register_observability_event",
]
