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
    AudioFrame,
    CustomReceived,
    DTMFInputEvent,
    DTMFOutputEvent,
    DTMFStoppedEvent,
    EmergencyStop,
    EndCall,
    Event,
    FalseInterruption,
    InterruptPolicy,
    LogMetric,
    SessionError,
    SpeechDelivered,
    ToolCall,
    ToolResult,
    TransferCall,
    TurnInterrupted,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
    UserUnknownInputReceived,
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
    "AudioFrame",
    "BargeinError",
    "Bridge",
    "ConversationContext",
    "CustomReceived",
    "DTMFInputEvent",
    "DTMFOutputEvent",
    "DTMFStoppedEvent",
    "EmergencyStop",
    "EndCall",
    "EnvelopeError",
    "Event",
    "FalseInterruption",
    "InterruptPolicy",
    "InvalidEnvelope",
    "InvalidSessionId",
    "LogMetric",
    "Message",
    "MessageTooLarge",
    "Node",
    "ReasoningNode",
    "Route",
    "RouteError",
    "SessionError",
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
    "UserUnknownInputReceived",
    "current_run",
    "messages",
]
