"""``line.harness_types``: the JSON messages of Line's agent WebSocket (Cartesia's cloud harness).

Inputs arrive from the harness (the caller's transcript and state, DTMF, what was spoken, custom
metadata); outputs go to it (text to speak, tool calls, transfers, hang-ups, logs). Field names and
``type`` tags are the wire protocol, so they are Line's.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class TranscriptionInput(BaseModel):
    content: str
    type: Literal["message"] = "message"


class DTMFInput(BaseModel):
    button: str
    type: Literal["dtmf"] = "dtmf"


class UserStateInput(BaseModel):
    value: str
    type: Literal["user_state"] = "user_state"


class AgentStateInput(BaseModel):
    value: str
    type: Literal["agent_state"] = "agent_state"


class ValidationErrorInput(BaseModel):
    error_message: str
    error_type: str
    type: Literal["validation_error"] = "validation_error"


class AgentSpeechInput(BaseModel):
    content: str
    type: Literal["agent_speech"] = "agent_speech"


class CustomInput(BaseModel):
    metadata: dict[str, object]
    type: Literal["custom"] = "custom"


InputMessage = (
    TranscriptionInput
    | DTMFInput
    | UserStateInput
    | AgentStateInput
    | ValidationErrorInput
    | AgentSpeechInput
    | CustomInput
)


class ErrorOutput(BaseModel):
    type: Literal["error"] = "error"
    content: str


class DTMFOutput(BaseModel):
    type: Literal["dtmf"] = "dtmf"
    button: str


class MessageOutput(BaseModel):
    type: Literal["message"] = "message"
    content: str


class ToolCallOutput(BaseModel):
    type: Literal["tool_call"] = "tool_call"
    name: str
    arguments: dict[str, object]
    result: str | None = None
    id: str | None = None


class TransferOutput(BaseModel):
    type: Literal["transfer"] = "transfer"
    target_phone_number: str


class EndCallOutput(BaseModel):
    type: Literal["end_call"] = "end_call"


class LogEventOutput(BaseModel):
    type: Literal["log_event"] = "log_event"
    event: str
    metadata: dict[str, object] | None = None


class LogMetricOutput(BaseModel):
    type: Literal["log_metric"] = "log_metric"
    name: str
    value: object


OutputMessage = (
    ErrorOutput
    | DTMFOutput
    | MessageOutput
    | ToolCallOutput
    | TransferOutput
    | EndCallOutput
    | LogEventOutput
    | LogMetricOutput
)
