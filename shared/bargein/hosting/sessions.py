"""Creating and ending sessions: what the client edge does when a caller arrives or hangs up."""

from __future__ import annotations

import contextlib
import logging

from bargein.agent.events import EndCall
from bargein.errors import UnroutableError
from bargein.transport.abc import StateStore, Transport
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN, TIER_REASONING, TIER_SPEECH, Tier
from bargein.wire.session_info import SessionInfo

log = logging.getLogger("bargein.hosting.sessions")

TIERS: tuple[Tier, ...] = (TIER_SPEECH, TIER_REASONING)
ENDING_LEASE_MS = 30_000  # held while a session nobody owns is forgotten


async def create_session(
    transport: Transport, store: StateStore, info: SessionInfo, *, tier: Tier = TIER_REASONING
) -> None:
    """Declare the tier's mailbox first (so nothing published from now on is lost), record the
    session in the directory (so it is adopted if its owner dies), then offer it to the tier's
    workers. The client edge listens before calling this (its own queue, or a Caller's mailbox)."""
    await transport.declare_mailbox(info.session_id, tier, IN)
    raw = info.encode()
    await store.register_session(tier, info.session_id, raw)
    await transport.publish_session_start(tier, raw)


async def forget_session(transport: Transport, store: StateStore, session_id: str, *, tier: Tier) -> None:
    """Remove every trace of a finished session in ``tier``: directory entry, state, mailbox."""
    await store.unregister_session(tier, session_id)
    await store.delete_state(tier, session_id)
    await transport.delete_mailbox(session_id, tier)


async def end_session(
    transport: Transport,
    store: StateStore,
    session_id: str,
    *,
    by: str,
    reason: str,
    source: str,
    replacing: str | None = None,
) -> None:
    """End a session from outside its owners (the caller left for good, the carrier says the call
    is over). Every tier's owner hears :class:`EndCall` and ends its side; a tier nobody owns (its
    worker died, or drained) is forgotten here, so that no worker adopts a call that is over
    (``replacing``: a dead worker whose leases may not have run out yet)."""
    hangup = Envelope.wrap(session_id, EndCall(reason=reason), source=source)
    with contextlib.suppress(UnroutableError):  # no mailbox hears it: every tier has ended already
        await transport.publish(hangup, IN)
    await forget_unowned_sides(transport, store, session_id, by=by, reason=reason, replacing=replacing)
    await store.forget_callers(session_id)


async def forget_unowned_sides(
    transport: Transport,
    store: StateStore,
    session_id: str,
    *,
    by: str,
    reason: str,
    replacing: str | None = None,
) -> None:
    """After the owners were told :class:`EndCall`: forget each tier's side that nobody owns, and
    leave every owned side to its owner, who forgets it once it has heard the hang-up. Forgetting
    an owned side from here deletes its mailbox with the hang-up still in it when the owner is
    slow (frozen, or busy with a thousand others): the owner never hears it, consumes its mailbox
    again and keeps the call alive until it is idle for ``BARGEIN_SESSION_IDLE_S``. The ending
    lease (``ENDING_LEASE_MS``) keeps a worker from adopting the side while it is forgotten."""
    for tier in TIERS:
        epoch = await store.acquire_lease(tier, session_id, by, ENDING_LEASE_MS, replacing=replacing)
        if epoch is None:  # owned: its owner ends it on the EndCall
            continue
        await forget_session(transport, store, session_id, tier=tier)
        await store.release_lease(tier, session_id, by, epoch)
        log.info("session %s: nobody owned its %s side; forgotten (%s)", session_id, tier, reason)
