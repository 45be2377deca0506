"""Nodes: the agent author's unit of behaviour.

``ReasoningNode.generate`` is what ``.stream(node.generate)`` runs. It builds the context, iterates
the subclass's ``process_context`` and keeps ``current_response`` up to date, then writes the
assistant message into the history:

* completed turn: the whole response, followed by ``AgentGenerationComplete``;
* interrupted turn: only the text the caller received, which the running turn knows
  (:func:`~bargein.agent.turn.current_run`: the edge reports chunks by turn and seq), corrected
  later if a report arrives after the cancel. The model never hears about words the user did not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import BaseModel

from bargein.agent.calling import close_generator
from bargein.agent.context import ConversationContext, join_utterances, set_current_context
from bargein.agent.events import (
    AgentGenerationComplete,
    AgentResponse,
    AgentSpeechSent,
    Event,
    UserTranscriptionReceived,
)
from bargein.agent.llm import LLMClient, shared_llm
from bargein.agent.message import Message
from bargein.agent.turn import current_run

log = logging.getLogger("bargein.agent.nodes")


_MERGED = (UserTranscriptionReceived, AgentResponse, AgentSpeechSent)


# how many recent turns a late delivery report may still correct (the delivery ledger keeps as many)
AMENDABLE_TURNS = 16


@dataclass(frozen=True)
class _Private:
    """A :class:`ReasoningNode`'s state that is not checkpointed (see ``private_state``)."""

    interrupted: dict[int, _InterruptedTurn]
    resumable: _InterruptedTurn | None
    finished: tuple[int, _InterruptedTurn] | None
    clears: int


@dataclass
class _InterruptedTurn:
    """What an interrupted turn produced, the context it answered, and where its cut version sits in
    the history: a late delivery report redoes the cut, :meth:`ReasoningNode.resume` completes it."""

    produced: list[Event]
    start: int
    length: int
    context_events: list[Event]
    heard_before: str = ""  # what earlier turns of this answer had delivered (a resumed answer)


def _append_text(produced: list[Event], text: str) -> None:
    if produced and isinstance(produced[-1], AgentResponse):
        produced[-1] = AgentResponse(content=produced[-1].content + text)
    else:
        produced.append(AgentResponse(content=text))


class _Produced:
    """What an answer has produced so far, in order: text merged into assistant messages, other
    events (tool calls...) as they came. The text of a run of chunks is kept as pieces and made
    into one message when the events are asked for: a new message of all the text so far at every
    chunk cost each chunk a model and each answer the square of its length."""

    def __init__(self) -> None:
        self._events: list[Event] = []
        self._pieces: list[str] = []

    def text(self, piece: str) -> None:
        self._pieces.append(piece)

    def event(self, event: Event) -> None:
        self._merge()
        self._events.append(event)

    def events(self) -> list[Event]:
        self._merge()
        return self._events

    def _merge(self) -> None:
        if self._pieces:
            _append_text(self._events, "".join(self._pieces))
            self._pieces = []


def _cut(produced: list[Event], delivered: str) -> list[Event]:
    """The part of a turn's output the caller received: text up to ``delivered``'s length, and the
    other events (tool calls...) that came before that point. Always at least one (maybe empty)
    assistant message, so the turn stays visible in the history. When the caller received more
    than this process produced (another process had produced it before a hand-over), the text the
    edge says was delivered is the rest."""
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
    if left > 0:
        _append_text(out, delivered[len(delivered) - left :])
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

    def private_state(self) -> object:
        """What the node keeps besides its checkpointed (public) state that a turn may change: the
        runtime takes it before a speculative turn and puts it back if the turn is dropped
        (``restore_private_state``). A plain node keeps nothing of the kind."""
        return None

    def restore_private_state(self, saved: object) -> None:
        """Put back what :meth:`private_state` returned."""

    async def generate(self, message: Message) -> AsyncIterator[Event]:
        raise NotImplementedError(f"{type(self).__name__} must implement generate()")
        yield  # pragma: no cover - makes this an async generator for .stream()


class ReasoningNode(Node):
    """A node that answers the conversation, usually with an LLM.

    Subclasses implement ``async def process_context(self, context)`` yielding ``AgentResponse``.
    The default implementation streams ``generate_response(context)``, which streams
    ``self.llm_client`` (an OpenAI-compatible server when ``BARGEIN_LLM_BASE_URL`` is set, the
    scripted client otherwise; by default the client every session of the process shares,
    :func:`~bargein.agent.llm.shared_llm`).
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
        self._resumable: _InterruptedTurn | None = None  # the last cut-off answer, until a new turn
        # the last finished answer: its voice may still be playing when the caller barges in
        self._finished: tuple[int, _InterruptedTurn] | None = None
        self._clears = 0  # how often clear_context ran (an answer in progress notices)

    @property
    def llm_client(self) -> LLMClient:
        if self._llm_client is None:
            self._llm_client = shared_llm()
        return self._llm_client

    @llm_client.setter
    def llm_client(self, client: LLMClient) -> None:
        self._llm_client = client

    # --- history ---------------------------------------------------------------------------------

    def add_event(self, event: Event | Message) -> None:
        """Append to the history. Consecutive text events of one kind (user transcripts, agent
        responses, speech sent) merge into one by concatenation, as in Line. The agent's are pieces
        of one stream and join as they are; each user transcript is a whole utterance (a burst
        heard, a text typed), so two that would run together ("alpha", "bravo": texts sent while
        the broker was away, arriving at once) are joined with a space."""
        ev = event.event if isinstance(event, Message) else event
        if not isinstance(ev, BaseModel):  # Line's events were plain pydantic models: those are fine
            raise TypeError(f"add_event takes an event (a pydantic model) or a Message, not {event!r:.60}")
        last = self.conversation_events[-1] if self.conversation_events else None
        if isinstance(ev, _MERGED) and isinstance(last, _MERGED) and type(ev) is type(last):
            if isinstance(ev, UserTranscriptionReceived):
                merged = join_utterances(last.content, ev.content)
            else:
                merged = last.content + ev.content
            self.conversation_events[-1] = type(ev)(content=merged)
        else:
            self.conversation_events.append(ev)

    def history_messages(self) -> list[dict[str, str]]:
        """The whole history as chat messages (what the model would see, less the system prompt)."""
        return ConversationContext(events=self.conversation_events).format_messages()

    def clear_context(self) -> list[Event]:
        """Forget the history; returns what it held (as Line did)."""
        cleared, self.conversation_events = self.conversation_events, []
        self._clears += 1  # an answer being generated keeps only what it produces from now on
        self._interrupted.clear()
        self._resumable = self._finished = None
        return cleared

    def private_state(self) -> object:
        """The cut-off answers a late report may amend, the one a cough may resume, the last one
        finished, and the count of clears: a dropped speculative turn changes them as it unwinds."""
        interrupted = {turn: dataclasses.replace(record) for turn, record in self._interrupted.items()}
        resumable = None if self._resumable is None else dataclasses.replace(self._resumable)
        finished = (
            None if self._finished is None else (self._finished[0], dataclasses.replace(self._finished[1]))
        )
        return _Private(interrupted, resumable, finished, self._clears)

    def restore_private_state(self, saved: object) -> None:
        assert isinstance(saved, _Private)
        self._interrupted, self._resumable = saved.interrupted, saved.resumable
        self._finished, self._clears = saved.finished, saved.clears

    def amendable(self, turn: int, *, final: bool = False) -> bool:
        """Whether a delivery report of ``turn`` could change the history (see below)."""
        return turn in self._interrupted or (
            final and self._finished is not None and self._finished[0] == turn
        )

    def amend_interrupted_turn(self, turn: int, delivered_text: str, *, final: bool = False) -> bool:
        """A delivery report for an interrupted turn came after the cancel: correct the history.
        ``final``: the caller will hear no more of ``turn``; if it is the answer this node finished
        last (the agent's voice was still playing it when the caller barged in), it is cut as an
        interrupted one is, and may be resumed. Returns whether anything changed."""
        record = self._interrupted.get(turn)
        if record is None and final and self._finished is not None and self._finished[0] == turn:
            record = self._interrupted[turn] = self._resumable = self._finished[1]
            self._finished = None
        if record is None:
            return False
        cut = _cut(record.produced, record.heard_before + delivered_text)
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
        events = self.conversation_events[-self.max_context_length :] if self.max_context_length else []
        self._resumable = None  # a new answer: the old cut-off one is history now
        answer = self._answer(list(events), heard="", start=len(self.conversation_events), length=0)
        try:
            async for item in answer:
                yield item
        except BaseException as exc:  # cancelled at our yield: _answer must unwind now, not at GC
            await close_generator(answer, exc)
            raise

    async def resume(self, message: Message) -> AsyncIterator[Event]:
        """Pick the last cut-off answer up where the caller stopped hearing it.

        Route ``FalseInterruption`` here (the barge-in was only a cough): the answer is generated
        again from the context it had, and streamed from the first character the caller did not
        receive; the history's cut answer becomes the whole one. Exact for a reproducible model (the
        scripted client, an LLM at temperature 0); with sampling it continues a fresh answer after
        the same number of characters. With nothing to resume it yields nothing.
        """
        record, self._resumable = self._resumable, None
        if record is None:
            return
        section = self.conversation_events[record.start : record.start + record.length]
        heard = "".join(e.content for e in section if isinstance(e, AgentResponse))
        answer = self._answer(record.context_events, heard, record.start, record.length)
        try:
            async for item in answer:
                yield item
        except BaseException as exc:
            await close_generator(answer, exc)
            raise

    async def _answer(
        self, context_events: list[Event], heard: str, start: int, length: int
    ) -> AsyncIterator[Event]:
        """Generate an answer to ``context_events`` whose first ``len(heard)`` characters the caller
        already has (skipped), and keep history[start:start+length] as this answer."""
        self.current_response = heard
        context = ConversationContext(events=list(context_events), system_prompt=self.system_prompt)
        # ``self.context`` is the running generation's context (the seed's handlers copy it), unless
        # the node keeps an object of its own there (Line let it: personal_banking's BankContext)
        if getattr(self, "context", None) is None or isinstance(self.context, ConversationContext):
            self.context = context
        set_current_context(context)
        produced = _Produced()
        skip = len(heard)
        clears = self._clears
        gen = self.process_context(context)
        try:
            async for item in gen:
                if self._clears != clears:  # the node cleared its history mid-answer (Line let it)
                    clears, produced, start, length = (
                        self._clears,
                        _Produced(),
                        len(self.conversation_events),
                        0,
                    )
                if isinstance(item, AgentResponse):
                    produced.text(item.content)
                    text, skip = item.content[skip:], max(0, skip - len(item.content))
                    if not text:
                        continue
                    self.current_response += text
                    yield item if text == item.content else AgentResponse(content=text)
                elif not isinstance(item, AgentGenerationComplete):
                    produced.event(item)
                    if not skip:
                        yield item
        except BaseException as exc:
            await close_generator(gen, exc)
            if isinstance(exc, asyncio.CancelledError | GeneratorExit):
                self._record_interrupted(produced.events(), heard, context_events, start, length)
            raise
        if self._clears != clears:
            produced, start, length = _Produced(), len(self.conversation_events), 0
        whole = produced.events() or [AgentResponse(content="")]
        self.conversation_events[start : start + length] = whole
        run = current_run()
        if run is not None and run.turn is not None:
            self._finished = (
                run.turn,
                _InterruptedTurn(produced.events(), start, len(whole), list(context_events), heard),
            )
        yield AgentGenerationComplete()

    def _record_interrupted(
        self, produced: list[Event], heard: str, context_events: list[Event], start: int, length: int
    ) -> None:
        run = current_run()
        cut = _cut(produced, heard + (run.delivered_text() if run is not None else ""))
        self.conversation_events[start : start + length] = cut
        record = _InterruptedTurn(produced, start, len(cut), list(context_events), heard)
        self._resumable = record
        if run is not None and run.turn is not None:
            self._interrupted[run.turn] = record
            for old in [turn for turn in self._interrupted if turn <= run.turn - AMENDABLE_TURNS]:
                del self._interrupted[old]  # no report comes for them any more
