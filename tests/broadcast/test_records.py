"""The edge gives back the directory entries Redis lost together with a session's owner
(``edge/records.py``), on the in-memory store: only entries found missing twice in a row, never
over one that is there, numbered after the turns the caller had."""

from __future__ import annotations

from collections import Counter

from bargein.edge.records import DirectoryKeeper
from bargein.transport.memory import MemoryStateStore
from bargein.wire.names import TIER_REASONING, TIER_SPEECH
from bargein.wire.session_info import SessionInfo


def record(session_id: str) -> bytes:
    return SessionInfo(session_id, {"persona": "kind"}, edge_reports_delivery=True).encode()


async def test_an_entry_missing_at_two_looks_is_written_back_with_the_turns_the_caller_had() -> None:
    store, counts = MemoryStateStore(), Counter[str]()
    keeper = DirectoryKeeper(store, lambda name, n: counts.update({name: n}))
    kept, lost = "a" * 32, "b" * 32
    for session_id in (kept, lost):
        keeper.remember(session_id, record(session_id))
        for tier in (TIER_SPEECH, TIER_REASONING):
            await store.register_session(tier, session_id, record(session_id))
    live = {kept: 3, lost: 5}
    assert await keeper.look(live) == []
    for tier in (TIER_SPEECH, TIER_REASONING):  # Redis lost the entries (and the owner died)
        await store.unregister_session(tier, lost)
    assert await keeper.look(live) == []  # once is not enough: it may have just ended
    assert await keeper.look(live) == [(TIER_SPEECH, lost), (TIER_REASONING, lost)]
    given_back = await store.session_info(TIER_REASONING, lost)
    assert given_back is not None
    info = SessionInfo.decode(given_back)
    assert (info.options, info.edge_reports_delivery, info.turns_before) == ({"persona": "kind"}, True, 5)
    assert await store.session_info(TIER_REASONING, kept) == record(kept)  # untouched
    assert counts["directory_restored"] == 2
    assert await keeper.look(live) == []


async def test_a_session_that_ends_between_two_looks_is_not_given_back() -> None:
    store = MemoryStateStore()
    keeper = DirectoryKeeper(store, lambda name, n: None)
    ended = "c" * 32
    keeper.remember(ended, record(ended))
    assert await keeper.look({ended: 1}) == []  # its entries are gone: it ended
    keeper.forget(ended)  # the edge heard EndCall and forgot it
    assert await keeper.look({}) == []
    assert await store.session_info(TIER_REASONING, ended) is None


async def test_a_session_joined_here_but_created_elsewhere_is_learnt_from_the_directory() -> None:
    store = MemoryStateStore()
    keeper = DirectoryKeeper(store, lambda name, n: None)
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
