"""The edge gives back the directory entries Redis lost together with a session's owner
(``edge/records.py``), on the in-memory store and bus: only entries found missing twice in a row
whose mailbox is still there, never over one that is there, numbered after the turns the caller
had."""

from __future__ import annotations

from collections import Counter

from bargein.edge.records import DirectoryKeeper
from bargein.transport.memory import MemoryBroker, MemoryStateStore, MemoryTransport
from bargein.wire.names import IN, TIER_REASONING, TIER_SPEECH
from bargein.wire.session_info import SessionInfo


def record(session_id: str) -> bytes:
    return SessionInfo(session_id, {"persona": "kind"}, edge_reports_delivery=True).encode()


async def created(store: MemoryStateStore, transport: MemoryTransport, session_id: str) -> None:
    """As the edge creates a session: a mailbox and a directory entry on each tier."""
    for tier in (TIER_SPEECH, TIER_REASONING):
        await transport.declare_mailbox(session_id, tier, IN)
        await store.register_session(tier, session_id, record(session_id))


async def test_an_entry_missing_at_two_looks_is_written_back_with_the_turns_the_caller_had() -> None:
    store, transport, counts = MemoryStateStore(), MemoryTransport(MemoryBroker()), Counter[str]()
    keeper = DirectoryKeeper(store, transport, lambda name, n: counts.update({name: n}))
    kept, lost = "a" * 32, "b" * 32
    for session_id in (kept, lost):
        keeper.remember(session_id, record(session_id))
        await created(store, transport, session_id)
    live, epochs = {kept: 3, lost: 5}, {kept: 1, lost: 2}
    assert await keeper.look(live, epochs) == []
    for tier in (TIER_SPEECH, TIER_REASONING):  # Redis lost the entries (and the owner died)
        await store.unregister_session(tier, lost)
    store.lose_everything()  # with the epoch counters: the next owner would be epoch 1
    for tier in (TIER_SPEECH, TIER_REASONING):
        await store.register_session(tier, kept, record(kept))  # (its live owner's doing)
    assert await keeper.look(live, epochs) == []  # once is not enough: it may have just ended
    assert await keeper.look(live, epochs) == [(TIER_SPEECH, lost), (TIER_REASONING, lost)]
    assert await store.acquire_lease(TIER_REASONING, lost, "next", 1000) == 3  # after the fence's 2
    given_back = await store.session_info(TIER_REASONING, lost)
    assert given_back is not None
    info = SessionInfo.decode(given_back)
    assert (info.options, info.edge_reports_delivery, info.turns_before) == ({"persona": "kind"}, True, 5)
    assert await store.session_info(TIER_REASONING, kept) == record(kept)  # untouched
    assert counts["directory_restored"] == 2
    assert await keeper.look(live) == []


async def test_a_side_that_ended_on_purpose_is_not_given_back() -> None:
    """A tier that ends its side (its owner found it idle) deletes the mailbox with the entry; the
    caller may still be connected, and that is no loss of Redis's to repair."""
    store, transport = MemoryStateStore(), MemoryTransport(MemoryBroker())
    keeper = DirectoryKeeper(store, transport, lambda name, n: None)
    idle = "c" * 32
    keeper.remember(idle, record(idle))
    await created(store, transport, idle)
    await store.unregister_session(TIER_SPEECH, idle)  # forget_session: entry, state, mailbox
    await transport.delete_mailbox(idle, TIER_SPEECH)
    for _ in range(3):
        assert await keeper.look({idle: 1}) == []
    assert await store.session_info(TIER_SPEECH, idle) is None


async def test_a_session_forgotten_between_two_looks_is_not_given_back() -> None:
    store, transport = MemoryStateStore(), MemoryTransport(MemoryBroker())
    keeper = DirectoryKeeper(store, transport, lambda name, n: None)
    ended = "e" * 32
    keeper.remember(ended, record(ended))
    await transport.declare_mailbox(ended, TIER_REASONING, IN)
    assert await keeper.look({ended: 1}) == []  # its entries are gone: it is ending
    keeper.forget(ended)  # the edge heard EndCall and forgot it
    assert await keeper.look({}) == []
    assert await store.session_info(TIER_REASONING, ended) is None


async def test_a_session_joined_here_but_created_elsewhere_is_learnt_from_the_directory() -> None:
    store = MemoryStateStore()
    keeper = DirectoryKeeper(store, MemoryTransport(MemoryBroker()), lambda name, n: None)
    elsewhere = "d" * 32
    for tier in (TIER_SPEECH, TIER_REASONING):
        await store.register_session(tier, elsewhere, record(elsewhere))
    await keeper.look({elsewhere: 1})
    assert keeper.records[elsewhere] == record(elsewhere)


def test_the_turns_before_travel_only_when_there_are_some() -> None:
    plain = SessionInfo("e" * 32, {"a": 1})
    assert b"turns_before" not in plain.encode()  # the record as every version wrote it
    assert SessionInfo.decode(plain.encode()).turns_before == 0
    assert SessionInfo.decode(SessionInfo("e" * 32, turns_before=7).encode()).turns_before == 7
