"""A Gemini voice agent in the shape of Cartesia Line 0.1's own examples (``basic_chat``,
``basic_chat_configurable``), written with ``bargein.line`` imports only.

What it uses is what those examples use, so its tests stand for them: a ``ReasoningNode`` whose
``process_context`` streams Gemini through the real ``google-genai`` client, its history built with
``convert_messages_to_gemini(context.get_committed_events())`` (the caller's words, and what the
caller was sent: ``AgentSpeechSent``, routed into the history as Line's examples do), the
``end_call`` tool, and a greeting and system prompt taken from the call request
(``call_request.agent``). Needs ``pip install 'bargein[line]'``; the client reads
``GEMINI_API_KEY`` and, for a self-hosted or test endpoint, ``GOOGLE_GEMINI_BASE_URL``.

Run it: ``BARGEIN_AGENT=bargein.examples.line_gemini_chat:handle_new_call bargein reasoning``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from google import genai
from google.genai import types

from bargein.line import Bridge, CallRequest, ConversationContext, ReasoningNode, VoiceAgentSystem
from bargein.line.events import (
    AgentResponse,
    AgentSpeechSent,
    Event,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.line.tools.system_tools import EndCallArgs, EndCallTool, end_call
from bargein.line.utils.gemini_utils import convert_messages_to_gemini

MODEL = "gemini-2.5-flash"
SYSTEM_PROMPT = "You are a friendly voice assistant. Answer in one or two short sentences."
GREETING = "Hello! What can I do for you?"


class GeminiChat(ReasoningNode):
    def __init__(self, system_prompt: str = SYSTEM_PROMPT, client: Any = None) -> None:
        super().__init__(system_prompt=system_prompt)
        self.client = client if client is not None else genai.Client()

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        config = types.GenerateContentConfig(
            system_instruction=self.system_prompt,
            tools=[EndCallTool.to_gemini_tool()],
            temperature=0,  # a resumed turn re-runs the request: the same answer, for the same history
        )
        contents: Any = convert_messages_to_gemini(context.get_committed_events())  # (the SDK's
        # type for it changes with what is installed beside it, Pillow for one)
        stream = await self.client.aio.models.generate_content_stream(
            model=MODEL, contents=contents, config=config
        )
        async for response in stream:
            if response.text:
                yield AgentResponse(content=response.text)
            for call in response.function_calls or []:
                if call.name == EndCallTool.name():
                    async for event in end_call(EndCallArgs(**(call.args or {}))):
                        yield event


async def handle_new_call(system: VoiceAgentSystem, call_request: CallRequest) -> None:
    agent = call_request.agent
    node = GeminiChat(system_prompt=(agent.system_prompt if agent and agent.system_prompt else SYSTEM_PROMPT))
    bridge = Bridge(node)
    system.with_speaking_node(node, bridge)
    bridge.on(UserTranscriptionReceived).map(node.add_event)
    bridge.on(AgentSpeechSent).map(node.add_event)
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate)
        .stream(node.generate)
        .broadcast()
    )
    await system.start()
    greeting = agent.introduction if agent and agent.introduction is not None else GREETING
    if greeting:
        await system.send_initial_message(greeting)
    await system.wait_for_shutdown()
