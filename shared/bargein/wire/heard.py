"""What the caller heard, as the client edge knows it: the record every new owner is handed.

The owner of a session learns what the caller received from the edge's ``SpeechDelivered`` reports
and keeps it in memory (:class:`~bargein.runtime.ledger.DeliveryLedger`). When the session changes
owner (a crash, a drain, an adoption), the new owner has neither those reports nor the chunks its
predecessor produced, so the edge, which sent the chunks, answers every owner's start
(``InterruptPolicy``) with a :class:`~bargein.agent.events.HeardRecord`: per recent turn, the highest
chunk the caller got and their text. The broadcast service and the in-process ``Caller`` both
keep a :class:`HeardLog`.

Both also report to the owner from it, coalesced (:meth:`HeardLog.take_reports`): one report per
turn that advanced since the last one, not one per chunk. A report a chunk cost as much as the
chunk itself (a message each way); the owner needs only the latest position, and a cut-off turn's
final one.
"""

from __future__ import annotations

from bargein.agent.events import HeardRecord, HeardTurn, SpeechDelivered

RECENT_TURNS = 8  # turns whose delivered text is kept: a hand-over only ever concerns the last few

Position = tuple[int, int | None]
"""How far the caller got in a turn: every chunk before ``seq``, and of chunk ``seq`` its first
``chars`` characters (None: all of it; a spoken answer is heard to the word, not to the chunk)."""


def later(position: Position, than: Position | None) -> bool:
    """Whether ``position`` is further into the turn than ``than`` (reports only ever advance)."""
    if than is None:
        return True
    seq, chars = position
    seq_then, chars_then = than
    if seq != seq_then:
        return seq > seq_then
    return chars_then is not None and (chars is None or chars > chars_then)


def cut_text(chunks: dict[int, str], upto: Position) -> str:
    """The text of ``chunks`` (seq → text) up to ``upto``."""
    seq, chars = upto
    text = "".join(text for s, text in sorted(chunks.items()) if s < seq)
    last = chunks.get(seq, "")
    return text + (last if chars is None else last[:chars])


class HeardLog:
    """Per session: the chunks sent out and how far the caller got, for the last few turns."""

    def __init__(self) -> None:
        self._sent: dict[int, dict[int, str]] = {}  # turn -> seq -> text of each chunk sent out
        self._heard: dict[int, Position] = {}  # turn -> how far the caller was sent or played
        self._news: set[int] = set()  # turns that advanced since the last report
        self._cut: set[int] = set()  # turns cut off since the last report: the caller hears no more

    def sent(self, turn: int, seq: int, text: str) -> None:
        """A chunk went out to the session's clients."""
        if turn not in self._sent:
            for old in [t for t in self._sent if t <= turn - RECENT_TURNS]:
                self._sent.pop(old, None)
                self._heard.pop(old, None)
        self._sent.setdefault(turn, {})[seq] = text

    def heard(self, turn: int, seq: int, chars: int | None = None) -> bool:
        """The caller got chunk ``seq`` of ``turn`` (and those before it; of it only ``chars``
        characters, if given); True if that is news."""
        position = (seq, chars)
        if not later(position, self._heard.get(turn)):
            return False
        self._heard[turn] = position
        self._news.add(turn)
        return True

    def cut(self, turn: int) -> None:
        """The caller hears no more of ``turn``: the next report of it says so (``final``)."""
        self._cut.add(turn)

    @property
    def unreported(self) -> bool:
        return bool(self._news or self._cut)

    def take_reports(self) -> list[SpeechDelivered]:
        """What the caller got of each turn since the last time, one report a turn: the owner is told."""
        turns = sorted(self._news | self._cut)
        final, self._news, self._cut = self._cut, set(), set()
        reports = []
        for turn in turns:
            seq, chars = self._heard.get(turn) or (-1, None)
            reports.append(SpeechDelivered(turn=turn, seq=seq, chars=chars, final=turn in final))
        return reports

    def position(self, turn: int) -> Position | None:
        """How far the caller got in ``turn``, if anywhere."""
        return self._heard.get(turn)

    def record(self) -> HeardRecord:
        """What the caller heard of each recent turn, text included: the answer to an owner's start."""
        return HeardRecord(
            turns=[
                HeardTurn(turn=turn, seq=upto[0], chars=upto[1], text=cut_text(self._sent[turn], upto))
                for turn, upto in sorted(self._heard.items())
                if turn in self._sent
            ]
        )
