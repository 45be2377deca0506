"""Fixtures and test tiers for the whole suite.

Every test is marked with its tier, so a tier can be run on its own (``pytest -m unit``):

* ``integration``: it needs real RabbitMQ or Redis (it asks, directly or through another fixture,
  for ``rabbitmq_url`` or ``redis_url``): the broker tests, the service processes, the client edge;
* ``contract``: ``tests/contract``, one suite run against the in-memory and the real implementation
  of each seam (the real half is ``integration`` too);
* ``browser``: Debian's Chromium driving the web page (``tests/broadcast/test_browser.py``);
* ``faults``: ``tests/faults``, the whole product on brokers of its own, which the tests kill, pause
  and restart (``integration`` too);
* ``peers``: ``tests/peers``, another framework's own test suite run against bargein's
  compatibility layer (Line 0.1.12's, fetched from the package index on first use);
* ``unit``: everything else, in process (``tests/sdk``, ``tests/speech``, ``tests/line``, the checks
  of the repository itself).

Where RabbitMQ and Redis come from, and what happens when they are missing (a skip, or under
``CI=true`` a failure), is in ``tests/services.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bargein.transport.redis_store import RedisStateStore
from tests.services import rabbitmq_service, redis_service

_HERE = Path(__file__).resolve().parent
SERVICE_FIXTURES = {"rabbitmq_url", "redis_url"}
BROWSER_TESTS = {"test_browser.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        relative = item.path.resolve().relative_to(_HERE)
        tiers = set()
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            tiers.add("integration")
        if relative.parts[0] == "contract":
            tiers.add("contract")
        if relative.parts[0] == "faults":
            tiers |= {"faults", "integration"}
        if relative.parts[0] == "peers":
            tiers.add("peers")
        if relative.name in BROWSER_TESTS:
            tiers.add("browser")
        for tier in tiers or {"unit"}:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session")
def rabbitmq_url() -> Iterator[str]:
    """A reachable RabbitMQ (checked once per session)."""
    yield from rabbitmq_service()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A reachable Redis (checked once per session)."""
    yield from redis_service()


@pytest.fixture
async def redis_store(redis_url: str) -> AsyncIterator[RedisStateStore]:
    store = RedisStateStore.from_url(redis_url)
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def unique_id() -> str:
    """A fresh short id, so tests never collide on keys, queues or sessions."""
    return uuid.uuid4().hex[:12]
