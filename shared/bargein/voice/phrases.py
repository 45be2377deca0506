"""A turn's text as it streams in, cut into phrases to speak, and mapped back to its chunks.

The agent's answer arrives as chunks (an LLM's tokens, a scripted reply's words). An engine
speaks whole phrases better than single tokens (its intonation spans the phrase), but a caller
waiting for a full stop that never comes hears dead air. So :class:`TurnText` gathers the chunks and
hands out a phrase at the first of (:class:`PhraseRules`, ``BARGEIN_PHRASE_*``):

* the end of a sentence;
* a clause boundary (a comma, a dash) once the phrase has ``min_words`` words;
* ``max_words`` words, whatever the punctuation;
* ``max_wait_ms`` since the phrase's first text arrived, while nothing of the turn is left to play
  (the caller would hear silence): whatever whole words it has. Asked only then, so the phrases
  that follow the first, which have the time the one before takes to play, still wait for their
  punctuation;
* the end of the turn.

Every character of the turn keeps its place, so a position in the spoken text (the end of the last
word the caller heard) maps back to the chunk it came from and how much of that chunk: what
``SpeechDelivered`` reports.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from bargein.settings import VoiceSettings

SENTENCE_END = re.compile(r"[.!?;:…]+[\"')\]]*\s+|\n+")
CLAUSE_END = re.compile(r"[,\u2013\u2014]\s+")  # a comma, an en or an em dash
WORD_END = re.compile(r"\S\s+")  # where a whole word (and the space after it) ends
MAX_CHARS = 240  # past this, a phrase is cut at its last space whatever its punctuation (a run
# of text without spaces: a URL, say, read out)


@dataclass(frozen=True)
class PhraseRules:
    """When a phrase is spoken without waiting for its sentence to end (``VoiceSettings``'
    ``phrase_*``): shorter phrases reach the caller sooner and sound choppier."""

    min_words: int = 4  # a clause boundary ends a phrase of at least this many words
    max_words: int = 12  # a phrase is spoken once it has this many words, punctuated or not
    max_wait_ms: float = 200.0  # ... or once its text has waited this long with nothing left to play

    @classmethod
    def from_settings(cls, settings: VoiceSettings) -> PhraseRules:
        return cls(settings.phrase_min_words, settings.phrase_max_words, settings.phrase_max_wait_ms)


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

    def __init__(self, turn: int, rules: PhraseRules | None = None) -> None:
        self.turn = turn
        self.rules = rules or PhraseRules()
        self.text = ""
        self._starts: list[int] = []  # where each chunk begins in ``text``
        self._seqs: list[int] = []
        self._cursor = 0  # the text before this has been handed out
        self._waiting_since: float | None = None  # when the text after the cursor began to arrive
        self.complete = False

    def add(self, seq: int, text: str, now: float = 0.0) -> None:
        """Chunk ``seq`` arrived at ``now`` (monotonic seconds; chunks come in seq order: the edge's
        fence sees to it)."""
        if self._waiting_since is None and text.strip():
            self._waiting_since = now
        self._starts.append(len(self.text))
        self._seqs.append(seq)
        self.text += text

    def phrases(self, now: float | None = None) -> list[Phrase]:
        """The phrases ready to speak now (all that is left, once the turn is complete). ``now`` is
        given when nothing of the turn is left to play: then text that has waited ``max_wait_ms``
        is spoken as far as its last whole word."""
        out: list[Phrase] = []
        while True:
            cut = self._cut(self.text[self._cursor :])
            if cut is None:
                break
            out.append(self._take(cut))
        if self.complete and self._cursor < len(self.text):
            out.append(self._take(len(self.text) - self._cursor))
        elif now is not None and self._overdue(now):
            words = list(WORD_END.finditer(self.text, self._cursor))
            if words:
                out.append(self._take(words[-1].end() - self._cursor))
        return [p for p in out if p.text.strip()]

    def _overdue(self, now: float) -> bool:
        since = self._waiting_since
        return since is not None and (now - since) * 1000 >= self.rules.max_wait_ms

    def _cut(self, rest: str) -> int | None:
        """Where the next phrase of ``rest`` ends, if it is ready by its text alone."""
        sentence = SENTENCE_END.search(rest)
        limit = sentence.end() if sentence is not None else len(rest)
        words = [m.end() for m in WORD_END.finditer(rest, 0, limit)]  # ends of whole words
        for clause in CLAUSE_END.finditer(rest, 0, limit):
            if sum(end <= clause.end() for end in words) >= self.rules.min_words:
                return clause.end()
        if len(words) >= self.rules.max_words:
            return words[self.rules.max_words - 1]
        if sentence is not None:
            return sentence.end()
        if len(rest) > MAX_CHARS:
            space = rest.rfind(" ", 0, MAX_CHARS)
            return space + 1 if space > 0 else MAX_CHARS
        return None

    def _take(self, length: int) -> Phrase:
        phrase = Phrase(self._cursor, self.text[self._cursor : self._cursor + length])
        self._cursor += length
        rest = self.text[self._cursor :]
        self._waiting_since = self._waiting_since if rest.strip() else None
        return phrase

    def position(self, offset: int) -> tuple[int, int]:
        """The turn's first ``offset`` characters as (seq, chars): every chunk before ``seq``, and
        the first ``chars`` characters of chunk ``seq``."""
        if not self._seqs:
            return -1, 0
        offset = max(0, min(offset, len(self.text)))
        i = max(0, bisect.bisect_left(self._starts, offset) - 1)  # the chunk holding char offset-1
        return self._seqs[i], offset - self._starts[i]
