"""Running a session-owning service (the reasoning and the speech tier) until it is told to stop.

A service is: settings → transport (RabbitMQ) + state store (Redis) → the tier's session processors
(the agent's runtime, or speech detection) → host → worker, then wait for SIGINT/SIGTERM and drain.
``bargein reasoning``, ``bargein speech`` and the services' ``__main__`` modules only call :func:`main`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Callable

from bargein import tracing
from bargein.agent.llm import close_shared_llms
from bargein.errors import SettingsError
from bargein.hosting.host import ProcessorFactory, SessionHost, agent_sessions, default_owner_id
from bargein.hosting.loader import load_agent
from bargein.hosting.logs import configure_logging
from bargein.hosting.probes import Probes, readiness
from bargein.hosting.worker import Worker
from bargein.settings import BrokerSettings, CoreSettings, LLMSettings, load
from bargein.transport.amqp import AmqpTransport
from bargein.transport.redis_store import RedisStateStore
from bargein.wire.names import Tier

log = logging.getLogger("bargein.hosting.service")


FactoryBuilder = Callable[[CoreSettings], ProcessorFactory]


def reasoning_factory(core: CoreSettings) -> ProcessorFactory:
    """The reasoning tier runs ``BARGEIN_AGENT`` for every session it owns."""
    return agent_sessions(load_agent(core.agent))


async def serve(tier: Tier, build: FactoryBuilder, core: CoreSettings, broker: BrokerSettings) -> None:
    factory = build(core)
    owner = f"{tier}-{default_owner_id()}"
    transport = await AmqpTransport.from_settings(core, broker, name=owner)
    store = RedisStateStore.from_settings(broker)
    host = SessionHost(
        transport,
        store,
        factory,
        owner=owner,
        tier=tier,
        lease_ttl_ms=broker.lease_ttl_ms,
        state_ttl_ms=broker.state_ttl_s * 1000,
        idle_end_s=broker.session_idle_s,
    )
    worker = Worker(
        host,
        max_sessions=broker.max_sessions,
        adopt_interval_s=broker.adopt_interval_s,
        status_interval_s=broker.status_interval_s,
        drain_timeout_s=broker.drain_timeout_s,
        liveness_ttl_ms=broker.liveness_ttl_ms,
        overload_lag_ms=broker.overload_lag_ms,
    )

    ready = readiness(transport, store, lambda: worker.consuming, lambda: worker.load.overloaded)
    probes = Probes(ready, host=broker.probe_host, port=broker.probe_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await probes.start()
        await worker.start()
        # Move everything start-up allocated out of the collector's way: a full collection over
        # the libraries' objects is a pause of many milliseconds, felt as a late interrupt.
        gc.collect()
        gc.freeze()
        log.info("%s service running; stop with SIGINT or SIGTERM", tier)
        await stop.wait()
        log.info("%s service stopping: draining sessions", tier)
        await worker.drain()
    finally:
        await probes.stop()
        with contextlib.suppress(Exception):
            await store.close()
        with contextlib.suppress(Exception):
            await transport.close()
        with contextlib.suppress(Exception):
            await close_shared_llms()
    log.info("%s service stopped", tier)


def main(tier: Tier, build: FactoryBuilder = reasoning_factory) -> int:
    """Run the service; a bad setting ends it at once with exit code 2 and the variable's name."""
    try:
        return _main(tier, build)
    except SettingsError as exc:
        print(f"bargein {tier}: {exc}", file=sys.stderr)
        return 2


def _main(tier: Tier, build: FactoryBuilder) -> int:
    core = load(CoreSettings)
    broker = load(BrokerSettings)
    load(LLMSettings)  # fail now on a bad LLM setting, not in the first turn
    configure_logging(core.log_level, core.log_format)
    tracing.configure(core, service_name=f"bargein-{tier}")
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio works too
        pass
    asyncio.run(serve(tier, build, core, broker))
    return 0
