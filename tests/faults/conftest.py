"""The fault tests need RabbitMQ and Redis *programs* (they start brokers of their own to break):
without them the tests are skipped, except under ``CI=true``, where that is a failure. Each test
module starts its own ``stack``; ``redis`` is a client of that stack's Redis."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from bargein.transport.redis_address import async_client
from tests.faults.stack import FaultStack

NEEDED = ("rabbitmq-server", "rabbitmqctl", "redis-server", "redis-cli")


@pytest.fixture(scope="session", autouse=True)
def broker_programs() -> None:
    missing = [name for name in NEEDED if shutil.which(name) is None]
    if missing:
        message = f"the fault tests start their own brokers and need {', '.join(missing)}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}. CI=true: they must not be skipped.", pytrace=False)
        pytest.skip(message)


@pytest.fixture
async def redis(stack: FaultStack) -> AsyncIterator[aioredis.Redis]:
    """A client of the module's own stack's Redis (each module defines ``stack``)."""
    client = async_client(stack.redis.url, pool_size=8, timeout_s=5.0)
    try:
        yield client
    finally:
        await client.aclose()
