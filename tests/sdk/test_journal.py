"""Checkpoints that cost what changed, not the length of the call (runtime/journal.py).

Measured before the journal: every checkpoint wrote every node's whole state, history included, so
a turn's checkpoint grew with every turn before it. Now a node's long lists go to a log beside the
record and each checkpoint writes the items that changed since the last one.
"""

from __future__ import annotations

import itertools
from typing import Any

from bargein import AgentResponse, UserStartedSpeaking
from bargein.runtime import journal, snapshot
from bargein.testing import LocalSession
from bargein.transport.abc import NO_LOG_CHANGE, LogChange, Renewal
from bargein.transport.memory import MemoryStateStore
from bargein.wire.names import TIER_REASONING

from ..agents import interruptible_agent
from .helpers import ask, history, take_chunks

ANSWER = " ".join(f"w{i}" for i in range(12))


class CountingStore(MemoryStateStore):
    """The in-memory store, counting the bytes each checkpoint writes (record and log)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[int] = []
        self.records: list[tuple[bytes, LogChange]] = []

    async def save_state(
        self, tier: Any, session: str, epoch: int, data: bytes, ttl_ms: int, log: LogChange = NO_LOG_CHANGE
    ) -> None:
        await super().save_state(tier, session, epoch, data, ttl_ms, log)
        self.writes.append(len(data) + log.size)
        self.records.append((data, log))


def test_a_growing_list_is_written_by_its_new_items_and_a_cut_from_where_it_changed() -> None:
    events: list[Any] = [AgentResponse(content=f"c{i}") for i in range(10)]
    book = journal.Journal()
    nodes = {"n": {"history": events, "none_yet": []}}
    lengths, change, lists = book.take(nodes, snapshot.pack_item)
    assert nodes == {"n": {"none_yet": []}}  # the list left the record; the empty one stays
    assert lengths == {"n.history": 10} and [len(c.items) for c in change.lists] == [10]
    book.written(lists)
    events.append(AgentResponse(content="c10"))
    _, change, lists = book.take({"n": {"history": events}}, snapshot.pack_item)
    assert [(c.keep, c.was, len(c.items)) for c in change.lists] == [(10, 10, 1)]  # only the new one
    book.written(lists)
    events[8:] = [AgentResponse(content="cut")]  # an interrupted answer cut short
    _, change, lists = book.take({"n": {"history": events}}, snapshot.pack_item)
    assert [(c.keep, c.was, len(c.items)) for c in change.lists] == [(8, 11, 1)]
    book.written(lists)
    _, change, _ = book.take({"n": {"history": events}}, snapshot.pack_item)
    assert change.lists == ()  # nothing changed, nothing written


def test_what_the_node_adds_while_the_store_writes_goes_in_the_next_checkpoint() -> None:
    events: list[Any] = [AgentResponse(content=f"c{i}") for i in range(10)]
    book = journal.Journal()
    _, _, lists = book.take({"n": {"history": events}}, snapshot.pack_item)
    events.append(AgentResponse(content="added meanwhile"))  # the write is still under way
    book.written(lists)
    _, change, _ = book.take({"n": {"history": events}}, snapshot.pack_item)
    assert [(c.keep, c.was, len(c.items)) for c in change.lists] == [(10, 10, 1)]


async def test_a_checkpoint_at_turn_sixty_writes_what_one_at_turn_five_does_and_restores_whole() -> None:
    store = CountingStore()
    async with LocalSession(interruptible_agent(replies=(ANSWER,) * 80, tokens_per_second=2000)) as s:
        s.store = store
        await s.restart()  # an owner on the counting store
        sizes: dict[int, int] = {}
        for turn in range(1, 61):
            before = len(store.writes)
            await ask(s, f"question {turn}")
            await s.collect_turn()
            sizes[turn] = max(store.writes[before:])
        assert sizes[60] < 1.3 * sizes[5], sizes  # not 12 times the history
        await ask(s, "one more")
        await take_chunks(s, 3)
        await s.emit(UserStartedSpeaking())  # a barge-in cuts the answer: rewritten from the cut
        await s.quiet(0.3)
        whole = history(s)
        assert len(whole) == 2 * 61 and 0 < len(whole[-1][1]) < len(ANSWER), whole[-1]
        await s.crash()  # the next owner reads the record and the log
        assert history(s) == whole
        checkpoint = await journal.read(store, TIER_REASONING, s.session_id)
        assert checkpoint is not None
        assert len(checkpoint[0]["nodes"][s.nodes[0].id]["conversation_events"]) == 2 * 61
        before = len(store.writes)
        await ask(s, "after the crash")
        await s.collect_turn()
        assert max(store.writes[before:]) < 1.3 * sizes[5]  # the adopter appends as well


async def test_an_interrupted_turn_writes_no_checkpoint_twice() -> None:
    """The interrupt's checkpoint, taken once the turn has unwound, already holds the cut history
    and that only the handler is left: the one before the handler is not written again (it was,
    the same bytes, for every barge-in)."""
    store = CountingStore()
    async with LocalSession(interruptible_agent(replies=(ANSWER,) * 5, tokens_per_second=200)) as s:
        s.store = store
        await s.restart()
        for turn in range(3):
            await ask(s, f"question {turn}")
            await take_chunks(s, 2)
            before = len(store.records)
            await s.emit(UserStartedSpeaking())
            await s.quiet(0.2)
            written = store.records[before:]
            assert written, "the cut is written"
            records = [data for data, _ in store.records[before - 1 :]]
            assert all(a != b for a, b in itertools.pairwise(records)), turn
        await s.crash()  # and what was written is all an adopter needs
        assert len(history(s)) == 6


async def test_records_written_back_after_the_store_lost_everything_restore_the_whole_history() -> None:
    """Found by the Redis-restart fault test once every list with items went to the log: after
    Redis came back empty, the owner wrote its record back but only the items that changed since
    its last checkpoint, so the next owner could not read the history (the log lacked item 0)."""
    store = MemoryStateStore()
    async with LocalSession(interruptible_agent(replies=(ANSWER,) * 5, tokens_per_second=2000)) as s:
        s.store = store
        await s.restart()
        for turn in range(3):
            await ask(s, f"question {turn}")
            await s.collect_turn()
        whole = history(s)
        runtime = s.runtime
        store.lose_everything()
        # what the owner's next lease renewal does (hosting/host.py): the lease again, the records back
        renewal = await store.renew_lease(TIER_REASONING, s.session_id, runtime.owner, runtime.epoch, 60_000)
        assert renewal is Renewal.RESTORED
        await runtime.write_back()
        await s.crash()
        assert history(s) == whole
        await ask(s, "after the crash")
        await s.collect_turn()
        assert len(history(s)) == len(whole) + 2


async def test_a_checkpoint_written_before_the_log_existed_still_restores() -> None:
    store = MemoryStateStore()
    epoch = await store.acquire_lease(TIER_REASONING, "old", "w", 60_000)
    assert epoch is not None
    events = [AgentResponse(content=f"c{i}") for i in range(20)]
    state = {"v": 1, "nodes": {"n": {"conversation_events": events}}}
    await store.save_state(TIER_REASONING, "old", epoch, snapshot._pack(state), 60_000)
    checkpoint = await journal.read(store, TIER_REASONING, "old")
    assert checkpoint is not None and checkpoint[0]["nodes"]["n"]["conversation_events"] == events
