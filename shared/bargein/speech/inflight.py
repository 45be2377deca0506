"""The backlog rule every speech-to-text engine applies: how much it takes in hand.

An engine runs ``workers`` transcriptions at once and lets twice as many wait; asked for more, it
says at once that it is behind (:class:`~bargein.errors.TranscriberBehind`) rather than queue work
whose answer would come too late to matter. The speech session then goes on by timing alone.
"""

from __future__ import annotations

from bargein.errors import TranscriberBehind

BACKLOG_PER_WORKER = 2  # transcriptions waiting per worker beyond which the engine says it is behind


class InFlight:
    """Transcriptions an engine has in hand: running, or waiting for a worker."""

    def __init__(self, workers: int) -> None:
        self.limit = workers * (1 + BACKLOG_PER_WORKER)
        self.count = 0

    def admit(self, what: str) -> None:
        """Take one more, or raise :class:`TranscriberBehind` (``what`` names them in the message)."""
        if self.count >= self.limit:
            raise TranscriberBehind(f"{self.count} {what} already in flight")
        self.count += 1

    def done(self, *_: object) -> None:
        """One is finished (usable as a future's done-callback)."""
        self.count -= 1
