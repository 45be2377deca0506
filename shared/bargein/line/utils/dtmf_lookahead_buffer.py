"""``line.utils.dtmf_lookahead_buffer``: turning ``dtmf=<digits>`` in a model's text into key presses.

An agent that navigates a phone menu can let its model write ``dtmf=12`` inline instead of making a
tool call. The model's text arrives in arbitrary pieces ("press dtm", "f=1 then"), so the marker
cannot be found chunk by chunk: these buffers hold back just the word that might be a marker until
the word ends, then release it either as :class:`DTMFOutputEvent` (the marker) or as text
(:class:`AgentResponse`). Everything else passes through as text.

The rules are Line 0.1's, so a migrated agent's output does not change:

* a candidate starts at a ``d`` and runs over word characters (letters, digits, ``_``, ``=``);
  it ends at the first other character, and is a marker if it starts with ``dtmf=``, in which case
  its rest is the button string;
* text is released only when a candidate ends (text before it, then the candidate) or on
  :meth:`flush`, which a node calls when the model's stream ends;
* :class:`DTMFLookAheadStringBuffer` yields one ``DTMFOutputEvent`` per button, as telephony sends
  one tone per event.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TypeAlias

from bargein.agent.events import AgentResponse, DTMFOutputEvent

__all__ = [
    "DTMF_EXPRESSION",
    "BufferOutput",
    "DTMFLookAheadCharacterBuffer",
    "DTMFLookAheadStringBuffer",
    "split_dtmf_output",
]

DTMF_EXPRESSION = "dtmf="
"""What a marker starts with; the rest of the word is the buttons."""

BufferOutput: TypeAlias = AgentResponse | DTMFOutputEvent
"""What the buffers yield: text to say, or buttons to press."""

_CANDIDATE_START = DTMF_EXPRESSION[0]
_WORD_CHARACTER = re.compile(r"[\w=]")


def split_dtmf_output(item: DTMFOutputEvent) -> Iterator[DTMFOutputEvent]:
    """One event per button: ``DTMFOutputEvent(button="12")`` gives ``"1"`` then ``"2"``."""
    for button in item.button:
        yield DTMFOutputEvent(button=button)


class DTMFLookAheadCharacterBuffer:
    """The look-ahead over single characters; a marker's buttons come out as one event.

    ``non_dtmf_buffer`` holds text not yet released; ``dtmf_buffer`` the candidate word, if any.
    ``feed`` takes a character (a longer string is taken a character at a time).
    """

    def __init__(self) -> None:
        self.non_dtmf_buffer = ""
        self.dtmf_buffer = ""

    def feed(self, char: str) -> Iterator[BufferOutput]:
        """Take ``char``; yield whatever it lets the buffer decide."""
        for c in char:
            if not self.dtmf_buffer:
                if c == _CANDIDATE_START:
                    self.dtmf_buffer = c
                else:
                    self.non_dtmf_buffer += c
            elif _WORD_CHARACTER.match(c):
                self.dtmf_buffer += c
            else:
                # The candidate word ended: decide it, then c (not a word character) is plain text.
                yield from self._release()
                self.non_dtmf_buffer = c

    def flush(self) -> Iterator[BufferOutput]:
        """Release everything held: the text, then the candidate as a marker or as text."""
        yield from self._release()

    def _release(self) -> Iterator[BufferOutput]:
        text, candidate = self.non_dtmf_buffer, self.dtmf_buffer
        self.non_dtmf_buffer = self.dtmf_buffer = ""
        if candidate.startswith(DTMF_EXPRESSION):
            if text:
                yield AgentResponse(content=text)
            yield DTMFOutputEvent(button=candidate[len(DTMF_EXPRESSION) :])
        elif text or candidate:
            yield AgentResponse(content=text + candidate)


class DTMFLookAheadStringBuffer:
    """The look-ahead over chunks of any length, yielding one ``DTMFOutputEvent`` per button: what
    a node feeds the model's stream through."""

    def __init__(self) -> None:
        self.buffer = DTMFLookAheadCharacterBuffer()

    def feed(self, string: str) -> Iterator[BufferOutput]:
        """Take a chunk of the model's text; yield what it settles."""
        yield from _per_button(self.buffer.feed(string))

    def flush(self) -> Iterator[BufferOutput]:
        """The model's text has ended: release what is held."""
        yield from _per_button(self.buffer.flush())


def _per_button(items: Iterator[BufferOutput]) -> Iterator[BufferOutput]:
    for item in items:
        if isinstance(item, DTMFOutputEvent):
            yield from split_dtmf_output(item)
        else:
            yield item
