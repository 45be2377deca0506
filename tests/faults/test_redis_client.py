"""The state store's client across a Redis restart: a connection pooled before the restart is
dead afterwards, and using it must cost no caller an error once Redis is back (an edge that was
idle through the outage refused one caller in five with 1013 this way)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from bargein.tools.private_brokers import PrivateRedis
from bargein.transport.redis_store import RedisStateStore

POOL = 4


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    with PrivateRedis(tmp_path / "redis") as redis:
        yield redis


async def test_connections_pooled_before_a_restart_serve_after_it(server: PrivateRedis) -> None:
    store = RedisStateStore.from_url(server.url, pool_size=POOL, timeout_s=2.0)
    try:
        await store.register_session("reasoning", "s1", b"{}")
        # every connection of the pool opened and given back: all of them go stale at the restart
        await asyncio.gather(*(store.session_info("reasoning", "s1") for _ in range(POOL * 3)))
        await asyncio.to_thread(server.restart)  # empty: no persistence
        # the first commands after the restart, one on each stale connection
        found = await asyncio.gather(*(store.session_info("reasoning", "s1") for _ in range(POOL * 3)))
        assert found == [None] * (POOL * 3)  # answered (Redis came back empty), not ConnectionError
        await store.register_session("reasoning", "s2", b"{}")
        assert await store.session_info("reasoning", "s2") == b"{}"
    finally:
        await store.close()


async def test_a_redis_that_stays_down_is_still_reported_at_once(server: PrivateRedis) -> None:
    """The retry is for a stale connection, not a wait: with Redis gone, a command fails within
    the store's time-out, so the callers (renewals, the edge's look-ups) notice and say so."""
    store = RedisStateStore.from_url(server.url, pool_size=POOL, timeout_s=2.0)
    try:
        await store.session_info("reasoning", "s1")
        await asyncio.to_thread(server.stop)
        async with asyncio.timeout(10.0):
            with pytest.raises(Exception, match=r"(?i)connect"):
                await store.session_info("reasoning", "s1")
    finally:
        await store.close()
        await asyncio.to_thread(server.start)
