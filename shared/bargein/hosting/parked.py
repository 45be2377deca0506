"""Messages from a partition whose session Redis does not know: kept aside a while, not dropped.

A session's directory entry is missing for one of two reasons. Either the session ended, and what
still comes for it (a late delivery report, the caller's last word) is worth nothing; or Redis lost
it together with the session's owner (a restart without persistence while a worker died), and the
caller's edge will write it back (``edge/records.py``: two looks up to 5 s apart) for a worker to
adopt. With a mailbox per session the message simply waited in that mailbox for the adopter. A
partition is shared: its consumer cannot leave one message at its head without holding up every
other session in it, and the two cases look the same when the message comes.

So a partitioned worker keeps such a message aside, acknowledged, in its session's order, for
:data:`UNKNOWN_SESSION_WAIT_S`; a session taken up meanwhile (adopted, or its next message finds its
entry back) is handed what was kept before anything newer. After the wait it is dropped as a
message of an ended session. Kept in memory only: this worker dying meanwhile, a third fault, loses
them.

The same keeps what comes for a session while this worker is taking it up (restoring its
checkpoint): the runtime has no routes yet to hand it to (``SessionHost.deliver``).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from bargein.agent.events import Event
from bargein.wire.envelope import Envelope

# the edge's two looks (up to 5 s apart), a worker's next look for orphans, and room to spare
UNKNOWN_SESSION_WAIT_S = 30.0
PARKED_PER_SESSION = 500  # the newest kept: a speech session's audio (worthless late anyway)

Parked = tuple[Envelope, Event]


class ParkedMessages:
    """What this worker keeps aside, session by session (:mod:`bargein.hosting.parked`)."""

    def __init__(
        self,
        on_dropped: Callable[[int], None],
        *,
        wait_s: float = UNKNOWN_SESSION_WAIT_S,
        per_session: int = PARKED_PER_SESSION,
    ) -> None:
        self.on_dropped = on_dropped  # told how many were given up (the wait passed, or too many)
        self.wait_s = wait_s
        self.per_session = per_session
        self._kept: dict[str, collections.deque[Parked]] = {}
        self._until: dict[str, float] = {}

    def holds(self, session: str) -> bool:
        return session in self._kept

    def park(self, envelope: Envelope, event: Event) -> None:
        session = envelope.session
        kept = self._kept.get(session)
        if kept is None:
            kept = self._kept[session] = collections.deque(maxlen=self.per_session)
            self._until[session] = time.monotonic() + self.wait_s
        if len(kept) == self.per_session:
            self.on_dropped(1)  # the oldest makes room
        kept.append((envelope, event))

    def take(self, session: str) -> list[Parked]:
        """What was kept for ``session``, oldest first; none kept any more."""
        self._until.pop(session, None)
        return list(self._kept.pop(session, ()))

    def expire(self) -> None:
        """Give up what waited past its time (its owner calls this for every message it takes)."""
        now = time.monotonic()
        for session in [s for s, until in self._until.items() if until <= now]:
            self.on_dropped(len(self.take(session)))
