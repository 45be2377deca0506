"""The Redis state store: session leases with fencing epochs, checkpoints and the session directory.

It has the semantics of :class:`bargein.transport.memory.MemoryStateStore`, made safe across processes:

Fencing.
    A lease is a key holding ``<owner>:<epoch>`` with a TTL (``PX``). Taking it increments the
    session's epoch counter in the same Lua script, so epochs are strictly increasing and every
    acquirer gets its own token: two workers can never both believe they hold the same epoch. A
    checkpoint is written by a Lua check-and-set that compares the writer's epoch with the counter,
    so a worker that lost its lease (paused, partitioned) and wakes up later is refused with
    :class:`~bargein.errors.StaleEpochError` instead of overwriting the adopter's state. Renewing
    and releasing are compare-and-set / compare-and-delete on the whole token, so a former holder
    can neither extend nor drop its successor's lease.

Hash tags.
    Every key of one session is named by :mod:`bargein.wire.names` with the ``{<session>}`` hash tag, so
    in Redis Cluster they share a slot and each script (which only ever touches the keys of one
    session) is allowed. The session directory is one global hash per tier; it is never touched by
    a script: :meth:`RedisStateStore.orphaned_sessions` scans it from Python and checks the leases
    with a non-transactional pipeline, one key at a time.

The epoch counter's lifetime.
    Fencing only holds while the counter never goes backwards, so the counter must outlive
    everything that carries an epoch: the lease and the checkpoint. Each script that sets a TTL on
    the lease or the state therefore also *extends* (never shortens) the counter's TTL to at least
    the same value and at least ``epoch_min_ttl_ms`` (7 days by default). A counter thus survives
    as long as the session is active and a week past its last checkpoint or lease, and the counters
    of abandoned sessions are still reclaimed eventually instead of leaking forever. Pass
    ``epoch_min_ttl_ms=None`` to keep counters forever (until :meth:`RedisStateStore.delete_state`).
    After ``delete_state`` (or after the counter expired, which needs a week of silence and no
    checkpoint left) the next acquire starts again at epoch 1; that is safe because the state the
    epochs protected is gone too.

Connection errors are not handled here: they propagate as :mod:`redis.exceptions` errors and the
callers (the session host's lease and adoption loops) retry.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Final, Self

import redis
import redis.asyncio as aioredis

from bargein.errors import StaleEpochError
from bargein.settings import BrokerSettings
from bargein.transport.abc import NO_LOG_CHANGE, Heartbeat, LogChange, Renewal, StateStore
from bargein.transport.redis_address import async_client, sync_client
from bargein.wire.names import (
    Tier,
    call_key,
    caller_deadlines_key,
    epoch_key,
    lease_key,
    owned_key,
    partition_count_key,
    session_directory_key,
    state_key,
    state_log_key,
    worker_alive_key,
    workers_key,
)

log = logging.getLogger("bargein.transport.redis")

DEFAULT_EPOCH_MIN_TTL_MS: Final = 7 * 24 * 3600 * 1000
DEFAULT_POOL_SIZE: Final = 64
DEFAULT_TIMEOUT_S: Final = 5.0
# Leases renewed in one pipeline: building, sending and reading one is a single step of the event
# loop, in which no interrupt is handled (10,000 leases in one pipeline were a 57 ms step here; 256
# are about 2 ms), so a process with many sessions renews them a batch at a time.
RENEW_BATCH: Final = 256

# Extend KEY's TTL to at least TTL ms; never shorten it, never give a persistent key a TTL, never
# create the key. A TTL of 0 means "epoch counters never expire": nothing to do.
_EXTEND = """
local function extend(key, ttl)
  ttl = tonumber(ttl)
  if ttl <= 0 then return end
  local left = redis.call('PTTL', key)
  if left >= 0 and left < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end
"""

# KEYS: the caller deadlines. ARGV: now, limit. Pops the sessions due (atomically: each to one asker).
_CALLERS_GONE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #due > 0 then
  redis.call('ZREM', KEYS[1], unpack(due))
end
return due
"""

# KEYS: lease, epoch. ARGV: owner, lease ttl ms, epoch ttl ms (0: none), the dead owner whose lease
# may be taken ('' for none). Returns the new epoch, or nil when the lease is held.
_ACQUIRE = (
    _EXTEND
    + """
local held = redis.call('GET', KEYS[1])
if held then
  local dead = ARGV[4] .. ':'
  if ARGV[4] == '' or string.sub(held, 1, string.len(dead)) ~= dead then
    return false
  end
end
local epoch = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. epoch, 'PX', ARGV[2])
if epoch == 1 and tonumber(ARGV[3]) > 0 and redis.call('PTTL', KEYS[2]) == -1 then
  -- INCR just created the counter without a TTL
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
else
  extend(KEYS[2], ARGV[3])
end
return epoch
"""
)

# KEYS: lease, epoch. ARGV: token (owner:epoch), lease ttl ms, epoch ttl ms, epoch.
# Returns 1 if renewed; 2 if the lease was gone and no later epoch was handed out, so it (and the
# counter) is set again: Redis lost it, or it lapsed unclaimed; 0 if it is lost.
_RENEW = (
    _EXTEND
    + """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  extend(KEYS[2], ARGV[3])
  return 1
end
if held then
  return 0
end
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
if counter > tonumber(ARGV[4]) then
  return 0
end
redis.call('SET', KEYS[2], ARGV[4])
if tonumber(ARGV[3]) > 0 then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 2
"""
)

# KEYS: lease. ARGV: token. Returns 1 if the lease was ours and is now gone.
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
"""

# KEYS: epoch, state. ARGV: epoch, data, state ttl ms, epoch ttl ms.
# Returns 1 if stored, 0 if ARGV[1] is not the current epoch. A missing counter reads as epoch 0,
# like MemoryStateStore's counter.
_SAVE = (
    _EXTEND
    + """
local current = redis.call('GET', KEYS[1])
if current == false then
  current = '0'
end
if current ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
extend(KEYS[1], ARGV[4])
-- the log: ARGV[5] names to delete, then name/item pairs to set (in batches: Lua's stack is small)
local deletes = tonumber(ARGV[5])
local first = 6
for i = first, first + deletes - 1, 1000 do
  redis.call('HDEL', KEYS[3], unpack(ARGV, i, math.min(i + 999, first + deletes - 1)))
end
for i = first + deletes, #ARGV, 2000 do
  redis.call('HSET', KEYS[3], unpack(ARGV, i, math.min(i + 1999, #ARGV)))
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
return 1
"""
)

# KEYS: epoch. ARGV: floor, epoch ttl ms (0: none). The counter is at least the floor afterwards.
_RAISE_EPOCH = """
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  if tonumber(ARGV[2]) > 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
end
return 1
"""

_SCAN_COUNT: Final = 200  # directory entries per HSCAN page (a hint to Redis)


class RedisStateStore(StateStore):
    """:class:`~bargein.transport.abc.StateStore` on Redis (standalone or, key-wise, Cluster-ready).

    ``redis`` must return bytes (``decode_responses=False``): checkpoints are binary msgpack.
    ``epoch_min_ttl_ms`` is how long an epoch counter outlives the session's last lease or
    checkpoint (``None``: forever, until :meth:`delete_state`); see the module docstring.
    :meth:`close` closes ``redis``.
    """

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        epoch_min_ttl_ms: int | None = DEFAULT_EPOCH_MIN_TTL_MS,
        url: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("RedisStateStore needs a client with decode_responses=False (state is binary)")
        if epoch_min_ttl_ms is not None and epoch_min_ttl_ms <= 0:
            raise ValueError(f"epoch_min_ttl_ms must be positive or None, got {epoch_min_ttl_ms}")
        self._redis = client
        self._url = url  # for the heartbeat thread's own client
        self._timeout_s = timeout_s
        self._epoch_min_ttl_ms = epoch_min_ttl_ms
        self._acquire = client.register_script(_ACQUIRE)
        self._raise_epoch = client.register_script(_RAISE_EPOCH)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._save = client.register_script(_SAVE)
        self._callers_gone = client.register_script(_CALLERS_GONE)

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        epoch_min_ttl_ms: int | None = DEFAULT_EPOCH_MIN_TTL_MS,
        pool_size: int = DEFAULT_POOL_SIZE,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> Self:
        """A store with its own client for ``url`` (any form :mod:`.redis_address` takes).

        The pool holds at most ``pool_size`` connections and a caller waits (up to ``timeout_s``)
        for a free one; every command gives up after ``timeout_s`` too, so a Redis that is down is
        noticed (and retried by the callers) instead of hanging a lease renewal."""
        return cls(
            async_client(url, pool_size=pool_size, timeout_s=timeout_s),
            epoch_min_ttl_ms=epoch_min_ttl_ms,
            url=url,
            timeout_s=timeout_s,
        )

    @classmethod
    def from_settings(cls, broker: BrokerSettings) -> RedisStateStore:
        """As every service opens it, from its settings."""
        return cls.from_url(
            broker.redis_url, pool_size=broker.redis_pool_size, timeout_s=broker.redis_timeout_s
        )

    @property
    def redis(self) -> aioredis.Redis:
        """The underlying client (for health checks and tests)."""
        return self._redis

    def _epoch_ttl(self, ttl_ms: int) -> int:
        """The TTL the epoch counter gets extended to alongside a lease/state TTL (0: never expires)."""
        if self._epoch_min_ttl_ms is None:
            return 0
        return max(ttl_ms, self._epoch_min_ttl_ms)

    # --- leases -----------------------------------------------------------------------------------

    async def acquire_lease(
        self, tier: Tier, session: str, owner: str, ttl_ms: int, *, replacing: str | None = None
    ) -> int | None:
        _check_ttl(ttl_ms)
        epoch = await self._acquire(
            keys=[lease_key(tier, session), epoch_key(tier, session)],
            args=[owner, ttl_ms, self._epoch_ttl(ttl_ms), replacing or ""],
        )
        return None if epoch is None else int(epoch)

    async def renew_lease(self, tier: Tier, session: str, owner: str, epoch: int, ttl_ms: int) -> Renewal:
        return (await self.renew_leases(tier, owner, {session: epoch}, ttl_ms))[session]

    async def renew_leases(
        self, tier: Tier, owner: str, leases: Mapping[str, int], ttl_ms: int
    ) -> dict[str, Renewal]:
        """One pipeline a :data:`RENEW_BATCH` of them (the scripts are sent again if Redis forgot
        them): a round trip each, and the event loop free between them."""
        _check_ttl(ttl_ms)
        sessions = list(leases)
        renewed: dict[str, Renewal] = {}
        for start in range(0, len(sessions), RENEW_BATCH):
            batch = sessions[start : start + RENEW_BATCH]
            async with self._redis.pipeline(transaction=False) as pipe:
                for session in batch:
                    await self._renew(
                        keys=[lease_key(tier, session), epoch_key(tier, session)],
                        args=[
                            _token(owner, leases[session]),
                            ttl_ms,
                            self._epoch_ttl(ttl_ms),
                            leases[session],
                        ],
                        client=pipe,
                    )
                results = await pipe.execute()
            renewed.update(
                (session, Renewal(int(result))) for session, result in zip(batch, results, strict=True)
            )
        return renewed

    async def release_lease(self, tier: Tier, session: str, owner: str, epoch: int) -> None:
        await self._release(keys=[lease_key(tier, session)], args=[_token(owner, epoch)])

    # --- the checkpoint ---------------------------------------------------------------------------

    async def save_state(
        self, tier: Tier, session: str, epoch: int, data: bytes, ttl_ms: int, log: LogChange = NO_LOG_CHANGE
    ) -> None:
        _check_ttl(ttl_ms)
        deletes = log.removed()
        sets = [part for pair in log.written() for part in pair]
        stored = await self._save(
            keys=[epoch_key(tier, session), state_key(tier, session), state_log_key(tier, session)],
            args=[str(int(epoch)), data, ttl_ms, self._epoch_ttl(ttl_ms), len(deletes), *deletes, *sets],
        )
        if not stored:
            raise StaleEpochError(f"epoch {epoch} is not current for {tier}/{session}")

    async def load_state(self, tier: Tier, session: str) -> bytes | None:
        data = await self._redis.get(state_key(tier, session))
        return None if data is None else _as_bytes(data)

    async def load_log(self, tier: Tier, session: str) -> dict[bytes, bytes]:
        raw = await self._redis.hgetall(state_log_key(tier, session))
        return {_as_bytes(name): _as_bytes(item) for name, item in raw.items()}

    async def current_epoch(self, tier: Tier, session: str) -> int:
        value = await self._redis.get(epoch_key(tier, session))
        return 0 if value is None else int(value)

    async def delete_state(self, tier: Tier, session: str) -> None:
        # both keys carry the {session} hash tag: one slot, so one DEL is fine in Cluster too. The
        # lease is left alone (as MemoryStateStore does); its holder can no longer save, and the
        # next acquire after it restarts at epoch 1.
        await self._redis.delete(
            state_key(tier, session), state_log_key(tier, session), epoch_key(tier, session)
        )

    # --- the directory ----------------------------------------------------------------------------

    async def register_session(self, tier: Tier, session: str, info: bytes) -> None:
        await self._redis.hset(session_directory_key(tier), session, info)

    async def unregister_session(self, tier: Tier, session: str) -> None:
        await self._redis.hdel(session_directory_key(tier), session)

    async def session_info(self, tier: Tier, session: str) -> bytes | None:
        info = await self._redis.hget(session_directory_key(tier), session)
        return info if info is None or isinstance(info, bytes) else info.encode()

    async def absent_sessions(self, tier: Tier, sessions: Collection[str]) -> list[str]:
        names = list(sessions)
        if not names:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hexists(session_directory_key(tier), name)
            held = await pipe.execute()
        return [name for name, there in zip(names, held, strict=True) if not there]

    async def restore_sessions(
        self, tier: Tier, records: Mapping[str, bytes], epochs: Mapping[str, int] | None = None
    ) -> list[str]:
        names = list(records)
        if not names:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hsetnx(session_directory_key(tier), name, records[name])
            written = await pipe.execute()
        restored = [name for name, wrote in zip(names, written, strict=True) if wrote]
        floors = [(name, floor) for name in restored if (floor := (epochs or {}).get(name, 0)) > 0]
        if floors:
            async with self._redis.pipeline(transaction=False) as pipe:
                for name, floor in floors:
                    await self._raise_epoch(
                        keys=[epoch_key(tier, name)], args=[floor, self._epoch_ttl(0)], client=pipe
                    )
                await pipe.execute()
        return restored

    async def orphaned_sessions(
        self, tier: Tier, limit: int = 100, wanted: Callable[[str], bool] | None = None
    ) -> list[tuple[str, bytes]]:
        """Registered sessions of ``tier`` whose lease key does not exist, at most ``limit``.

        O(directory) per call: HSCAN pages of the directory, each followed by one pipelined round
        of EXISTS on the page's lease keys (no cross-slot script). The answer is a snapshot: a
        session may be adopted by someone else right after, which ``acquire_lease`` arbitrates.
        """
        if limit <= 0:
            return []
        directory = session_directory_key(tier)
        out: list[tuple[str, bytes]] = []
        seen: set[bytes] = set()  # HSCAN may return an entry more than once
        cursor = 0
        while True:
            cursor, page = await self._redis.hscan(directory, cursor, count=_SCAN_COUNT)
            if not isinstance(page, dict):  # only with no_values=True
                raise TypeError(f"unexpected HSCAN reply {type(page).__name__}")
            fresh = [(_as_bytes(name), _as_bytes(info)) for name, info in page.items()]
            fresh = [(name, info) for name, info in fresh if name not in seen]
            seen.update(name for name, _ in fresh)
            if fresh:
                sessions = [(name.decode(), info) for name, info in fresh]
                if wanted is not None:
                    sessions = [(session, info) for session, info in sessions if wanted(session)]
                async with self._redis.pipeline(transaction=False) as pipe:
                    for session, _ in sessions:
                        pipe.exists(lease_key(tier, session))
                    held = await pipe.execute()
                for (session, info), exists in zip(sessions, held, strict=True):
                    if not exists:
                        out.append((session, info))
                        if len(out) >= limit:
                            return out
            if cursor == 0:
                return out

    # --- worker liveness ------------------------------------------------------------------------

    def keep_alive(self, tier: Tier, owner: str, ttl_ms: int) -> Heartbeat:
        if self._url is None:
            raise ValueError("keep_alive needs a store made with RedisStateStore.from_url")
        return _ThreadHeartbeat(self._url, tier, owner, ttl_ms, self._timeout_s)

    async def dead_workers(self, tier: Tier) -> list[str]:
        return sorted(owner for owner, up in await self._workers_alive(tier) if not up)

    async def live_workers(self, tier: Tier) -> list[str]:
        return sorted(owner for owner, up in await self._workers_alive(tier) if up)

    async def _workers_alive(self, tier: Tier) -> list[tuple[str, bool]]:
        """Every worker of ``tier`` that started a heartbeat, and whether it still beats."""
        owners = [_as_bytes(o).decode() for o in await self._redis.hkeys(workers_key(tier))]
        if not owners:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for owner in owners:
                pipe.exists(worker_alive_key(tier, owner))
            alive = await pipe.execute()
        return [(owner, bool(up)) for owner, up in zip(owners, alive, strict=True)]

    async def claim_partition_count(self, tier: Tier, count: int) -> int:
        key = partition_count_key(tier)
        await self._redis.set(key, count, nx=True)
        return int(await self._redis.get(key) or count)

    async def note_owned(self, tier: Tier, owner: str, session: str, owned: bool) -> None:
        if owned:
            await self._redis.sadd(owned_key(tier, owner), session)
        else:
            await self._redis.srem(owned_key(tier, owner), session)

    async def owned_sessions(self, tier: Tier, owner: str) -> list[str]:
        return sorted(_as_bytes(s).decode() for s in await self._redis.smembers(owned_key(tier, owner)))

    async def forget_worker(self, tier: Tier, owner: str) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hdel(workers_key(tier), owner)
            pipe.delete(owned_key(tier, owner), worker_alive_key(tier, owner))
            await pipe.execute()

    # --- callers -----------------------------------------------------------------------------------

    async def expect_callers(self, deadlines: Mapping[str, float]) -> None:
        if deadlines:  # GT: a deadline only moves later; new sessions are added all the same
            await self._redis.zadd(caller_deadlines_key(), dict(deadlines), gt=True)

    async def callers_gone(self, now: float, limit: int = 100) -> list[str]:
        if limit <= 0:
            return []
        due = await self._callers_gone(keys=[caller_deadlines_key()], args=[repr(now), limit])
        return [_as_bytes(session).decode() for session in due]

    async def caller_deadline(self, session: str) -> float | None:
        score = await self._redis.zscore(caller_deadlines_key(), session)
        return None if score is None else float(score)

    async def forget_callers(self, session: str) -> None:
        await self._redis.zrem(caller_deadlines_key(), session)

    async def note_call(self, carrier: str, call_id: str, session: str, ttl_ms: int) -> None:
        _check_ttl(ttl_ms)
        await self._redis.set(call_key(carrier, call_id), session, px=ttl_ms)

    async def session_of_call(self, carrier: str, call_id: str) -> str | None:
        session = await self._redis.get(call_key(carrier, call_id))
        return None if session is None else _as_bytes(session).decode()

    async def close(self) -> None:
        await self._redis.aclose()


class _ThreadHeartbeat(Heartbeat):
    """Refreshes a worker's alive key from a thread of its own, with a client of its own: a worker
    whose event loop is busy (or stalled by a long collection) is still alive; a killed or paused
    one is not, within the TTL."""

    def __init__(self, url: str, tier: Tier, owner: str, ttl_ms: int, timeout_s: float) -> None:
        self._client = sync_client(url, timeout_s=timeout_s)
        self._tier, self._owner, self._ttl_ms = tier, owner, ttl_ms
        self.alive_until = self.alive_since = 0.0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat:{owner}", daemon=True)
        self._beat()  # alive before anyone could look
        self._thread.start()

    def _beat(self) -> None:
        asked_at = time.monotonic()
        pipe = self._client.pipeline(transaction=False)
        pipe.set(worker_alive_key(self._tier, self._owner), b"1", px=self._ttl_ms)
        pipe.hset(workers_key(self._tier), self._owner, str(time.time()))
        pipe.execute()
        if asked_at >= self.alive_until:  # the last beat's key may have expired first: a break
            self.alive_since = asked_at
        # the others see us alive until the key expires: from when we asked, less a little spare
        self.alive_until = asked_at + 0.8 * self._ttl_ms / 1000

    def _run(self) -> None:
        failing = False
        while not self._stopped.wait(self._ttl_ms / 4000):
            try:
                self._beat()
            except redis.RedisError as exc:  # Redis is down: the next beat will tell it again
                if not failing:
                    log.warning("heartbeat of %s failed: %s", self._owner, exc)
                failing = True
            else:
                failing = False

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(redis.RedisError):
            self._client.delete(worker_alive_key(self._tier, self._owner))
        self._client.close()


def _token(owner: str, epoch: int) -> str:
    """The lease value: unique per acquisition, since every acquire gets a new epoch."""
    return f"{owner}:{int(epoch)}"


def _as_bytes(value: bytes | str) -> bytes:
    """Replies are bytes (``decode_responses=False``); the str half of redis-py's types is not."""
    if isinstance(value, bytes):
        return value
    raise TypeError(f"expected bytes from Redis, got {type(value).__name__}")


def _check_ttl(ttl_ms: int) -> None:
    if ttl_ms <= 0:
        raise ValueError(f"ttl_ms must be positive, got {ttl_ms}")
