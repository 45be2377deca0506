"""What the caller heard of the agent's text, told by ``AgentSpeechSent``: Line 0.1's alignment.

Line 0.1 kept the text an agent generated (``AgentResponse``) and the text its speech engine reported
spoken (``AgentSpeechSent``) side by side in the history, and worked out afterwards which part of
the generated text was heard. The speech engine reports words without the whitespace between them
(``"Helloworld!How"`` for ``"Hello world! How are you?"`` cut off after "How"), so the two texts
cannot be compared as strings; Line agents nevertheless expect the committed history to keep the
generated text's own formatting (spaces, newlines, tabs). bargein's own runtime never needs this (it
cuts an interrupted answer by turn and seq, see :mod:`bargein.agent.nodes`); it exists so that a Line
agent which feeds ``AgentSpeechSent`` into its context gets the history it got on Line.

The rule, per ``AgentSpeechSent``: the text generated since the last one is *pending*; it is split
into tokens (runs of whitespace, of word characters, of other characters); each non-whitespace
token that the spoken text continues with is committed and consumed from it, one it does not is
dropped (the engine skipped or rewrote it), and whitespace between committed tokens is kept as
generated. When the spoken text is used up, the tokens not reached stay pending for the next
``AgentSpeechSent`` (an engine may report one answer in several pieces); when it is not (a report
that ends inside a word, which is then not committed), nothing stays pending. Text without any whitespace
(Chinese, Japanese, a single word) gives no word boundaries to align on, so there the spoken text is
committed as reported and nothing stays pending.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from bargein.agent.events import AgentResponse, AgentSpeechSent, Event

__all__ = ["Alignment", "align_spoken", "commit_spoken"]


class _Kind(Enum):
    SPACE = "space"
    WORD = "word"
    OTHER = "other"  # punctuation, symbols, emoji


def _kind(ch: str, previous: _Kind | None) -> _Kind:
    """A character's token kind. A combining mark belongs with the character it modifies, so that
    a word in Devanagari or Thai, or an accented letter written decomposed, is one token and an
    interruption never commits half of a written syllable."""
    if ch.isspace():
        return _Kind.SPACE
    if unicodedata.category(ch).startswith("M"):
        return previous if previous is not None and previous is not _Kind.SPACE else _Kind.WORD
    if ch.isalnum() or ch == "_":
        return _Kind.WORD
    return _Kind.OTHER


def _tokens(text: str) -> list[tuple[_Kind, str]]:
    """``text`` as maximal runs of one kind; joined back together they are ``text`` exactly."""
    out: list[tuple[_Kind, str]] = []
    start = 0
    current: _Kind | None = None
    for index, ch in enumerate(text):
        kind = _kind(ch, current)
        if kind is not current:
            if current is not None:
                out.append((current, text[start:index]))
            start, current = index, kind
    if current is not None:
        out.append((current, text[start:]))
    return out


@dataclass(frozen=True)
class Alignment:
    """One ``AgentSpeechSent`` applied to the pending text.

    ``committed`` is the spoken part in the generated text's formatting, stripped at both ends;
    ``pending`` is the generated text the speech has not reached yet."""

    committed: str
    pending: str


def align_spoken(pending: str, speech: str) -> Alignment:
    """Which part of ``pending`` (generated, formatted text) ``speech`` (reported spoken) covers.

    Whitespace in ``speech`` is ignored rather than matched: engines leave it out, and where one
    keeps it (a report starting with a space) it carries nothing to align on either way."""
    if not any(ch.isspace() for ch in pending):
        return Alignment(committed=speech.strip(), pending="")
    spoken = "".join(speech.split())
    position = 0
    kept: list[str] = []
    tokens = _tokens(pending)
    for index, (kind, token) in enumerate(tokens):
        if position == len(spoken):
            rest = "".join(text for _, text in tokens[index:])
            return Alignment(committed="".join(kept).strip(), pending=rest)
        if kind is _Kind.SPACE:
            kept.append(token)
        elif spoken.startswith(token, position):
            kept.append(token)
            position += len(token)
    return Alignment(committed="".join(kept).strip(), pending="")


def commit_spoken(events: Iterable[Event]) -> list[Event]:
    """The history with the agent's text replaced by what ``AgentSpeechSent`` says was heard.

    Each ``AgentSpeechSent`` becomes one ``AgentResponse`` holding the spoken part of the text
    generated before it (none when nothing of it was spoken); ``AgentResponse`` events themselves
    are consumed, so text never reported spoken is not in the result; every other event passes
    through unchanged and in place."""
    pending = ""
    out: list[Event] = []
    for event in events:
        if isinstance(event, AgentResponse):
            pending += event.content
        elif isinstance(event, AgentSpeechSent):
            alignment = align_spoken(pending, event.content)
            pending = alignment.pending
            if alignment.committed:
                out.append(AgentResponse(content=alignment.committed))
        else:
            out.append(event)
    return out
