"""bargein: interruptible voice agents in the route style, run as a distributed system.

Agent code imports everything it needs from here::

    from bargein import Bridge, ReasoningNode, AgentResponse, UserStartedSpeaking, UserStoppedSpeaking
"""

from bargein.agent.context import ConversationContext, messages
from bargein.agent.events import (
    AgentError,
    AgentGenerationComplete,
    AgentHandoff,
    AgentPlayback,
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
    OutputMissed,
    SessionError,
    SpeechDelivered,
    ToolCall,
    ToolResult,
    TransferCall,
    TurnInterrupted,
    UserBackchannel,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
    UserUnknownInputReceived,
)
from bargein.agent.llm import Chunk, LLMClient, OpenAICompatibleLLM, ScriptedLLM
from bargein.agent.message import Message, Source
from bargein.agent.nodes import Node, ReasoningNode
from bargein.agent.routes import Bridge, Route
from bargein.agent.turn import current_run
from bargein.agent.words import content_words, words_at_least
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
from bargein.wire.session_info import SessionInfo

__version__ = "0.1.0"

__all__ = [
    "AgentError",
    "AgentGenerationComplete",
    "AgentHandoff",
    "AgentPlayback",
    "AgentResponse",
    "AgentSpeechSent",
    "AgentStartedSpeaking",
    "AgentStoppedSpeaking",
    "AudioFrame",
    "BargeinError",
    "Bridge",
    "Chunk",
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
    "LLMClient",
    "LogMetric",
    "Message",
    "MessageTooLarge",
    "Node",
    "OpenAICompatibleLLM",
    "OutputMissed",
    "ReasoningNode",
    "Route",
    "RouteError",
    "ScriptedLLM",
    "SessionError",
    "SessionInfo",
    "SettingsError",
    "Source",
    "SpeechDelivered",
    "ToolCall",
    "ToolResult",
    "TransferCall",
    "TurnInterrupted",
    "UndecodableMessage",
    "UnknownEventType",
    "UserBackchannel",
    "UserStartedSpeaking",
    "UserStoppedSpeaking",
    "UserTranscriptionReceived",
    "UserUnknownInputReceived",
    "content_words",
    "current_run",
    "messages",
    "words_at_least",
]
