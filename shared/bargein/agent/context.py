"""The conversation a reasoning node sees, and a way for seed-style code to reach it.

``ConversationContext`` follows Line 0.1's shape. The history it holds is the *committed* one: an
interrupted assistant message is cut to what the caller actually received (see
:mod:`bargein.agent.nodes`), so ``format_messages`` never feeds the model words the user never heard.
``format_events`` is Line's plain-text rendering, kept as Line had it. ``get_committed_events`` is
exact for bargein's history, and Line's alignment by text when the history holds ``AgentSpeechSent``
(:mod:`bargein.agent.committed`).

:data:`messages` is a read-only view of the current generation's formatted messages. The seed's
``InterruptAwareNode`` calls ``self.llm_client.generate_stream(messages)`` with ``messages`` as a
free name; ``from bargein import messages`` makes that code run as written.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from bargein.agent.committed import commit_spoken
from bargein.agent.events import (
    AgentResponse,
    AgentSpeechSent,
    Event,
    ToolCall,
    ToolResult,
    UserTranscriptionReceived,
)

ChatMessage = dict[str, str]


def join_utterances(before: str, after: str) -> str:
    """Two of the caller's utterances as one text: a space between them when they would otherwise
    run together ("alpha" and "bravo" are two words, not "alphabravo")."""
    glue = " " if before and after and not before[-1].isspace() and not after[0].isspace() else ""
    return before + glue + after


@dataclass
class ConversationContext:
    events: list[Event] = field(default_factory=list)
    system_prompt: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    def format_events(self, max_messages: int | None = None) -> str:
        """Line's rendering: one ``"<type>: <event>"`` line per event (the last ``max_messages``)."""
        events = self.events if max_messages is None else self.events[-max_messages:]
        return "\n".join(f"{type(event)}: {event}" for event in events)

    def format_messages(self, max_messages: int | None = None) -> list[ChatMessage]:
        """The history as OpenAI-style chat messages, system prompt first.

        An answer cut before the caller heard a word of it is an empty assistant message in the
        history (it keeps the turn's place for a late delivery report) and nothing to the model. So
        the caller's words on either side of it are one user message: "are you" and "there?" typed
        while the broker was away reach the model as "are you there?" whether or not an answer to
        "are you" had begun when "there?" cut it, and a model that wants roles to alternate gets
        them alternating."""
        out: list[ChatMessage] = []
        said_last = False  # whether out[-1] holds the caller's own words (not a tool result)
        for ev in self.events:
            message: ChatMessage | None = None
            if isinstance(ev, UserTranscriptionReceived):
                if said_last:
                    out[-1] = {"role": "user", "content": join_utterances(out[-1]["content"], ev.content)}
                    continue
                message = {"role": "user", "content": ev.content}
            elif isinstance(ev, AgentResponse | AgentSpeechSent):
                message = {"role": "assistant", "content": ev.content} if ev.content else None
            elif isinstance(ev, ToolCall):
                message = {"role": "assistant", "content": f"[tool call {ev.tool_name}({ev.tool_args})]"}
            elif isinstance(ev, ToolResult):
                message = {"role": "user", "content": f"[tool result {ev.tool_name}: {ev.result}]"}
            if message is not None:
                out.append(message)
                said_last = isinstance(ev, UserTranscriptionReceived)
        if max_messages is not None:
            out = out[-max_messages:] if max_messages > 0 else []
        if self.system_prompt:
            out.insert(0, {"role": "system", "content": self.system_prompt})
        return out

    def get_latest_user_transcript_message(self) -> str | None:
        for ev in reversed(self.events):
            if isinstance(ev, UserTranscriptionReceived):
                return ev.content
        return None

    def get_event_count(self) -> int:
        return len(self.events)

    def add_metadata(self, key: str, value: Any) -> None:
        self.metadata[key] = value

    def get_committed_events(self) -> list[Event]:
        """The events as the caller experienced them.

        bargein's own history is exact: assistant messages are already cut to the delivered text by
        turn and seq, so with no ``AgentSpeechSent`` in it this is the history without empty
        assistant turns. A history that holds ``AgentSpeechSent`` (a Line agent feeding its speech
        reports into its context) is read as Line read it: each report commits the part of the text
        generated before it that was spoken, and generated text never reported spoken is left out
        (:func:`~bargein.agent.committed.commit_spoken`).
        """
        if any(isinstance(ev, AgentSpeechSent) for ev in self.events):
            return commit_spoken(self.events)
        return [ev for ev in self.events if not (isinstance(ev, AgentResponse) and not ev.content)]

    def copy(self) -> ConversationContext:
        return ConversationContext(
            events=[ev.model_copy() for ev in self.events],
            system_prompt=self.system_prompt,
            metadata=dict(self.metadata),
        )


_CURRENT: contextvars.ContextVar[ConversationContext | None] = contextvars.ContextVar(
    "bargein_current_context", default=None
)


def set_current_context(ctx: ConversationContext) -> None:
    """Make ``ctx`` the one :data:`messages` shows. Each route run is its own task, so this never
    leaks into another session's or another route's generation."""
    _CURRENT.set(ctx)


def current_context() -> ConversationContext | None:
    return _CURRENT.get()


class _CurrentMessages(Sequence[ChatMessage]):
    """A live view: re-read on every access, so it always shows the running generation's context."""

    def _list(self) -> list[ChatMessage]:
        ctx = _CURRENT.get()
        return ctx.format_messages() if ctx is not None else []

    @overload
    def __getitem__(self, index: int) -> ChatMessage: ...
    @overload
    def __getitem__(self, index: slice) -> list[ChatMessage]: ...
    def __getitem__(self, index: int | slice) -> ChatMessage | list[ChatMessage]:
        return self._list()[index]

    def __len__(self) -> int:
        return len(self._list())

    def __iter__(self) -> Iterator[ChatMessage]:
        return iter(self._list())

    def __repr__(self) -> str:
        return f"messages({self._list()!r})"


messages: Sequence[ChatMessage] = _CurrentMessages()
