"""What replication costs the broker: memory per idle session and sessions created a second, on one
RabbitMQ node and on a mirrored 3-node cluster (the numbers in docs/operations.md, "A RabbitMQ
cluster", and in docs/architecture.md's cell design).

``.venv/bin/python scripts/cluster_memory.py [--sessions 300]`` starts the fault tests' private
brokers and services twice (``tests/faults/stack.py``: one node, then three nodes with the
replication policy), creates the sessions through the edge, as a caller's ``POST /v1/sessions``
does (no caller joins; the reconnect grace is set long enough that none ends meanwhile), and
reads each node's memory from ``rabbitmqctl status`` before and after. It needs the programs the
fault tests need (rabbitmq-server, redis-server) and takes a minute or two. ``bargein bench scale``
(issue 27) is to replace it with the whole measurement at 1,000 and 10,000 sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' stack, from a checkout

from bargein.tools.bench_sessions import rabbitmq_bytes
from tests.faults.brokers import PrivateRabbit
from tests.faults.stack import fault_stack
from tests.faults.test_cluster import REPLICATED

SETTLE_S = 5.0  # for the broker's memory to settle before and after


def node_memory(node: PrivateRabbit) -> int:
    memory = rabbitmq_bytes(node.node)
    if memory is None:
        raise RuntimeError(f"rabbitmqctl could not tell the memory of {node.node}")
    return memory


async def create_sessions(edge: str, count: int, concurrency: int = 20) -> float:
    """Seconds to create ``count`` sessions, ``concurrency`` at a time."""
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60) as client:

        async def one() -> None:
            async with gate:
                response = await client.post(f"{edge}/v1/sessions", json={})
                response.raise_for_status()

        started = time.monotonic()
        await asyncio.gather(*(one() for _ in range(count)))
        return time.monotonic() - started


def measure(count: int, *, cluster: bool) -> str:
    with fault_stack(
        Path(tempfile.mkdtemp(prefix="bargein-cluster-memory-")),
        reasoning=2,
        speech=1,
        BARGEIN_AGENT="bargein.examples.default:agent",
        rabbit_nodes=3 if cluster else 1,
        rabbit_policy=REPLICATED if cluster else None,
        BARGEIN_RECONNECT_GRACE_S="3600",
    ) as stack:
        nodes = stack.rabbits.nodes if stack.rabbits is not None else [stack.rabbit]
        time.sleep(SETTLE_S)
        before = [node_memory(node) for node in nodes]
        took = asyncio.run(create_sessions(stack.url, count))
        time.sleep(SETTLE_S)
        after = [node_memory(node) for node in nodes]
    per_node = [(now - then) / count / 1024 for now, then in zip(after, before, strict=True)]
    what = "3 nodes, mirrored" if cluster else "1 node"
    shown = ", ".join(f"{kb:.0f}" for kb in per_node)
    return (
        f"{what}: {count / took:.1f} sessions created a second; broker memory per idle session "
        f"{sum(per_node):.0f} KB (by node: {shown} KB)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=300, help="sessions to create (default 300)")
    args = parser.parse_args()
    for cluster in (False, True):
        print(measure(args.sessions, cluster=cluster), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
