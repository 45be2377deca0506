"""RedisStateStore against a real Redis: what it keeps where (keys, TTLs, hash tags), what its scripts
do to them, and its client requirements. The behaviour every StateStore shares is tests/contract's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import get_args

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError

from bargein.errors import StaleEpochError
from bargein.transport.abc import Renewal
from bargein.transport.redis_store import RENEW_BATCH, RedisStateStore, _ThreadHeartbeat
from bargein.wire.names import Tier, epoch_key, lease_key, session_directory_key, state_key

TIER: Tier = "reasoning"
TIERS: tuple[Tier, ...] = get_args(Tier)
SHORT_TTL_MS = 200
LAPSE_S = 0.45  # comfortably past SHORT_TTL_MS
LONG_TTL_MS = 60_000
BINARY = bytes(range(256)) + b"\xff\xfe\xc3\x28\x00\x80 not utf-8 \xa0\xa1"

SessionFactory = Callable[[str], str]


@pytest.fixture
async def raw(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    """A plain client for looking at keys behind the store's back."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def new_session(unique_id: str, raw: aioredis.Redis) -> AsyncIterator[SessionFactory]:
    """Makes session ids unique to this test; afterwards deletes every key and directory entry of them."""
    made: list[str] = []

    def make(name: str = "s") -> str:
        session = f"it-{unique_id}-{name}"
        made.append(session)
        return session

    yield make
    for session in made:
        keys = [key async for key in raw.scan_iter(match=f"*{session}*", count=1000)]
        if keys:
            await raw.delete(*keys)
        for tier in TIERS:
            await raw.hdel(session_directory_key(tier), session)


async def _keys_mentioning(raw: aioredis.Redis, session: str) -> set[bytes]:
    return {key async for key in raw.scan_iter(match=f"*{session}*", count=1000)}


def _mine(orphans: list[tuple[str, bytes]], *sessions: str) -> dict[str, bytes]:
    """The part of a (shared, global) directory listing that belongs to this test."""
    return {session: info for session, info in orphans if session in sessions}


# --- leases ---------------------------------------------------------------------------------------


async def test_first_acquire_gets_epoch_1_and_others_get_none_while_held(
    redis_store: RedisStateStore, raw: aioredis.Redis, new_session: SessionFactory
) -> None:
    session = new_session("s")
    assert await redis_store.acquire_lease(TIER, session, "worker-a", LONG_TTL_MS) == 1
    assert await redis_store.acquire_lease(TIER, session, "worker-b", LONG_TTL_MS) is None
    assert await redis_store.acquire_lease(TIER, session, "worker-a", LONG_TTL_MS) is None
    assert await raw.get(lease_key(TIER, session)) == b"worker-a:1"
    # leases of other tiers are independent
    assert await redis_store.acquire_lease("speech", session, "worker-b", LONG_TTL_MS) == 1


async def test_lease_lapses_after_its_ttl_and_the_next_acquire_gets_the_next_epoch(
    redis_store: RedisStateStore, raw: aioredis.Redis, new_session: SessionFactory
) -> None:
    session = new_session("s")
    assert await redis_store.acquire_lease(TIER, session, "worker-a", SHORT_TTL_MS) == 1
    await asyncio.sleep(LAPSE_S)
    assert not await raw.exists(lease_key(TIER, session))
    assert await redis_store.acquire_lease(TIER, session, "worker-b", LONG_TTL_MS) == 2
    assert await raw.get(lease_key(TIER, session)) == b"worker-b:2"


async def test_renewing_keeps_the_lease_past_its_ttl(
    redis_store: RedisStateStore, raw: aioredis.Redis, new_session: SessionFactory
) -> None:
    session = new_session("s")
    ttl_ms = 500
    epoch = await redis_store.acquire_lease(TIER, session, "worker-a", ttl_ms)
    assert epoch == 1
    for _ in range(4):  # 4 x 60% of the ttl = 2.4 ttls in all
        await asyncio.sleep(0.6 * ttl_ms / 1000)
        assert await redis_store.renew_lease(TIER, session, "worker-a", epoch, ttl_ms)
    assert await redis_store.acquire_lease(TIER, session, "worker-b", ttl_ms) is None
    assert 0 < await raw.pttl(lease_key(TIER, session)) <= ttl_ms
    assert await raw.get(lease_key(TIER, session)) == b"worker-a:1"


async def test_renew_and_release_by_a_wrong_owner_or_epoch_do_nothing(
    redis_store: RedisStateStore, raw: aioredis.Redis, new_session: SessionFactory
) -> None:
    session = new_session("s")
    key = lease_key(TIER, session)
    epoch = await redis_store.acquire_lease(TIER, session, "worker-a", 5_000)
    assert epoch == 1
    for owner, wrong_epoch in [("worker-b", epoch), ("worker-a", epoch + 1), ("worker-a", epoch - 1)]:
        assert not await redis_store.renew_lease(TIER, session, owner, wrong_epoch, LONG_TTL_MS)
        await redis_store.release_lease(TIER, session, owner, wrong_epoch)
    assert await raw.get(key) == b"worker-a:1"
    assert 0 < await raw.pttl(key) <= 5_000  # not extended to LONG_TTL_MS

    await redis_store.release_lease(TIER, session, "worker-a", epoch)
    assert not await raw.exists(key)
    assert await redis_store.acquire_lease(TIER, session, "worker-b", LONG_TTL_MS) == 2
    assert not await redis_store.renew_lease(TIER, session, "worker-a", epoch, LONG_TTL_MS)  # a later epoch


async def test_a_former_holder_cannot_renew_release_or_write_after_takeover(
    redis_store: RedisStateStore, raw: aioredis.Redis, new_session: SessionFactory
) -> None:
    session = new_session("s")
    old = await redis_store.acquire_lease(TIER, session, "worker-a", SHORT_TTL_MS)
    assert old == 1
    await asyncio.sleep(LAPSE_S)
    new = await redis_store.acquire_lease(TIER, session, "worker-b", LONG_TTL_MS)
    assert new == 2
    # the same owner name coming back (a restarted process) is still fenced by the epoch
    assert not await redis_store.renew_lease(TIER, session, "worker-a", old, LONG_TTL_MS)
    await redis_store.release_lease(TIER, session, "worker-a", old)
    with pytest.raises(StaleEpochError):
        await redis_store.save_state(TIER, session, old, b"stale", LONG_TTL_MS)
    assert await raw.get(lease_key(TIER, session)) == b"worker-b:2"
    assert await redis_store.renew_lease(TIER, session, "worker-b", new, LONG_TTL_MS)


async def test_concurrent_acquires_elect_exactly_one_owner(
    redis_store: RedisStateStore, redis_url: str, raw: aioredis.Redis, new_session: SessionFactory
) -> None:
    session = new_session("s")
    stores = [redis_store] + [RedisStateStore.from_url(redis_url) for _ in range(3)]
    try:
        owners = [f"worker-{i}" for i in range(20)]
        results = await asyncio.gather(
            *(
                stores[i % len(stores)].acquire_lease(TIER, session, owner, LONG_TTL_MS)
                for i, owner in enumerate(owners)
            )
        )
    finally:
        for store in stores[1:]:
            await store.close()
    winners = [(owner, epoch) for owner, epoch in zip(owners, results, strict=True) if epoch is not None]
    assert len(winners) == 1, results
    owner, epoch = winners[0]
    assert epoch == 1
    assert await raw.get(lease_key(TIER, session)) == f"{owner}:1".encode()
    assert await raw.get(epoch_key(TIER, session)) == b"1"


# --- the checkpoint -------------------------------------------------------------------------------


async def test_delete_state_removes_the_state_and_the_epoch_counter(
    redis_store: RedisStateStore, raw: aioredis.Redis, new_session: SessionFactory
) -> None:
    session = new_session("s")
    epoch = await redis_store.acquire_lease(TIER, session, "worker-a", LONG_TTL_MS)
    assert epoch == 1
    await redis_store.save_state(TIER, session, epoch, b"done", LONG_TTL_MS)
    await redis_store.delete_state(TIER, session)
    assert await redis_store.load_state(TIER, session) is None
    assert not await raw.exists(state_key(TIER, session), epoch_key(TIER, session))
    with pytest.raises(StaleEpochError):  # the old holder is fenced: its epoch is gone
        await redis_store.save_state(TIER, session, epoch, b"late", LONG_TTL_MS)
    # the lease itself is untouched (as in MemoryStateStore); once released, epochs restart at 1,
    # which is harmless because the state they protected is gone
    assert await raw.exists(lease_key(TIER, session))
    await redis_store.release_lease(TIER, session, "worker-a", epoch)
    assert await redis_store.acquire_lease(TIER, session, "worker-b", LONG_TTL_MS) == 1
    await redis_store.delete_state(TIER, new_session("never-used"))  # no error for unknown sessions


# --- key layout and lifetimes ---------------------------------------------------------------------


async def test_lease_and_state_keys_carry_ttls_and_the_epoch_outlives_them(
    redis_store: RedisStateStore, raw: aioredis.Redis, new_session: SessionFactory
) -> None:
    session = new_session("s")
    epoch = await redis_store.acquire_lease(TIER, session, "worker-a", 5_000)
    assert epoch is not None
    await redis_store.save_state(TIER, session, epoch, b"x", LONG_TTL_MS)
    lease_ttl = await raw.pttl(lease_key(TIER, session))
    state_ttl = await raw.pttl(state_key(TIER, session))
    epoch_ttl = await raw.pttl(epoch_key(TIER, session))
    assert 0 < lease_ttl <= 5_000
    assert 0 < state_ttl <= LONG_TTL_MS
    assert epoch_ttl >= max(lease_ttl, state_ttl)  # at least a week by default
    assert epoch_ttl > 6 * 24 * 3600 * 1000


async def test_epoch_ttl_is_only_ever_extended_to_cover_lease_and_state(
    redis_url: str, raw: aioredis.Redis, new_session: SessionFactory
) -> None:
    session = new_session("s")
    store = RedisStateStore.from_url(redis_url, epoch_min_ttl_ms=1_000)
    try:
        epoch = await store.acquire_lease(TIER, session, "worker-a", 500)
        assert epoch == 1
        assert 500 < await raw.pttl(epoch_key(TIER, session)) <= 1_000  # the floor
        assert await store.renew_lease(TIER, session, "worker-a", epoch, 30_000)
        assert 1_000 < await raw.pttl(epoch_key(TIER, session)) <= 30_000  # covers the lease
        await store.save_state(TIER, session, epoch, b"x", LONG_TTL_MS)
        assert 30_000 < await raw.pttl(epoch_key(TIER, session)) <= LONG_TTL_MS  # covers the state
        await store.save_state(TIER, session, epoch, b"y", 2_000)  # shorter: never shortens it
        assert await raw.pttl(epoch_key(TIER, session)) > 30_000
    finally:
        await store.close()


async def test_epoch_counters_can_be_kept_forever(
    redis_url: str, raw: aioredis.Redis, new_session: SessionFactory
) -> None:
    session = new_session("s")
    store = RedisStateStore.from_url(redis_url, epoch_min_ttl_ms=None)
    try:
        epoch = await store.acquire_lease(TIER, session, "worker-a", 5_000)
        assert epoch == 1
        assert await store.renew_lease(TIER, session, "worker-a", epoch, 5_000)
        await store.save_state(TIER, session, epoch, b"x", LONG_TTL_MS)
        assert await raw.pttl(epoch_key(TIER, session)) == -1  # exists, no TTL
    finally:
        await store.close()


async def test_every_key_of_a_session_carries_its_hash_tag(
    redis_store: RedisStateStore, raw: aioredis.Redis, new_session: SessionFactory
) -> None:
    session = new_session("s")
    for tier in TIERS:
        epoch = await redis_store.acquire_lease(tier, session, "worker-a", LONG_TTL_MS)
        assert epoch is not None
        await redis_store.save_state(tier, session, epoch, b"x", LONG_TTL_MS)
        await redis_store.register_session(tier, session, b"info")

    tag = f"{{{session}}}"
    tagged = {key async for key in raw.scan_iter(match=f"bargein:{tag}*", count=1000)}
    expected = {name(tier, session).encode() for tier in TIERS for name in (lease_key, epoch_key, state_key)}
    assert tagged == expected
    assert all(key.startswith(f"bargein:{tag}:".encode()) for key in tagged)
    # nothing mentions the session outside its tag (the directory names it only as a hash field)
    assert await _keys_mentioning(raw, session) == tagged
    # so in Redis Cluster every key of the session is in one slot
    assert len({key_slot(key) for key in tagged}) == 1


# --- the directory --------------------------------------------------------------------------------


async def test_orphaned_sessions_scans_a_large_directory_and_honours_the_limit(
    redis_store: RedisStateStore, new_session: SessionFactory
) -> None:
    sessions = [new_session(f"n{i:03d}") for i in range(450)]  # several HSCAN pages
    for i, session in enumerate(sessions):
        await redis_store.register_session(TIER, session, f"info-{i}".encode())
        if i % 3 == 0:
            assert await redis_store.acquire_lease(TIER, session, "worker-a", LONG_TTL_MS) == 1

    orphans = await redis_store.orphaned_sessions(TIER, limit=100_000)
    names = [session for session, _ in orphans]
    assert len(names) == len(set(names))  # no duplicates
    expected = {session: f"info-{i}".encode() for i, session in enumerate(sessions) if i % 3 != 0}
    assert _mine(orphans, *sessions) == expected

    assert len(await redis_store.orphaned_sessions(TIER, limit=7)) == 7
    assert await redis_store.orphaned_sessions(TIER, limit=0) == []


# --- configuration and failures -------------------------------------------------------------------


async def test_a_client_that_decodes_responses_is_refused(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        with pytest.raises(ValueError, match="decode_responses"):
            RedisStateStore(client)
    finally:
        await client.aclose()


async def test_connection_errors_propagate() -> None:
    store = RedisStateStore.from_url("redis://127.0.0.1:1/0")  # nothing listens on port 1
    try:
        with pytest.raises(RedisConnectionError):
            await store.acquire_lease(TIER, "nobody", "worker-a", LONG_TTL_MS)
        with pytest.raises(RedisConnectionError):
            await store.orphaned_sessions(TIER)
    finally:
        await store.close()


async def test_a_thousand_leases_renew_in_one_go_while_a_small_pool_is_busy(
    redis_url: str, new_session: SessionFactory
) -> None:
    """1,000 sessions in one reasoning process: measured before, renewals failed with "Too many
    connections" (redis-py's default pool fails at once when full, and each renewal took one)."""
    store = RedisStateStore.from_url(redis_url, pool_size=4, timeout_s=10)
    try:
        sessions = [new_session(f"k{i}") for i in range(1000)]
        epochs = await asyncio.gather(*(store.acquire_lease(TIER, s, "w", LONG_TTL_MS) for s in sessions))
        leases = {s: e for s, e in zip(sessions, epochs, strict=True) if e is not None}
        assert len(leases) == 1000
        others = [store.save_state(TIER, s, leases[s], b"checkpoint", LONG_TTL_MS) for s in sessions[:300]]
        renewed, *_ = await asyncio.gather(store.renew_leases(TIER, "w", leases, LONG_TTL_MS), *others)
        assert set(renewed.values()) == {Renewal.RENEWED}
        assert len(renewed) == 1000
    finally:
        await store.close()


async def test_leases_renewed_a_batch_at_a_time_each_get_their_own_answer(
    redis_store: RedisStateStore, new_session: SessionFactory
) -> None:
    """Past a batch (RENEW_BATCH, a round trip each, the event loop free between them) every
    session is still answered for itself: one whose epoch is not current is LOST, in any batch."""
    sessions = [new_session(f"b{i}") for i in range(2 * RENEW_BATCH + 3)]
    epochs = await asyncio.gather(*(redis_store.acquire_lease(TIER, s, "w", LONG_TTL_MS) for s in sessions))
    leases = {s: e for s, e in zip(sessions, epochs, strict=True) if e is not None}
    assert len(leases) == len(sessions)
    stale = sessions[RENEW_BATCH + 1]  # in the second batch
    renewed = await redis_store.renew_leases(TIER, "w", {**leases, stale: leases[stale] + 7}, LONG_TTL_MS)
    assert list(renewed) == sessions
    assert renewed[stale] is Renewal.LOST
    assert {r for s, r in renewed.items() if s != stale} == {Renewal.RENEWED}


# --- the heartbeat --------------------------------------------------------------------------------


async def test_a_heartbeat_that_beats_again_after_a_break_says_since_when_it_is_seen_alive(
    redis_store: RedisStateStore, new_session: SessionFactory
) -> None:
    # a process paused past its liveness TTL: its heartbeat's thread beats again the moment it
    # thaws, but the others may have taken its sessions during the break; alive_since tells
    worker = new_session("worker")
    beat = redis_store.keep_alive(TIER, worker, SHORT_TTL_MS)
    assert isinstance(beat, _ThreadHeartbeat)
    try:
        since = beat.alive_since
        await asyncio.sleep(LAPSE_S)
        assert beat.alive_since == since  # beating all along: no break
        assert worker not in await redis_store.dead_workers(TIER)
        beat._stopped.set()  # the thread stops beating (as SIGSTOP stops it), its key expires...
        beat._thread.join()
        await asyncio.sleep(LAPSE_S)
        assert worker in await redis_store.dead_workers(TIER)
        thawed_at = time.monotonic()
        beat._beat()  # ...and it beats again
        assert beat.alive_since >= thawed_at and time.monotonic() < beat.alive_until
    finally:
        beat.stop()
        await redis_store.forget_worker(TIER, worker)
