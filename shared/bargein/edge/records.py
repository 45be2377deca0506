"""The directory entries an edge gives back when Redis lost them together with a session's owner.

A session is found by the workers through its directory entry (``bargein:sessions:<tier>``): when
its owner dies, another worker takes it from there. Each owner writes its own sessions' records
back when it finds Redis emptied (a restart without persistence). Two faults at once leave a gap:
Redis loses its data *and* the owner dies, so nobody is left to write the entry back, and the
session is silent for ever although its caller is still connected and its mailbox still fills.

The edge is the one process that still knows such a session: its caller is connected here. So the
edge remembers each session's record (at creation, or on its first look), asks the directory now
and then which of its live sessions it lacks, and writes back an entry that was missing twice in a
row and whose tier's mailbox is still there. A side that ended on purpose deleted its mailbox with
its entry (its owner found it idle, say); one that Redis lost kept it. And two looks a few seconds
apart never mistake a session that has just ended (its entry goes a moment before its ``EndCall``
reaches the edge) for a loss. A worker then adopts the session as an orphan: the call goes on, but
without the conversation that the lost owner and the lost Redis held between them. (A partitioned
tier has no mailbox per session to tell the two apart: there the two looks alone decide, and a side
that ended on purpose has told the edge so with its ``EndCall`` long before the second.)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

from bargein.hosting.sessions import TIERS
from bargein.transport.abc import StateStore, Transport
from bargein.wire.names import TIER_REASONING, Tier
from bargein.wire.session_info import SessionInfo

log = logging.getLogger("bargein.edge")


class DirectoryKeeper:
    """One edge's copy of its live sessions' directory records, and the looks that use it."""

    def __init__(self, store: StateStore, transport: Transport, count: Callable[[str, int], None]) -> None:
        self.store = store
        self.transport = transport
        self.count = count
        self.records: dict[str, bytes] = {}
        self._missing: set[tuple[Tier, str]] = set()  # found absent at the last look
        self._ended: set[tuple[Tier, str]] = set()  # absent with their mailbox: ended on purpose

    def remember(self, session_id: str, record: bytes) -> None:
        self.records[session_id] = record

    def forget(self, session_id: str) -> None:
        self.records.pop(session_id, None)
        self._missing = {(tier, s) for tier, s in self._missing if s != session_id}
        self._ended = {(tier, s) for tier, s in self._ended if s != session_id}

    async def look(
        self, live: Mapping[str, int], epochs: Mapping[str, int] | None = None
    ) -> list[tuple[Tier, str]]:
        """Check the directory for the ``live`` sessions (a caller connected here, not ended: each
        with the highest turn this edge has seen of it) and write back what it lost, numbering its
        turns on after that one, and its agent's owners' epochs on after ``epochs`` (the highest
        this edge's fence has seen of each: Redis lost the counter, and a next owner at epoch 1
        would be dropped as stale; measured with partitions, where sessions change owners more
        often, in the fault suite's Redis loss while an owner dies); the (tier, session) entries
        written. Raises what the store raises (Redis away: the next look tries again)."""
        for session_id in live:
            if session_id not in self.records:  # joined here, created elsewhere: learn its record
                record = await self.store.session_info(TIER_REASONING, session_id)
                if record is not None:
                    self.records[session_id] = record
        known = [s for s in live if s in self.records]
        missing: set[tuple[Tier, str]] = set()
        written: list[tuple[Tier, str]] = []
        for tier in TIERS:
            absent = [
                s for s in await self.store.absent_sessions(tier, known) if (tier, s) not in self._ended
            ]
            confirmed: dict[str, bytes] = {}
            for session_id in (s for s in absent if (tier, s) in self._missing):
                if await self.transport.mailbox_exists(session_id, tier):
                    confirmed[session_id] = self._given_back(session_id, live[session_id])
                else:
                    self._ended.add((tier, session_id))
                    log.debug("session %s: its %s side ended (no entry, no mailbox)", session_id, tier)
            floors = epochs if tier == TIER_REASONING else None  # (the fence is the agent's tier's)
            restored = await self.store.restore_sessions(tier, confirmed, floors) if confirmed else []
            for session_id in restored:
                written.append((tier, session_id))
                self.count("directory_restored", 1)
                log.warning(
                    "session %s: Redis no longer knew its %s side while its caller is here (Redis "
                    "lost its data and its owner with it); written back, so a worker takes it up "
                    "again without the conversation before",
                    session_id,
                    tier,
                )
            missing.update((tier, s) for s in absent if s not in confirmed and (tier, s) not in self._ended)
        self._missing = missing
        return written

    def _given_back(self, session_id: str, turns: int) -> bytes:
        info = SessionInfo.decode(self.records[session_id])
        return dataclasses.replace(info, turns_before=max(info.turns_before, turns)).encode()
