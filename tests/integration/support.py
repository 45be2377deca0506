"""What the integration tests share: the test's side of a session (creating it, playing caller and
edge), and how they read what the service processes did (leases, checkpoints, probe notes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.asyncio as aioredis

from bargein.agent.events import AgentResponse, Event, UserStoppedSpeaking, UserTranscriptionReceived
from bargein.hosting.host import owner_pid
from bargein.hosting.sessions import create_session, forget_session
from bargein.runtime import journal
from bargein.settings import BrokerSettings, load
from bargein.testing.caller import Caller
from bargein.transport.amqp import AmqpTransport
from bargein.transport.redis_store import RedisStateStore
from bargein.wire.envelope import new_session_id
from bargein.wire.names import TIER_REASONING, Tier, lease_key, partition_headers
from bargein.wire.session_info import SessionInfo

from .agents import notes_key

T = 15.0  # generous time-out for anything that should take well under a second


class Client:
    """The test's side: starts sessions and plays caller + edge for each."""

    def __init__(
        self, transport: AmqpTransport, store: RedisStateStore, redis_client: aioredis.Redis
    ) -> None:
        self.transport = transport
        self.store = store
        self.redis = redis_client
        self.callers: list[Caller] = []

    async def open(
        self,
        options: dict[str, Any],
        tiers: Sequence[Tier] = (TIER_REASONING,),
        *,
        report_playback: bool = False,
    ) -> Caller:
        """What the edge does when a caller arrives: listen, then start the session in each tier
        (``report_playback``: and tell the speech tier when the agent's chunks reach the caller)."""
        sid = new_session_id()
        caller = Caller(self.transport, sid, report_playback=report_playback)
        await caller.attach()
        info = SessionInfo(sid, dict(options), edge_reports_delivery=True)
        for tier in tiers:
            await create_session(self.transport, self.store, info, tier=tier)
        self.callers.append(caller)
        return caller

    async def forget(self, caller: Caller, tiers: Sequence[Tier]) -> None:
        self.callers.remove(caller)
        await caller.detach()
        for tier in tiers:
            await forget_session(self.transport, self.store, caller.session_id, tier=tier)

    async def lease(self, caller: Caller, tier: Tier = TIER_REASONING, timeout: float = T) -> bytes:
        async with asyncio.timeout(timeout):
            while True:
                value: bytes | None = await self.redis.get(lease_key(tier, caller.session_id))
                if value:
                    return value
                await asyncio.sleep(0.05)

    async def owner_pid(self, caller: Caller, tier: Tier = TIER_REASONING, timeout: float = T) -> int:
        return owner_pid(await self.lease(caller, tier, timeout))

    async def notes(self, caller: Caller) -> list[str]:
        """What ``tests.integration.agents``' probe reported from inside its process."""
        raw = await self.redis.lrange(notes_key(caller.session_id), 0, -1)
        return [n.decode().split("|pid=")[0] for n in raw]

    async def wait_note(self, caller: Caller, prefix: str, timeout: float = T) -> str:
        async with asyncio.timeout(timeout):
            while True:
                for n in await self.notes(caller):
                    if n.startswith(prefix):
                        return n
                await asyncio.sleep(0.02)

    async def node_state(self, caller: Caller, node_id: str) -> dict[str, Any]:
        """The node's attributes as its owner last checkpointed them."""
        checkpoint = await journal.read(self.store, TIER_REASONING, caller.session_id)
        assert checkpoint is not None, "no checkpoint yet"
        state: dict[str, Any] = checkpoint[0]["nodes"][node_id]
        return state

    async def wait_state(self, caller: Caller, node_id: str, key: str, expected: Any) -> None:
        async with asyncio.timeout(T):
            while (await self.node_state(caller, node_id)).get(key) != expected:  # noqa: ASYNC110 - Redis
                await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def connected_client(
    rabbitmq_url: str, redis_url: str, name: str, *, partitions: int | None = None
) -> AsyncIterator[Client]:
    """A client of the services started with the same environment: its mailboxes as theirs (the
    settings' unless ``partitions`` says otherwise), or its messages would reach nobody."""
    if partitions is None:
        partitions = load(BrokerSettings).partition_count
    transport = await AmqpTransport.connect(rabbitmq_url, name=name, partitions=partitions)
    store = RedisStateStore.from_url(redis_url)
    redis_client = aioredis.Redis.from_url(redis_url)
    client = Client(transport, store, redis_client)
    try:
        yield client
    finally:
        for caller in client.callers:
            await caller.detach()
        await transport.close()
        await store.close()
        await redis_client.aclose()


def in_headers(client: Client, session: str) -> dict[str, Any] | None:
    """What routes a message for ``session`` to its partition (none with a mailbox per session)."""
    count = client.transport.partition_count
    return dict(partition_headers(session, count)) if count else None


async def ask(caller: Caller, text: str) -> None:
    """The caller says ``text`` and stops: the usual trigger for a turn."""
    await caller.emit(UserTranscriptionReceived(content=text))
    await caller.emit(UserStoppedSpeaking())


async def chunks(caller: Caller, n: int) -> str:
    """The text of the next ``n`` chunks (each must be a chunk)."""
    out = ""
    for _ in range(n):
        event = await caller.next(timeout=T)
        assert isinstance(event, AgentResponse), event
        out += event.content
    return out


def text_of(events: list[Event]) -> str:
    return "".join(e.content for e in events if isinstance(e, AgentResponse))
