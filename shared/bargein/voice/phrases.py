"""A turn's text as it streams in, cut into phrases to speak, and mapped back to its chunks.

The agent's answer arrives as chunks (an LLM's tokens, a scripted reply's words). An engine
speaks whole phrases better and sooner than single tokens, so :class:`TurnText` gathers the chunks
and hands out a phrase once it ends a sentence (or a clause, once it is long enough), or once the
turn is complete. Every character of the turn keeps its place, so a position in the spoken text
(the end of the last word the caller heard) maps back to the chunk it came from and how much of
that chunk: what ``SpeechDelivered`` reports.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

SENTENCE_END = re.compile(r"[.!?;:…]+[\"')\]]*\s+|\n+")
CLAUSE_END = re.compile(r"[,\u2013\u2014]\s+")  # a comma, an en or an em dash
CLAUSE_MIN_CHARS = 40  # a clause this long is spoken without waiting for its sentence to end
MAX_CHARS = 240  # past this, a phrase is cut at its last space whatever its punctuation


@dataclass(frozen=True)
class Phrase:
    """Characters ``start:end`` of the turn's text, to be spoken."""

    start: int
    text: str

    @property
    def end(self) -> int:
        return self.start + len(self.text)


class TurnText:
    """One turn's chunks, in seq order, and the phrases not yet handed out."""

    def __init__(self, turn: int) -> None:
        self.turn = turn
        self.text = ""
        self._starts: list[int] = []  # where each chunk begins in ``text``
        self._seqs: list[int] = []
        self._cursor = 0  # the text before this has been handed out
        self.complete = False

    def add(self, seq: int, text: str) -> None:
        """Chunk ``seq`` arrived (chunks come in seq order; the edge's fence sees to it)."""
        self._starts.append(len(self.text))
        self._seqs.append(seq)
        self.text += text

    def phrases(self) -> list[Phrase]:
        """The phrases ready to speak now (all that is left, once the turn is complete)."""
        out: list[Phrase] = []
        while True:
            rest = self.text[self._cursor :]
            cut = self._cut(rest)
            if cut is None:
                break
            out.append(self._take(cut))
        if self.complete and self._cursor < len(self.text):
            out.append(self._take(len(self.text) - self._cursor))
        return [p for p in out if p.text.strip()]

    def _cut(self, rest: str) -> int | None:
        sentence = SENTENCE_END.search(rest)
        if sentence is not None:
            return sentence.end()
        clause = None
        for clause in CLAUSE_END.finditer(rest):
            if clause.end() >= CLAUSE_MIN_CHARS:
                return clause.end()
        if len(rest) > MAX_CHARS:
            space = rest.rfind(" ", 0, MAX_CHARS)
            return space + 1 if space > 0 else MAX_CHARS
        return None

    def _take(self, length: int) -> Phrase:
        phrase = Phrase(self._cursor, self.text[self._cursor : self._cursor + length])
        self._cursor += length
        return phrase

    def position(self, offset: int) -> tuple[int, int]:
        """The turn's first ``offset`` characters as (seq, chars): every chunk before ``seq``, and
        the first ``chars`` characters of chunk ``seq``."""
        if not self._seqs:
            return -1, 0
        offset = max(0, min(offset, len(self.text)))
        i = max(0, bisect.bisect_left(self._starts, offset) - 1)  # the chunk holding char offset-1
        return self._seqs[i], offset - self._starts[i]
