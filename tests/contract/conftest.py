"""Each seam's implementations, as fixtures the contract suites run every test against.

``store`` is a :class:`~bargein.transport.abc.StateStore`: in memory, and Redis. ``bus`` makes
:class:`~bargein.transport.abc.Transport` objects on one broker: the in-memory broker, and RabbitMQ
(see :mod:`.harness`). The real halves are ``integration`` tests (they need ``redis_url`` /
``rabbitmq_url``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from bargein.transport.abc import StateStore
from bargein.transport.memory import MemoryStateStore
from bargein.transport.redis_store import RedisStateStore
from bargein.wire.names import session_directory_key as directory_key

from .harness import Bus, MemoryBus, RabbitBus


@pytest.fixture(params=["memory", pytest.param("rabbitmq", marks=pytest.mark.integration)])
def broker_url(request: pytest.FixtureRequest) -> str | None:
    """None for the in-memory broker, else a reachable RabbitMQ (resolved here, outside the loop)."""
    return None if request.param == "memory" else str(request.getfixturevalue("rabbitmq_url"))


@pytest.fixture
async def bus(broker_url: str | None) -> AsyncIterator[Bus]:
    made: Bus = MemoryBus() if broker_url is None else RabbitBus(broker_url)
    try:
        yield made
    finally:
        await made.close()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.integration)])
def store_url(request: pytest.FixtureRequest) -> str | None:
    """None for the in-memory store, else a reachable Redis."""
    return None if request.param == "memory" else str(request.getfixturevalue("redis_url"))


@pytest.fixture
async def store(store_url: str | None, unique_id: str) -> AsyncIterator[StateStore]:
    if store_url is None:
        yield MemoryStateStore()
        return
    real = RedisStateStore.from_url(store_url)
    try:
        yield real
    finally:
        await _forget_keys(store_url, unique_id)
        await real.close()


async def _forget_keys(url: str, unique_id: str) -> None:
    """Remove every key and directory entry a test made (its sessions carry ``unique_id``)."""
    client = aioredis.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=f"*{unique_id}*", count=1000)]
        if keys:
            await client.delete(*keys)
        for tier in ("reasoning", "speech", "edge"):
            names = [n async for n, _ in client.hscan_iter(directory_key(tier), match=f"*{unique_id}*")]
            if names:
                await client.hdel(directory_key(tier), *names)
    finally:
        await client.aclose()


@pytest.fixture
def session(unique_id: str) -> Callable[[str], str]:
    """Session ids unique to this test (``session("a")``), so nothing collides on a shared broker."""
    return lambda name="s": f"ct-{unique_id}-{name}"
