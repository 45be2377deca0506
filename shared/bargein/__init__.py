"""bargein: interruptible voice agents in the route style, run as a distributed system.

Agent code imports everything it needs from here::

    from bargein import Bridge, ReasoningNode, AgentResponse, UserStartedSpeaking, UserStoppedSpeaking
"""

from bargein.context import ConversationContext, messages
from bargein.errors import (
    BargeinError,
    EnvelopeError,
    InvalidEnvelope,
    InvalidSessionId,
    MessageTooLarge,
    RouteError,
    SettingsError,
    UndecodableMessage,
    UnknownEventType,
)
from bargein.events import (
    AgentError,
    AgentGenerationComplete,
    AgentHandoff,
    AgentResponse,
    AgentSpeechSent,
    AgentStartedSpeaking,
    AgentStoppedSpeaking,
    CustomReceived,
    DTMFInputEvent,
    DTMFOutputEvent,
    EmergencyStop,
    EndCall,
    Event,
    LogMetric,
    SpeechDelivered,
    ToolCall,
    ToolResult,
    TransferCall,
    TurnInterrupted,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.message import Message
from bargein.nodes import Node, ReasoningNode
from bargein.route import Bridge, Route
from bargein.runtime import SessionInfo, current_run

__version__ = "0.1.0"

__all__ = [
    "AgentError",
    "AgentGenerationComplete",
    "AgentHandoff",
    "AgentResponse",
    "AgentSpeechSent",
    "AgentStartedSpeaking",
    "AgentStoppedSpeaking",
    "BargeinError",
    "Bridge",
    "ConversationContext",
    "CustomReceived",
    "DTMFInputEvent",
    "DTMFOutputEvent",
    "EmergencyStop",
    "EndCall",
    "EnvelopeError",
    "Event",
    "InvalidEnvelope",
    "InvalidSessionId",
    "LogMetric",
    "Message",
    "MessageTooLarge",
    "Node",
    "ReasoningNode",
    "Route",
    "RouteError",
    "SessionInfo",
    "SettingsError",
    "SpeechDelivered",
    "ToolCall",
    "ToolResult",
    "TransferCall",
    "TurnInterrupted",
    "UndecodableMessage",
    "UnknownEventType",
    "UserStartedSpeaking",
    "UserStoppedSpeaking",
    "UserTranscriptionReceived",
    "current_run",
    "messages",
]
