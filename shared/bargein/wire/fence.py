"""Turn fencing: the client edge's guarantee that nothing stale reaches a caller.

Per session the edge keeps the highest interrupted turn and the highest owner epoch it has seen.
A chunk of an interrupted turn, or one stamped by an owner that has since been replaced, is dropped
and counted; a chunk already sent (a resumed turn republishing after a failover) is sent once.
The broadcast service and the in-process ``LocalSession`` both use this one class.
"""

from __future__ import annotations

import collections

from bargein.wire.envelope import Envelope


class TurnFence:
    def __init__(self) -> None:
        self.interrupted_upto = 0
        self.epoch = 0
        self._last_seq: dict[int, int] = {}
        self.dropped: collections.Counter[str] = collections.Counter()

    def interrupt(self, turn: int) -> bool:
        """Fence ``turn`` and every earlier turn; True if this moved the fence."""
        if turn <= self.interrupted_upto:
            return False
        self.interrupted_upto = turn
        for old in [t for t in self._last_seq if t <= turn]:
            del self._last_seq[old]
        return True

    def is_fenced(self, turn: int) -> bool:
        return 0 < turn <= self.interrupted_upto

    def admit(self, envelope: Envelope) -> bool:
        """Whether ``envelope`` (agent output) may go to clients; records it if so.

        Only turn output (turn > 0, stamped by the reasoning owner) is fenced; session-level notices
        (a speech tier's ``SessionError``, turn 0) carry another tier's epoch and always pass."""
        if envelope.turn == 0:
            return True
        if envelope.epoch < self.epoch:
            self.dropped["stale_epoch"] += 1
            return False
        self.epoch = envelope.epoch
        if self.is_fenced(envelope.turn):
            self.dropped["interrupted_turn"] += 1
            return False
        if envelope.turn and envelope.seq <= self._last_seq.get(envelope.turn, -1):
            self.dropped["duplicate"] += 1
            return False
        if envelope.turn:
            self._last_seq[envelope.turn] = envelope.seq
        return True
