"""Running a session-owning service (reasoning today, speech next) until it is told to stop.

A service is: settings → transport (RabbitMQ) + state store (Redis) → agent → host → worker, then
wait for SIGINT/SIGTERM and drain. The services' ``__main__`` modules only call :func:`main`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from bargein.amqp import AmqpTransport
from bargein.host import SessionHost, default_owner_id
from bargein.loader import load_agent
from bargein.logs import configure_logging
from bargein.names import Tier
from bargein.redis_store import RedisStateStore
from bargein.settings import BrokerSettings, CoreSettings, LLMSettings, load
from bargein.worker import Worker

log = logging.getLogger("bargein.service")


async def serve(tier: Tier, core: CoreSettings, broker: BrokerSettings) -> None:
    agent = load_agent(core.agent)
    owner = f"{tier}-{default_owner_id()}"
    transport = await AmqpTransport.connect(
        broker.rabbitmq_url,
        max_message_bytes=core.max_message_bytes,
        mailbox_expiry_ms=broker.mailbox_expiry_s * 1000,
        name=owner,
    )
    store = RedisStateStore.from_url(broker.redis_url)
    host = SessionHost.for_agent(
        transport,
        store,
        agent,
        owner=owner,
        tier=tier,
        lease_ttl_ms=broker.lease_ttl_ms,
        state_ttl_ms=broker.state_ttl_s * 1000,
    )
    worker = Worker(
        host,
        max_sessions=broker.max_sessions,
        adopt_interval_s=broker.adopt_interval_s,
        status_interval_s=broker.status_interval_s,
        drain_timeout_s=broker.drain_timeout_s,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await worker.start()
        log.info("%s service running agent %s; stop with SIGINT or SIGTERM", tier, core.agent)
        await stop.wait()
        log.info("%s service stopping: draining sessions", tier)
        await worker.drain()
    finally:
        with contextlib.suppress(Exception):
            await store.close()
        with contextlib.suppress(Exception):
            await transport.close()
    log.info("%s service stopped", tier)


def main(tier: Tier) -> int:
    core = load(CoreSettings)
    broker = load(BrokerSettings)
    load(LLMSettings)  # fail now on a bad LLM setting, not in the first turn
    configure_logging(core.log_level)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio works too
        pass
    asyncio.run(serve(tier, core, broker))
    return 0
