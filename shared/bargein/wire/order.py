"""Turn order: the client edge's guarantee that a caller hears an answer whole and in order.

A session's owner numbers what it sends the caller in a turn from 0 up, with no gaps (control
events aside: they overtake data by design, so they take no number). Messages can still be lost
between the two: a RabbitMQ node that froze and thaws deletes its queues whose connections died
meanwhile, and with the edge's queue it deletes whatever was routed there (``docs/operations.md``,
"A node that freezes"). A later message of the turn then shows the gap. Rather than let the caller
hear the answer with a word missing, the edge holds what came after the gap, asks the owner for the
missing numbers again (:class:`~bargein.agent.events.OutputMissed`), and lets the held messages go
once the gap is filled, or once it has waited long enough (an owner that cannot send them again: a
new owner after a failover resends by resuming the turn, and one that no longer has them says
nothing). A turn's last message lost shows no gap; a turn that has not ended and hears nothing for a
while (:meth:`TurnOrder.stalled`) is asked for whatever follows what came. An edge that created the
session has heard it from its start, so the loss of the first chunk it would hear (the first answer's
first words) is a gap like any other; an edge a caller joins mid-call may hear a turn from its
middle, and asks for nothing before the first message it hears.

:class:`TurnFence` decides what is stale; this decides what is early. The edge asks the fence
first: a fenced turn's message is dropped, not held.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Generic, TypeVar

from bargein.agent.events import MISSED_AT_MOST
from bargein.wire.envelope import Envelope

T = TypeVar("T")  # what travels with an envelope (the edge passes its decoded event)

TURNS_KEPT = 16  # per session, the turns whose next number is remembered; older ones pass unordered


@dataclasses.dataclass(frozen=True)
class Gap:
    """Turn ``turn``'s messages ``first`` to ``last`` (both included) have not arrived."""

    turn: int
    first: int
    last: int


@dataclasses.dataclass(slots=True)
class _Turn(Generic[T]):
    next: int = 0  # the number the caller is to get next
    held: dict[int, tuple[Envelope, T]] = dataclasses.field(default_factory=dict)
    asked_upto: int = -1  # the highest number already asked for again
    heard_at: float = 0.0  # time.monotonic() of its last message
    asked_rest: bool = False  # asked for whatever follows, since its last message


class TurnOrder(Generic[T]):
    """Per session: which number each recent turn expects next, and what waits for a gap."""

    def __init__(self, *, from_start: bool = False) -> None:
        """``from_start``: this edge heard the session before it could say anything (it created
        it), so every turn it hears begins at 0."""
        self._turns: dict[int, _Turn[T]] = {}
        self._open: set[int] = set()  # the turns whose last message has not come: watched for stalls
        self._oldest = 0  # turns below this are forgotten: their messages pass as they come
        self._listening = from_start  # every turn is heard from its first message

    def arrive(
        self, envelope: Envelope, item: T, now: float | None = None
    ) -> tuple[list[tuple[Envelope, T]], Gap | None]:
        """What may go on now, in order (``envelope`` itself, what it unblocks, or nothing: it is
        held), and the gap to ask for again, if this message showed one not yet asked for.

        A number lower than the turn expects passes (it is a repeat, or a resumed turn sending its
        start again: the fence tells which reaches the caller)."""
        turn = envelope.turn
        if turn < self._oldest:
            return [(envelope, item)], None
        state = self._turns.get(turn)
        if state is None:
            # A turn starts at 0, but the first this edge hears of a session may be the middle of
            # one (a caller who reconnected through this edge mid-answer): nothing to ask for then
            state = self._turns[turn] = _Turn(next=0 if self._listening else envelope.seq)
            self._open.add(turn)
            self._listening = True
            self._forget_old()
        state.heard_at = time.monotonic() if now is None else now
        state.asked_rest = False
        if envelope.seq < state.next:
            return [(envelope, item)], None
        if envelope.seq > state.next:
            seq = envelope.seq
            below = max((held for held in state.held if held < seq), default=state.next - 1)
            state.held.setdefault(seq, (envelope, item))
            last = seq - 1  # missing: from the last number known below this one up to it
            if last <= below or last <= state.asked_upto:
                return [], None
            first = max(below + 1, state.asked_upto + 1)
            state.asked_upto = last
            return [], Gap(turn, first, last)
        state.next += 1
        ready = [(envelope, item)]
        ready.extend(self._unblocked(state))
        return ready, None

    def give_up(self, turn: int) -> tuple[list[tuple[Envelope, T]], list[int]]:
        """Stop waiting for ``turn``'s gaps: what it held, in order, and the numbers never seen."""
        state = self._turns.get(turn)
        if state is None or not state.held:
            return [], []
        released: list[tuple[Envelope, T]] = []
        lost: list[int] = []
        while state.held:
            lowest = min(state.held)
            lost.extend(range(state.next, lowest))
            state.next = lowest
            released.extend(self._unblocked(state))
        return released, lost

    def ended(self, turn: int) -> None:
        """``turn``'s last message has come: nothing of it is missing once what it holds is in."""
        self._open.discard(turn)

    @property
    def open_turns(self) -> bool:
        """Whether a turn it heard has not ended (only those can stall): most sessions of a busy edge
        have none, and the edge's report loop passes them by."""
        return bool(self._open)

    def stalled(self, now: float, after_s: float) -> list[Gap]:
        """Turns that have not ended and have heard nothing for ``after_s``: their last message may
        be what the broker lost, which no later one shows. Each is asked for everything after
        what came (once until it hears more); an answer that is only slow costs one message."""
        gaps = []
        for turn in sorted(self._open):
            state = self._turns[turn]
            if state.held or state.asked_rest or now - state.heard_at < after_s:
                continue
            state.asked_rest = True
            gaps.append(Gap(turn, state.next, state.next + MISSED_AT_MOST - 1))
        return gaps

    def waiting(self, turn: int) -> bool:
        """Whether ``turn`` holds messages behind a gap."""
        state = self._turns.get(turn)
        return state is not None and bool(state.held)

    def forget(self, upto: int) -> None:
        """``upto`` and every earlier turn are over (interrupted): nothing of them waits any more."""
        for turn in [t for t in self._turns if t <= upto]:
            del self._turns[turn]
            self._open.discard(turn)
        self._oldest = max(self._oldest, upto + 1)

    @staticmethod
    def _unblocked(state: _Turn[T]) -> list[tuple[Envelope, T]]:
        ready = []
        while state.next in state.held:
            ready.append(state.held.pop(state.next))
            state.next += 1
        return ready

    def _forget_old(self) -> None:
        """Keep the newest turns only (what an older one held is long given up: a gap waits
        seconds, a turn lasts longer)."""
        if len(self._turns) > TURNS_KEPT:
            self.forget(max(self._turns) - TURNS_KEPT)
