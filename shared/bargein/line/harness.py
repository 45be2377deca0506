"""``line.harness``: :class:`ConversationHarness`, Line's side of the agent WebSocket.

Line ran every agent behind Cartesia's cloud harness, which spoke the JSON messages of
:mod:`bargein.line.harness_types` over a WebSocket; the harness object turned those into bus
events (``map_to_events``) and sent the agent's output back. bargein's own clients speak
``docs/protocol.md`` to the client edge instead, so the runtime never needs this class; it is here,
working, for code that serves Line's protocol itself (a FastAPI or Starlette WebSocket, or anything
with ``receive_json`` and ``send_json``), typically with ``bridge.with_input_routing(harness)``.

Sends are serialised by a lock: concurrent ``send_*`` calls (fire-and-forget tasks from the bus)
reach the socket in the order they were made.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from pydantic import TypeAdapter, ValidationError
from starlette.websockets import WebSocketDisconnect

from bargein.agent.events import (
    AgentSpeechSent,
    AgentStartedSpeaking,
    AgentStoppedSpeaking,
    CustomReceived,
    DTMFInputEvent,
    Event,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
    UserUnknownInputReceived,
)
from bargein.line.harness_types import (
    AgentSpeechInput,
    AgentStateInput,
    CustomInput,
    DTMFInput,
    DTMFOutput,
    EndCallOutput,
    ErrorOutput,
    InputMessage,
    LogEventOutput,
    LogMetricOutput,
    MessageOutput,
    OutputMessage,
    ToolCallOutput,
    TranscriptionInput,
    TransferOutput,
    UserStateInput,
)
from bargein.tasks import cancel_and_wait

log = logging.getLogger("bargein.line")
_INPUT: TypeAdapter[InputMessage] = TypeAdapter(InputMessage)
RETRY_PAUSE_S = 0.1


class JsonSocket(Protocol):
    async def receive_json(self) -> Any: ...
    async def send_json(self, data: Any) -> None: ...


class State:
    SPEAKING = "speaking"
    IDLE = "idle"


class ConversationHarness:
    def __init__(self, websocket: JsonSocket, shutdown_event: asyncio.Event) -> None:
        self.websocket = websocket
        self.shutdown_event = shutdown_event
        self.input_queue: asyncio.Queue[InputMessage] = asyncio.Queue()
        self.input_task: asyncio.Task[None] | None = None
        self.is_running = False
        self._send_lock = asyncio.Lock()

    async def start(self) -> None:
        if self.is_running:
            return
        self.is_running = True
        self.input_task = asyncio.create_task(self._input_processor(), name="line-harness-input")

    async def _input_processor(self) -> None:
        """Read, validate and queue the harness's messages until it hangs up; a bad message is
        logged and skipped."""
        while not self.shutdown_event.is_set():
            try:
                raw = await self.websocket.receive_json()
                await self.input_queue.put(_INPUT.validate_python(raw))
            except WebSocketDisconnect:
                log.info("harness WebSocket closed")
                self.shutdown_event.set()
            except (ValidationError, ValueError) as exc:
                log.warning("harness sent a message that is not Line's protocol: %s", exc)
            except Exception:
                log.exception("reading the harness WebSocket failed")
                await asyncio.sleep(RETRY_PAUSE_S)

    async def get(self) -> InputMessage:
        return await self.input_queue.get()

    async def _send(self, output: OutputMessage) -> None:
        async with self._send_lock:
            if self.shutdown_event.is_set():
                return
            try:
                await self.websocket.send_json(output.model_dump())
            except Exception as exc:
                log.warning("sending to the harness failed (%s); shutting down", exc)
                self.shutdown_event.set()

    async def end_call(self) -> None:
        await self._send(EndCallOutput())

    async def transfer_call(self, target_phone_number: str, timeout_s: float) -> None:
        """Ask the harness to transfer the call, give the second leg ``timeout_s`` to connect, then
        shut down (the transferred call goes on without the agent)."""
        await self._send(TransferOutput(target_phone_number=target_phone_number))
        await asyncio.sleep(timeout_s)
        self.shutdown_event.set()

    async def send_message(self, message: str) -> None:
        await self._send(MessageOutput(content=message))

    async def send_error(self, error: str) -> None:
        await self._send(ErrorOutput(content=error))

    async def send_tool_call(
        self,
        tool_name: str,
        tool_args: dict[str, Any],
        tool_call_id: str | None = None,
        result: str | None = None,
    ) -> None:
        await self._send(ToolCallOutput(name=tool_name, arguments=tool_args, result=result, id=tool_call_id))

    async def log_event(self, event: str, metadata: dict[str, Any] | None = None) -> None:
        await self._send(LogEventOutput(event=event, metadata=metadata))

    async def log_metric(self, name: str, value: Any) -> None:
        await self._send(LogMetricOutput(name=name, value=value))

    async def send_dtmf(self, button: str) -> None:
        await self._send(DTMFOutput(button=button))

    async def cleanup(self) -> None:
        self.shutdown_event.set()
        self.is_running = False
        if self.input_task is not None and not self.input_task.done():
            await cancel_and_wait(self.input_task)
        while not self.input_queue.empty():
            self.input_queue.get_nowait()

    def map_to_events(self, message: InputMessage) -> list[Event]:
        """The bus events a harness message stands for."""
        if isinstance(message, UserStateInput | AgentStateInput):
            user = isinstance(message, UserStateInput)
            if message.value == State.SPEAKING:
                return [UserStartedSpeaking() if user else AgentStartedSpeaking()]
            if message.value == State.IDLE:
                return [UserStoppedSpeaking() if user else AgentStoppedSpeaking()]
            return []
        if isinstance(message, TranscriptionInput):
            return [UserTranscriptionReceived(content=message.content)]
        if isinstance(message, AgentSpeechInput):
            return [AgentSpeechSent(content=message.content)]
        if isinstance(message, DTMFInput):
            return [DTMFInputEvent(button=message.button)]
        if isinstance(message, CustomInput):
            return [CustomReceived(metadata=message.metadata)]
        return [UserUnknownInputReceived(input_data=message.model_dump_json())]


__all__ = ["ConversationHarness", "State"]
