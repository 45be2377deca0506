"""Nodes: the agent author's unit of behaviour.

``ReasoningNode.generate`` is what ``.stream(node.generate)`` runs. It builds the context, iterates
the subclass's ``process_context`` and keeps ``current_response`` up to date, then writes the
assistant message into the history:

* completed turn: the whole response, followed by ``AgentGenerationComplete``;
* interrupted turn: only the text the caller received, taken from the session's delivery ledger
  (the edge reports chunks by turn and seq), and corrected later if a report arrives after the
  cancel. The model never hears about words the user did not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bargein._callables import close_generator
from bargein.context import ConversationContext, set_current_context
from bargein.events import (
    AgentGenerationComplete,
    AgentResponse,
    AgentSpeechSent,
    Event,
    UserTranscriptionReceived,
)

if TYPE_CHECKING:
    from bargein.llm import LLMClient
    from bargein.message import Message

log = logging.getLogger("bargein.nodes")


_MERGED = (UserTranscriptionReceived, AgentResponse, AgentSpeechSent)


@dataclass
class _InterruptedTurn:
    """What an interrupted turn produced and where its cut version sits in the history, so a late
    delivery report can redo the cut."""

    produced: list[Event]
    start: int
    length: int


def _append_text(produced: list[Event], text: str) -> None:
    if produced and isinstance(produced[-1], AgentResponse):
        produced[-1] = AgentResponse(content=produced[-1].content + text)
    else:
        produced.append(AgentResponse(content=text))


def _cut(produced: list[Event], delivered: str) -> list[Event]:
    """The part of a turn's output the caller received: text up to ``delivered``'s length, and the
    other events (tool calls...) that came before that point. Always at least one (maybe empty)
    assistant message, so the turn stays visible in the history."""
    left = len(delivered)
    out: list[Event] = []
    for event in produced:
        if isinstance(event, AgentResponse):
            if left <= 0:
                break
            out.append(AgentResponse(content=event.content[:left]))
            left -= len(event.content)
        elif left > 0 or not out:
            out.append(event)
    if not any(isinstance(e, AgentResponse) for e in out):
        out.append(AgentResponse(content=""))
    return out


class Node:
    """A participant in the session. ``node_id`` defaults to a name the runtime assigns
    deterministically (class name, numbered if repeated), so checkpoints find their node again in
    whichever process adopts the session."""

    def __init__(self, node_id: str | None = None) -> None:
        self.id: str | None = node_id

    async def start(self) -> None:
        """Called once the session's bridges are running."""

    async def cleanup(self) -> None:
        """Called when the session ends in this process."""

    def on_interrupt_generate(self, message: Message) -> None:
        """Called (as an interrupt handler) after an interrupted generation has unwound."""

    async def generate(self, message: Message) -> AsyncIterator[Event]:
        raise NotImplementedError(f"{type(self).__name__} must implement generate()")
        yield  # pragma: no cover - makes this an async generator for .stream()


class ReasoningNode(Node):
    """A node that answers the conversation, usually with an LLM.

    Subclasses implement ``async def process_context(self, context)`` yielding ``AgentResponse``.
    The default implementation streams ``generate_response(context)``, which streams
    ``self.llm_client`` (an OpenAI-compatible server when ``BARGEIN_LLM_BASE_URL`` is set, the
    scripted client otherwise).
    """

    def __init__(
        self,
        system_prompt: str = "",
        max_context_length: int = 100,
        node_id: str | None = None,
        llm_client: LLMClient | None = None,
    ) -> None:
        super().__init__(node_id)
        self.system_prompt = system_prompt
        self.max_context_length = max_context_length
        self.conversation_events: list[Event] = []
        self.current_response = ""
        self.context = ConversationContext(system_prompt=system_prompt)
        self._llm_client = llm_client
        self._interrupted: dict[int, _InterruptedTurn] = {}

    @property
    def llm_client(self) -> LLMClient:
        if self._llm_client is None:
            from bargein.llm import llm_from_settings

            self._llm_client = llm_from_settings()
        return self._llm_client

    @llm_client.setter
    def llm_client(self, client: LLMClient) -> None:
        self._llm_client = client

    # --- history ---------------------------------------------------------------------------------

    def add_event(self, event: Event | Message) -> None:
        """Append to the history. Consecutive text events of one kind (user transcripts, agent
        responses, speech sent) merge into one by plain concatenation, as in Line."""
        ev = getattr(event, "event", event)
        if not isinstance(ev, Event):
            raise TypeError(f"add_event takes an Event or Message, got {type(event).__name__}")
        last = self.conversation_events[-1] if self.conversation_events else None
        if isinstance(ev, _MERGED) and isinstance(last, _MERGED) and type(ev) is type(last):
            self.conversation_events[-1] = type(ev)(content=last.content + ev.content)
        else:
            self.conversation_events.append(ev)

    def clear_context(self) -> list[Event]:
        """Forget the history; returns what it held (as Line did)."""
        cleared, self.conversation_events = self.conversation_events, []
        self._interrupted.clear()
        return cleared

    def amend_interrupted_turn(self, turn: int, delivered_text: str) -> bool:
        """A delivery report for an interrupted turn came after the cancel: correct the history.
        Returns whether anything changed."""
        record = self._interrupted.get(turn)
        if record is None:
            return False
        cut = _cut(record.produced, delivered_text)
        current = self.conversation_events[record.start : record.start + record.length]
        if current == cut:
            return False
        self.conversation_events[record.start : record.start + record.length] = cut
        record.length = len(cut)
        return True

    # --- generation ------------------------------------------------------------------------------

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        async for text in self.generate_response(context):
            yield AgentResponse(content=text)

    async def generate_response(self, context: ConversationContext) -> AsyncIterator[str]:
        """Stream the LLM's answer to ``context`` as text pieces."""
        stream = self.llm_client.generate_stream(context.format_messages())
        try:
            async for chunk in stream:
                if chunk.text:
                    yield chunk.text
        finally:  # an interrupted turn closes the HTTP stream now, so the server stops generating
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    async def generate(self, message: Message) -> AsyncIterator[Event]:
        """Run ``process_context`` and keep the history: what it yields, in order (text merged into
        assistant messages, tool calls and other events as they came), whole when the turn
        completes, cut to what the caller received when it is interrupted."""
        self.current_response = ""
        events = self.conversation_events[-self.max_context_length :] if self.max_context_length else []
        self.context = ConversationContext(events=list(events), system_prompt=self.system_prompt)
        set_current_context(self.context)
        produced: list[Event] = []
        gen = self.process_context(self.context)
        try:
            async for item in gen:
                if isinstance(item, AgentResponse):
                    self.current_response += item.content
                    _append_text(produced, item.content)
                elif not isinstance(item, AgentGenerationComplete):
                    produced.append(item)
                yield item
        except BaseException as exc:
            await close_generator(gen, exc)
            if isinstance(exc, asyncio.CancelledError | GeneratorExit):
                self._record_interrupted(produced)
            raise
        self.conversation_events.extend(produced or [AgentResponse(content="")])
        yield AgentGenerationComplete()

    def _record_interrupted(self, produced: list[Event]) -> None:
        from bargein.runtime import current_run

        run = current_run()
        cut = _cut(produced, run.delivered_text() if run is not None else "")
        start = len(self.conversation_events)
        self.conversation_events.extend(cut)
        if run is not None and run.turn is not None:
            self._interrupted[run.turn] = _InterruptedTurn(produced, start, len(cut))
