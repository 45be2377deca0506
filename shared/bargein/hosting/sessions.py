"""Creating and ending sessions: what the client edge does when a caller arrives or hangs up."""

from __future__ import annotations

from bargein.transport.abc import StateStore, Transport
from bargein.wire.names import IN, TIER_REASONING, Tier
from bargein.wire.session_info import SessionInfo


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
