"""Whether the agent's voice reaches the caller now: what the client edge tells the speech tier.

A burst of caller speech while the agent talks may be a backchannel ("uh-huh") that must not cut it
off, so the speech tier needs to know when the agent is talking. Only the edge knows: it sees the
chunks go out and, with ``reports=played``, what was played. :class:`Playback` follows one
session: speaking from the first chunk of a turn; stopped once that turn is complete and its last
chunk has reached the caller, or at once when the turn is cut off. When the agent's voice is
played (:mod:`bargein.voice`), "a chunk went out" is its audio starting, and it stops when that
audio has played out. Each change is what the edge
publishes as :class:`~bargein.agent.events.AgentPlayback` (the broadcast service, and the
in-process caller of :mod:`bargein.testing`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class _Turn:
    turn: int
    last_sent: int  # seq of the last chunk sent
    heard: int = -1  # seq of the last chunk delivered (with reports=played: played)
    complete: bool = False


class Playback:
    """Feed it what happens to a session's output; each method returns the new state when it
    changed (True: the agent started reaching the caller; False: it stopped), else None."""

    def __init__(self) -> None:
        self._turn: _Turn | None = None

    @property
    def speaking(self) -> bool:
        return self._turn is not None

    def sent(self, turn: int, seq: int) -> bool | None:
        """A chunk of ``turn`` went out to the caller."""
        if self._turn is not None and self._turn.turn == turn:
            self._turn.last_sent = max(self._turn.last_sent, seq)
            return None
        was = self.speaking
        self._turn = _Turn(turn, seq)
        return None if was else True

    def heard(self, turn: int, seq: int) -> bool | None:
        """The caller has chunk ``seq`` of ``turn`` (delivered, or reported played)."""
        if self._turn is None or self._turn.turn != turn:
            return None
        self._turn.heard = max(self._turn.heard, seq)
        return self._maybe_stopped()

    def complete(self, turn: int) -> bool | None:
        """The agent finished ``turn``: once all of it is heard, it stops."""
        if self._turn is None or self._turn.turn != turn:
            return None
        self._turn.complete = True
        return self._maybe_stopped()

    def played_out(self, turn: int) -> bool | None:
        """All of ``turn``'s audio has been played (a session whose agent is heard, not read)."""
        if self._turn is None or self._turn.turn != turn:
            return None
        self._turn = None
        return False

    def cleared(self, turn: int) -> bool | None:
        """``turn`` and everything before it was cut off."""
        if self._turn is None or self._turn.turn > turn:
            return None
        self._turn = None
        return False

    def _maybe_stopped(self) -> bool | None:
        turn = self._turn
        if turn is not None and turn.complete and turn.heard >= turn.last_sent:
            self._turn = None
            return False
        return None
