"""What each turn published and how far the caller got: the source of "what the caller heard".

The owner records the text of every chunk it publishes by (turn, seq); the edge reports how far each
turn reached (or was played to) the caller: a seq, and, when the agent's voice is played, how many
characters of that chunk were spoken (to the end of the last word heard). An interrupted answer is
cut to exactly that, and corrected again when a report arrives after the cancel. When a session
changes owner, the edge hands the new one its record, text included, because the new owner has not
produced the chunks its predecessor did (``heard``).

It also keeps what each recent turn sent the caller, as sent: an edge that finds a number missing
(the broker lost that message) asks for it again (``OutputMissed``), and gets it as it was.
"""

from __future__ import annotations

import collections

from bargein.wire.envelope import Envelope
from bargein.wire.heard import Position, cut_text, later

RECENT_TURNS = 16  # late delivery reports only ever concern the last few turns


class DeliveryLedger:
    """Per turn: the text of each published chunk, and how far the edge says the caller got."""

    def __init__(self, edge_reports: bool) -> None:
        # without an edge reporting delivery (a unit test driving the runtime), what was published
        # stands in for what was heard
        self.edge_reports = edge_reports
        self._chunks: dict[int, dict[int, str]] = collections.defaultdict(dict)
        self._delivered_upto: dict[int, Position] = {}
        self._heard: dict[int, str] = {}  # the edge's own text of what it delivered, when it sent it
        self._sent: dict[int, dict[int, Envelope]] = collections.defaultdict(dict)  # for OutputMissed
        # how many characters of each turn's heard text the session's bridges were told
        # (AgentSpeechSent): the session checkpoints it, so a new owner tells them the rest, once
        self.told: dict[int, int] = {}

    def published(self, turn: int, seq: int, text: str) -> None:
        self._chunks[turn][seq] = text

    def sent(self, envelope: Envelope) -> None:
        """``envelope`` went to the caller (numbered: control takes no number of its own)."""
        self._sent[envelope.turn][envelope.seq] = envelope

    def last_sent(self, turn: int) -> int:
        """The highest number sent of ``turn`` that this process has (-1: none)."""
        return max(self._sent.get(turn, ()), default=-1)

    def again(self, turn: int, first: int, last: int) -> list[Envelope]:
        """What was sent of ``turn`` from ``first`` to ``last``, in order: what this process still
        has of it (nothing of a turn too old, or one its predecessor sent)."""
        sent = self._sent.get(turn, {})
        return [sent[seq] for seq in sorted(sent) if first <= seq <= last]

    def delivered(self, turn: int, seq: int, text: str | None = None, chars: int | None = None) -> None:
        """The caller got ``turn`` up to chunk ``seq`` (only its first ``chars`` characters, if
        given); ``text``: what that is, as the edge knows it (a new owner's record)."""
        position = (seq, chars)
        if later(position, self._delivered_upto.get(turn)):
            self._delivered_upto[turn] = position
        if text is not None and len(text) > len(self._heard.get(turn, "")):
            self._heard[turn] = text

    def knows(self, turn: int) -> bool:
        """Whether this process has any text of ``turn``: its own chunks, or the edge's record of
        it (a predecessor's turn has neither until the record comes)."""
        return bool(self._chunks.get(turn)) or turn in self._heard

    def delivered_text(self, turn: int) -> str:
        chunks = self._chunks.get(turn, {})
        upto = (
            self._delivered_upto.get(turn, (-1, None))
            if self.edge_reports
            else (max(chunks, default=-1), None)
        )
        ours = cut_text(chunks, upto)
        heard = self._heard.get(turn, "")
        return heard if len(heard) > len(ours) else ours

    def untold(self, turn: int) -> str:
        """What of ``turn``'s heard text the bridges have not been told yet, counted as told now."""
        heard = self.delivered_text(turn)
        told = self.told.get(turn, 0)
        if len(heard) <= told:
            return ""
        self.told[turn] = len(heard)
        return heard[told:]

    def finished(self, turn: int) -> None:
        """``turn`` is over: forget turns too old for a report to still matter."""
        for old in [t for t in {*self._chunks, *self._sent, *self.told} if t < turn - RECENT_TURNS]:
            self._chunks.pop(old, None)
            self._sent.pop(old, None)
            self._delivered_upto.pop(old, None)
            self._heard.pop(old, None)
            self.told.pop(old, None)
