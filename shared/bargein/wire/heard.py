"""What the caller heard, as the client edge knows it: the record every new owner is handed.

The owner of a session learns what the caller received from the edge's ``SpeechDelivered`` reports
and keeps it in memory (:class:`~bargein.runtime.ledger.DeliveryLedger`). When the session changes
owner (a crash, a drain, an adoption), the new owner has neither those reports nor the chunks its
predecessor produced, so the edge, which sent the chunks, answers every owner's start
(``InterruptPolicy``) with a :class:`~bargein.agent.events.HeardRecord`: per recent turn, the highest
chunk the caller got and their text. The broadcast service and the in-process ``Caller`` both
keep a :class:`HeardLog`.
"""

from __future__ import annotations

from bargein.agent.events import HeardRecord, HeardTurn

RECENT_TURNS = 8  # turns whose delivered text is kept: a hand-over only ever concerns the last few


class HeardLog:
    """Per session: the chunks sent out and how far the caller got, for the last few turns."""

    def __init__(self) -> None:
        self._sent: dict[int, dict[int, str]] = {}  # turn -> seq -> text of each chunk sent out
        self._heard: dict[int, int] = {}  # turn -> the highest seq the caller was sent or played

    def sent(self, turn: int, seq: int, text: str) -> None:
        """A chunk went out to the session's clients."""
        if turn not in self._sent:
            for old in [t for t in self._sent if t <= turn - RECENT_TURNS]:
                self._sent.pop(old, None)
                self._heard.pop(old, None)
        self._sent.setdefault(turn, {})[seq] = text

    def heard(self, turn: int, seq: int) -> bool:
        """The caller got chunk ``seq`` of ``turn`` (and those before it); True if that is news."""
        if seq <= self._heard.get(turn, -1):
            return False
        self._heard[turn] = seq
        return True

    def record(self) -> HeardRecord:
        """What the caller heard of each recent turn, text included: the answer to an owner's start."""
        return HeardRecord(
            turns=[
                HeardTurn(turn=turn, seq=upto, text=self._text(turn, upto))
                for turn, upto in sorted(self._heard.items())
                if turn in self._sent
            ]
        )

    def _text(self, turn: int, upto: int) -> str:
        return "".join(text for seq, text in sorted(self._sent[turn].items()) if seq <= upto)
