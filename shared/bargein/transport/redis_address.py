"""Where Redis is: one URL, either a server or the Sentinels that know which server is the master.

``BARGEIN_REDIS_URL`` takes redis-py's own forms (``redis://``, ``rediss://``, ``unix://``) and one
more, for a Redis kept highly available by Sentinel::

    redis+sentinel://[:password@]host:port[,host:port...]/service[/db][?sentinel_password=...]

The hosts are the Sentinels (port 26379 when left out), ``service`` the name they monitor the
master under, ``password`` the master's. A client made from such a URL asks the Sentinels for the
master before each new connection and drops its connections when the master moves, so a failover
costs the callers a few failed commands, which they already retry, rather than a restart. Being
one setting, the URL works in every place that took a Redis URL before (services, benches, tools).

Replication is asynchronous: a failover may lose the last writes the old master had not yet
passed on. The fencing epochs make that safe (a lost checkpoint is older state, never another
owner's), and docs/operations.md says what an operator sees.
"""

from __future__ import annotations

import redis
import redis.asyncio as aioredis
import redis.asyncio.retry as async_retry
import redis.asyncio.sentinel as async_sentinel
import redis.sentinel as sync_sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from bargein.settings import SentinelAddress, is_sentinel

# One more try, on a fresh connection, for a command whose pooled connection turns out dead: a
# Redis that restarted closed every connection of the pool, and each is found dead only when used.
# A Redis that is down costs one more connection attempt, at once, and a time-out none, so it is
# still reported within the time-out (the callers retry on their own schedule). redis-py gives a
# client its retries only when it makes the pool itself; the store makes its own pools.
# The blocking client (sync_client) keeps redis-py's default retries.
STALE_CONNECTION_RETRIES = 1


def _stale_connection_retry() -> async_retry.Retry:
    return async_retry.Retry(NoBackoff(), STALE_CONNECTION_RETRIES, supported_errors=(RedisConnectionError,))


class _BlockingSentinelPool(async_sentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """Sentinel's pool (it finds the master) with the blocking pool's waiting for a free
    connection: redis-py offers each, not both, and the store needs both."""


def async_client(url: str, *, pool_size: int, timeout_s: float) -> aioredis.Redis:
    """A client whose pool holds at most ``pool_size`` connections, callers waiting up to
    ``timeout_s`` for a free one (redis-py's default pool fails at once when full); every command
    gives up after ``timeout_s`` too, so a Redis that is down is noticed rather than hung on."""
    if not is_sentinel(url):
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=pool_size,
            timeout=timeout_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            decode_responses=False,
            retry=_stale_connection_retry(),
            retry_on_error=[RedisConnectionError],
        )
        return aioredis.Redis(connection_pool=pool)
    address = SentinelAddress.parse(url)
    sentinels = async_sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(address.sentinels), sentinel_kwargs=_sentinel_options(address, timeout_s)
    )
    client: aioredis.Redis = sentinels.master_for(
        address.service,
        connection_pool_class=_BlockingSentinelPool,
        max_connections=pool_size,
        timeout=timeout_s,
        db=address.db,
        password=address.password,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        decode_responses=False,
        retry=_stale_connection_retry(),
        retry_on_error=[RedisConnectionError],
    )
    return client


def sync_client(url: str, *, timeout_s: float) -> redis.Redis:
    """A blocking client, for the work that runs on a thread of its own (the heartbeat)."""
    if not is_sentinel(url):
        return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    address = SentinelAddress.parse(url)
    sentinels = sync_sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(address.sentinels), sentinel_kwargs=_sentinel_options(address, timeout_s)
    )
    client: redis.Redis = sentinels.master_for(  # type: ignore[no-untyped-call]
        address.service,
        db=address.db,
        password=address.password,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
    )
    return client


def _sentinel_options(address: SentinelAddress, timeout_s: float) -> dict[str, object]:
    """How to talk to the Sentinels themselves (their own password; the same time-outs)."""
    return {
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "password": address.sentinel_password,
    }
