"""An edge's queues over RabbitMQ with many sessions: a session leaves them as cheaply as it came,
and what a reconnect binds again is the sessions the edge still has."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import AsyncIterator

import pytest

from bargein.transport.amqp import AmqpTransport
from bargein.wire.envelope import Envelope
from bargein.wire.names import OUT

from ..contract.harness import until
from .test_bundles import Seen, chunk, recorder

T = 60.0
MANY = 1000  # sessions on one edge (a dozen bindings each)


@pytest.fixture
async def edge(rabbitmq_url: str, unique_id: str) -> AsyncIterator[AmqpTransport]:
    transport = await AmqpTransport.connect(rabbitmq_url, name=f"edge-queue-test-{unique_id}")
    try:
        yield transport
    finally:
        await transport.close()


async def timed(sessions: list[str], step: object) -> float:
    """Seconds to do ``step`` to every session, twenty at a time (as an edge's callers come and go)."""
    gate = asyncio.Semaphore(20)

    async def one(session: str) -> None:
        async with gate:
            await step(session)  # type: ignore[operator]

    began = time.perf_counter()
    await asyncio.gather(*(one(s) for s in sessions))
    return time.perf_counter() - began


@pytest.mark.timeout(300)
async def test_a_session_leaves_an_edge_with_many_as_cheaply_as_it_came(
    edge: AmqpTransport, unique_id: str
) -> None:
    # aio-pika's own unbind went through every binding of the queue: with 1,000 sessions, taking
    # them all off cost four times what putting them on did, and it grows with the sessions
    # squared (2,000 callers hanging up at once stalled an edge past the broker wait)
    seen: Seen = []
    queue = await edge.open_edge_queue(f"eq-{unique_id}", recorder(seen))
    sessions = [f"eq-{unique_id}-{i}" for i in range(MANY)]
    added = await timed(sessions, queue.add_session)
    removed = await timed(sessions, queue.remove_session)
    assert removed < 2.5 * added, (added, removed)
    await queue.cancel()


def close_connection(name: str) -> None:
    """The broker closes the connection named ``name`` (as a node restart would, from the client's
    side): a robust connection reconnects and restores its queues, bindings and consumers."""
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "--no-table-headers", "pid", "client_properties"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    pids = [line.split("\t", 1)[0] for line in listed.stdout.splitlines() if f'"{name}"' in line]
    assert pids, f"no connection named {name}:\n{listed.stdout[-2000:]}"
    for pid in pids:
        subprocess.run(["rabbitmqctl", "-q", "close_connection", pid, "test"], timeout=60, check=True)


@pytest.mark.timeout(120)
async def test_after_a_reconnect_the_edge_hears_the_sessions_it_has_and_not_those_that_left(
    edge: AmqpTransport, rabbitmq_url: str, unique_id: str
) -> None:
    worker = await AmqpTransport.connect(rabbitmq_url, name=f"edge-queue-worker-{unique_id}")
    try:
        seen: Seen = []
        queue = await edge.open_edge_queue(f"eqr-{unique_id}", recorder(seen))
        stays, leaves = f"eqr-{unique_id}-stays", f"eqr-{unique_id}-leaves"
        for session in (stays, leaves):
            await queue.add_session(session)
        await queue.remove_session(leaves)
        await asyncio.to_thread(close_connection, f"edge-queue-test-{unique_id}")

        def arrived(envelope: Envelope) -> bool:
            return any(e.session == envelope.session and e.seq == envelope.seq for e, _ in seen)

        # the edge is back once what is sent to the session it kept arrives again
        seq = 0
        async with asyncio.timeout(T):
            while not arrived(chunk(stays, seq)):
                seq += 1
                await worker.publish(chunk(stays, seq), OUT)
                await asyncio.sleep(0.2)
        await worker.publish(chunk(leaves, 0), OUT)
        await worker.publish(chunk(stays, seq + 1), OUT)  # after the other, on the same queue
        await until(lambda: arrived(chunk(stays, seq + 1)))
        assert not any(e.session == leaves for e, _ in seen), seen
        await queue.cancel()
    finally:
        await worker.close()
