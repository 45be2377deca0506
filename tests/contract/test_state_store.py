"""The StateStore contract, held by MemoryStateStore and RedisStateStore alike.

What the session host builds on: a lease is held by one owner at a time and hands out a strictly
increasing epoch; only the current epoch may write the checkpoint; a lapsed lease makes its session
an orphan any worker may adopt; deleting a finished session's state starts its epochs over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from bargein.errors import StaleEpochError
from bargein.transport.abc import ListChange, LogChange, Renewal, StateStore, log_field
from bargein.wire.names import TIER_EDGE, TIER_REASONING, TIER_SPEECH

TIER = TIER_REASONING
DIRECTORY_TIER = TIER_EDGE
SHORT_MS = 200
LAPSE_S = 0.45  # comfortably past SHORT_MS
LONG_MS = 60_000
BINARY = bytes(range(256)) + b"\xff\xfe not utf-8 \x00"

Session = Callable[[str], str]


async def test_one_owner_at_a_time_and_each_acquisition_gets_the_next_epoch(
    store: StateStore, session: Session
) -> None:
    s = session("lease")
    assert await store.current_epoch(TIER, s) == 0
    assert await store.acquire_lease(TIER, s, "a", SHORT_MS) == 1
    assert await store.current_epoch(TIER, s) == 1
    assert await store.acquire_lease(TIER, s, "b", SHORT_MS) is None
    assert await store.acquire_lease(TIER_SPEECH, s, "b", LONG_MS) == 1  # tiers are independent
    await asyncio.sleep(LAPSE_S)
    assert await store.acquire_lease(TIER, s, "b", LONG_MS) == 2  # lapsed: taken, fenced forward
    assert await store.current_epoch(TIER, s) == 2


async def test_of_many_acquiring_at_once_exactly_one_gets_the_lease(
    store: StateStore, session: Session
) -> None:
    s = session("race")
    epochs = await asyncio.gather(*(store.acquire_lease(TIER, s, f"w{i}", LONG_MS) for i in range(20)))
    assert sorted(e for e in epochs if e is not None) == [1]


async def test_renewing_keeps_the_lease_and_only_its_holder_may(store: StateStore, session: Session) -> None:
    s = session("renew")
    epoch = await store.acquire_lease(TIER, s, "a", SHORT_MS)
    assert epoch == 1
    for _ in range(4):
        await asyncio.sleep(SHORT_MS / 2000)
        assert await store.renew_lease(TIER, s, "a", epoch, SHORT_MS)
    assert not await store.renew_lease(TIER, s, "b", epoch, SHORT_MS)  # not the owner
    assert not await store.renew_lease(TIER, s, "a", epoch + 1, SHORT_MS)  # not its epoch
    await store.release_lease(TIER, s, "b", epoch)  # a stranger's release does nothing
    assert await store.acquire_lease(TIER, s, "b", SHORT_MS) is None
    await store.release_lease(TIER, s, "a", epoch)
    assert await store.acquire_lease(TIER, s, "b", SHORT_MS) == 2


async def test_a_lease_gone_with_no_later_epoch_is_taken_again_by_its_holder(
    store: StateStore, session: Session
) -> None:
    s = session("forgotten")
    assert await store.acquire_lease(TIER, s, "a", SHORT_MS) == 1
    await asyncio.sleep(LAPSE_S)  # gone (as after a Redis restart without persistence), nobody took it
    assert await store.renew_lease(TIER, s, "a", 1, LONG_MS) is Renewal.RESTORED
    assert await store.acquire_lease(TIER, s, "b", LONG_MS) is None  # it is held again
    assert await store.renew_lease(TIER, s, "a", 1, LONG_MS) is Renewal.RENEWED
    assert await store.current_epoch(TIER, s) == 1
    many = {session(f"m{i}"): 1 for i in range(5)}
    for name in many:
        assert await store.acquire_lease(TIER, name, "a", LONG_MS) == 1
    renewed = await store.renew_leases(TIER, "a", {**many, s: 1}, LONG_MS)
    assert set(renewed.values()) == {Renewal.RENEWED} and set(renewed) == {*many, s}


async def test_a_former_owner_can_neither_renew_release_nor_write(
    store: StateStore, session: Session
) -> None:
    s = session("fenced")
    old = await store.acquire_lease(TIER, s, "a", SHORT_MS)
    assert old == 1
    await store.save_state(TIER, s, old, b"from a", LONG_MS)
    await asyncio.sleep(LAPSE_S)  # a was paused past its lease
    new = await store.acquire_lease(TIER, s, "b", LONG_MS)
    assert new == 2
    await store.save_state(TIER, s, new, b"from b", LONG_MS)
    assert not await store.renew_lease(TIER, s, "a", old, LONG_MS)
    await store.release_lease(TIER, s, "a", old)
    with pytest.raises(StaleEpochError):
        await store.save_state(TIER, s, old, b"late write from a", LONG_MS)
    assert await store.load_state(TIER, s) == b"from b"
    assert await store.acquire_lease(TIER, s, "c", LONG_MS) is None  # b still holds it


async def test_the_checkpoint_round_trips_exact_bytes_and_expires(
    store: StateStore, session: Session
) -> None:
    s = session("state")
    assert await store.load_state(TIER, s) is None
    epoch = await store.acquire_lease(TIER, s, "a", LONG_MS)
    assert epoch is not None
    await store.save_state(TIER, s, epoch, BINARY, LONG_MS)
    assert await store.load_state(TIER, s) == BINARY
    assert await store.load_state(TIER_SPEECH, s) is None
    await store.save_state(TIER, s, epoch, b"short-lived", SHORT_MS)
    await asyncio.sleep(LAPSE_S)
    assert await store.load_state(TIER, s) is None


def _log(*changes: tuple[int, int, int, tuple[bytes, ...]]) -> LogChange:
    return LogChange(tuple(ListChange(*change) for change in changes))


def _items(path: int, *values: bytes) -> dict[bytes, bytes]:
    return {log_field(path, n): value for n, value in enumerate(values)}


async def test_the_log_changes_with_its_record_by_what_changed_and_is_fenced_with_it(
    store: StateStore, session: Session
) -> None:
    s = session("log")
    epoch = await store.acquire_lease(TIER, s, "a", SHORT_MS)
    assert epoch == 1 and await store.load_log(TIER, s) == {}
    await store.save_state(
        TIER, s, epoch, b"r1", LONG_MS, log=_log((0, 0, 0, (b"a", b"b", b"c")), (1, 0, 0, (b"x",)))
    )
    assert await store.load_log(TIER, s) == {**_items(0, b"a", b"b", b"c"), **_items(1, b"x")}
    await store.save_state(TIER, s, epoch, b"r2", LONG_MS, log=_log((0, 2, 3, (b"C", b"d"))))  # cut and grown
    assert await store.load_log(TIER, s) == {**_items(0, b"a", b"b", b"C", b"d"), **_items(1, b"x")}
    await store.save_state(TIER, s, epoch, b"r3", LONG_MS, log=_log((0, 1, 4, ())))  # shortened
    assert await store.load_log(TIER, s) == {**_items(0, b"a"), **_items(1, b"x")}
    await asyncio.sleep(LAPSE_S)
    assert await store.acquire_lease(TIER, s, "b", LONG_MS) == 2
    with pytest.raises(StaleEpochError):  # the former owner writes neither the record nor the log
        await store.save_state(TIER, s, epoch, b"stale", LONG_MS, log=_log((0, 0, 1, (b"stale",))))
    assert await store.load_state(TIER, s) == b"r3"
    assert await store.load_log(TIER, s) == {**_items(0, b"a"), **_items(1, b"x")}
    many = tuple(BINARY + str(n).encode() for n in range(5_000))  # more than one script call's stack
    await store.save_state(TIER, s, 2, b"r4", SHORT_MS, log=_log((0, 1, 1, many)))
    assert (
        len(await store.load_log(TIER, s)) == 5_002
        and (await store.load_log(TIER, s))[log_field(0, 5_000)] == many[-1]
    )
    await asyncio.sleep(LAPSE_S)
    assert await store.load_log(TIER, s) == {}  # it expires with its record
    await store.save_state(TIER, s, 2, b"r5", LONG_MS, log=_log((0, 0, 0, (b"new",))))
    await store.delete_state(TIER, s)
    assert await store.load_log(TIER, s) == {}


async def test_a_write_without_ever_holding_the_lease_is_fenced(store: StateStore, session: Session) -> None:
    s = session("never")
    with pytest.raises(StaleEpochError):
        await store.save_state(TIER, s, 5, b"x", LONG_MS)
    await store.save_state(TIER, s, 0, b"epoch zero", LONG_MS)  # no counter yet reads as epoch 0
    assert await store.load_state(TIER, s) == b"epoch zero"


async def test_deleting_a_finished_sessions_state_starts_its_epochs_over(
    store: StateStore, session: Session
) -> None:
    s = session("delete")
    epoch = await store.acquire_lease(TIER, s, "a", LONG_MS)
    assert epoch == 1
    await store.save_state(TIER, s, epoch, b"x", LONG_MS)
    await store.release_lease(TIER, s, "a", epoch)
    assert await store.acquire_lease(TIER, s, "b", LONG_MS) == 2
    await store.release_lease(TIER, s, "b", 2)
    await store.delete_state(TIER, s)
    assert await store.load_state(TIER, s) is None
    assert await store.acquire_lease(TIER, s, "c", LONG_MS) == 1


async def test_the_directory_names_live_sessions_and_orphans_are_those_nobody_holds(
    store: StateStore, session: Session
) -> None:
    # the edge tier: no worker of a stack running beside the suite adopts its orphans
    held, lapsing, free = session("held"), session("lapsing"), session("free")
    for s in (free, held, lapsing):
        await store.register_session(DIRECTORY_TIER, s, f"info of {s}".encode())
    assert await store.session_info(DIRECTORY_TIER, held) == f"info of {held}".encode()
    assert await store.session_info(TIER_SPEECH, held) is None
    assert await store.acquire_lease(DIRECTORY_TIER, held, "a", LONG_MS) == 1
    assert await store.acquire_lease(DIRECTORY_TIER, lapsing, "a", SHORT_MS) == 1

    def mine(orphans: list[tuple[str, bytes]]) -> dict[str, bytes]:  # the directory may be shared
        return {s: info for s, info in orphans if s in (held, lapsing, free)}

    orphans = mine(await store.orphaned_sessions(DIRECTORY_TIER, limit=10_000))
    assert orphans == {free: f"info of {free}".encode()}
    await asyncio.sleep(LAPSE_S)
    assert set(mine(await store.orphaned_sessions(DIRECTORY_TIER, limit=10_000))) == {lapsing, free}
    assert len(await store.orphaned_sessions(DIRECTORY_TIER, limit=1)) == 1
    assert await store.orphaned_sessions(DIRECTORY_TIER, limit=0) == []
    await store.unregister_session(DIRECTORY_TIER, free)
    assert await store.session_info(DIRECTORY_TIER, free) is None
    assert set(mine(await store.orphaned_sessions(DIRECTORY_TIER, limit=10_000))) == {lapsing}


async def test_only_wanted_orphans_count_toward_the_limit(store: StateStore, session: Session) -> None:
    """A worker with partitions wants only its own partitions' orphans: with many of others'
    ahead of them in the directory, a limit counted before the filter handed it none of its own."""
    others = [session(f"other{i}") for i in range(30)]
    own = [session(f"own{i}") for i in range(3)]
    for s in [*others, *own]:  # its own come last
        await store.register_session(DIRECTORY_TIER, s, b"info")
    orphans = await store.orphaned_sessions(DIRECTORY_TIER, limit=2, wanted=own.__contains__)
    assert len(orphans) == 2 and {s for s, _ in orphans} <= set(own)
    everything = await store.orphaned_sessions(DIRECTORY_TIER, limit=10_000, wanted=own.__contains__)
    assert sorted(s for s, _ in everything) == sorted(own)
    for s in [*others, *own]:
        await store.unregister_session(DIRECTORY_TIER, s)


async def test_sessions_the_directory_lost_are_found_and_written_back_never_over_a_record(
    store: StateStore, session: Session
) -> None:
    """What an edge does after Redis lost its data together with a session's owner: it asks which
    of its sessions the directory lacks and writes those back; a record that is there stays."""
    kept, lost = session("kept"), session("lost")
    await store.register_session(DIRECTORY_TIER, kept, b"the record")
    assert await store.absent_sessions(DIRECTORY_TIER, [kept, lost]) == [lost]
    assert await store.absent_sessions(DIRECTORY_TIER, []) == []
    restored = await store.restore_sessions(DIRECTORY_TIER, {kept: b"an old copy", lost: b"its copy"})
    assert restored == [lost]
    assert await store.session_info(DIRECTORY_TIER, kept) == b"the record"
    assert await store.session_info(DIRECTORY_TIER, lost) == b"its copy"
    assert await store.absent_sessions(DIRECTORY_TIER, [kept, lost]) == []
    assert await store.restore_sessions(DIRECTORY_TIER, {}) == []
    for s in (kept, lost):
        await store.unregister_session(DIRECTORY_TIER, s)


async def test_a_session_written_back_is_owned_next_under_a_later_epoch_than_the_edge_saw(
    store: StateStore, session: Session
) -> None:
    """Redis lost the epoch counter with the record: a next owner at epoch 1 would be dropped by the
    edge's fence, which had seen epoch 3. Written back with that epoch, the next owner gets 4; a
    counter already past it is left as it is."""
    lost, ahead = session("lost-epoch"), session("ahead-epoch")
    for _ in range(5):
        epoch = await store.acquire_lease(DIRECTORY_TIER, ahead, "o", 1000)
        assert epoch is not None
        await store.release_lease(DIRECTORY_TIER, ahead, "o", epoch)
    restored = await store.restore_sessions(
        DIRECTORY_TIER, {lost: b"its copy", ahead: b"its copy"}, {lost: 3, ahead: 2}
    )
    assert sorted(restored) == sorted([lost, ahead])
    assert await store.acquire_lease(DIRECTORY_TIER, lost, "o", 1000) == 4
    assert await store.acquire_lease(DIRECTORY_TIER, ahead, "o", 1000) == 6
    for s in (lost, ahead):
        await store.unregister_session(DIRECTORY_TIER, s)
        await store.delete_state(DIRECTORY_TIER, s)


async def test_a_worker_whose_heartbeat_stops_is_dead_and_its_sessions_can_be_taken_over(
    store: StateStore, session: Session
) -> None:
    a, b = session("worker-a"), session("worker-b")  # unique names, like sessions'
    heartbeat = store.keep_alive(DIRECTORY_TIER, a, SHORT_MS)
    s = session("theirs")
    assert await store.acquire_lease(DIRECTORY_TIER, s, a, LONG_MS) == 1
    await store.note_owned(DIRECTORY_TIER, a, s, True)
    await asyncio.sleep(LAPSE_S)
    assert a not in await store.dead_workers(DIRECTORY_TIER)  # the heartbeat kept it alive
    heartbeat.stop()
    await asyncio.sleep(LAPSE_S)
    assert a in await store.dead_workers(DIRECTORY_TIER)
    assert await store.owned_sessions(DIRECTORY_TIER, a) == [s]
    assert await store.acquire_lease(DIRECTORY_TIER, s, b, LONG_MS) is None  # its lease still runs
    assert await store.acquire_lease(DIRECTORY_TIER, s, b, LONG_MS, replacing=session("other")) is None
    assert await store.acquire_lease(DIRECTORY_TIER, s, b, LONG_MS, replacing=a) == 2  # taken over
    await store.note_owned(DIRECTORY_TIER, a, s, False)
    assert await store.owned_sessions(DIRECTORY_TIER, a) == []
    await store.forget_worker(DIRECTORY_TIER, a)
    assert a not in await store.dead_workers(DIRECTORY_TIER)


async def test_a_callers_deadline_only_moves_later_and_each_session_due_goes_to_one_asker(
    store: StateStore, session: Session
) -> None:
    # the deadlines are wall-clock times; another process sweeping the same Redis takes only what
    # is due by its own clock, so the ones here are kept clear of it until the test asks
    left, stays = session("left"), session("stays")
    now = time.time()
    await store.expect_callers({left: now + 0.3, stays: now + 0.3})
    await store.expect_callers({left: now - 100})  # an earlier deadline never replaces a later one
    await store.expect_callers({stays: now + LONG_MS / 1000})  # a caller seen again: later
    assert await store.caller_deadline(left) == pytest.approx(now + 0.3, abs=1e-3)
    assert await store.caller_deadline(session("never")) is None
    assert left not in await store.callers_gone(now, limit=10_000)  # not due yet
    await asyncio.sleep(LAPSE_S)
    askers = await asyncio.gather(*(store.callers_gone(time.time(), limit=10_000) for _ in range(4)))
    assert sum(asked.count(left) for asked in askers) == 1  # exactly one of them ends it
    assert not any(stays in asked for asked in askers)
    assert await store.caller_deadline(left) is None
    assert await store.callers_gone(time.time(), limit=0) == []
    await store.forget_callers(stays)
    assert await store.caller_deadline(stays) is None


async def test_a_phone_call_names_its_session_until_its_record_expires(
    store: StateStore, session: Session
) -> None:
    call, s = session("CA-call"), session("answered")
    assert await store.session_of_call("twilio", call) is None
    await store.note_call("twilio", call, s, SHORT_MS)
    assert await store.session_of_call("twilio", call) == s
    assert await store.session_of_call("telnyx", call) is None  # each carrier's ids are its own
    await asyncio.sleep(LAPSE_S)
    assert await store.session_of_call("twilio", call) is None
