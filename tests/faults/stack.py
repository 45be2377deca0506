"""The whole product, as an operator runs it, on brokers of its own: the fault tests' stage.

``FaultStack`` starts a private RabbitMQ node and Redis (``bargein/tools/private_brokers.py``),
then the services as processes against them (``python -m services.<name>``, product defaults
unless a test says otherwise), and hands the test the edge's URL and the processes, to kill,
pause, stop or restart.
The agent is the integration tests' ``by_option`` (the probe agent: it echoes the caller's words,
then ``tail`` more, one every ``word_delay`` seconds, and reports to Redis what happens inside its
process).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bargein.settings import BrokerSettings
from bargein.tools.private_brokers import (
    PrivateRabbit,
    PrivateRabbitCluster,
    PrivateRedis,
    PrivateSentinelRedis,
    free_port,
)
from bargein.wire.names import partition_headers
from tests.integration.cluster import Cluster, ServiceProcess

WORKER_READY = "ready (up to"
EDGE_READY = "edge ready on"
READY_TIMEOUT_S = 30.0
QUEUES_OF_BARGEIN = r"^bargein\."  # what the documented replication policy applies to


def product_env(rabbitmq_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    """The environment of a service process: the product's defaults, the test agent, scripted LLM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BARGEIN_")}
    env.update(
        BARGEIN_RABBITMQ_URL=rabbitmq_url,
        BARGEIN_REDIS_URL=redis_url,
        BARGEIN_AGENT="tests.integration.agents:by_option",
        BARGEIN_STATUS_INTERVAL_S="5",
        BARGEIN_LOG_FORMAT="text",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass
class FaultStack:
    rabbit: PrivateRabbit  # the node every process connects to first
    redis: PrivateRedis | PrivateSentinelRedis
    cluster: Cluster
    url: str = ""  # the edge's base URL
    edges: list[ServiceProcess] = field(default_factory=list)
    rabbits: PrivateRabbitCluster | None = None  # all of RabbitMQ, when it is a cluster

    def role(self, name: str) -> list[ServiceProcess]:
        """The live processes of one service (``reasoning``, ``speech``, ``broadcast``)."""
        return [p for p in self.cluster.processes if p.name.startswith(f"{name}-") and p.alive()]

    def start(self, service: str) -> ServiceProcess:
        ready = EDGE_READY if service == "broadcast" else WORKER_READY
        process = self.cluster.start(f"services.{service}", ready)
        if service == "broadcast":
            match = re.search(r"edge ready on (http://\S+)", process.log())
            assert match, process.log()
            self.url = match.group(1)
            self.edges.append(process)
        return process

    def pause(self, process: ServiceProcess) -> None:
        process.proc.send_signal(signal.SIGSTOP)

    def resume(self, process: ServiceProcess) -> None:
        process.proc.send_signal(signal.SIGCONT)

    def ready(self) -> tuple[int, dict[str, object]]:
        response = httpx.get(f"{self.url}/readyz", timeout=5)
        return response.status_code, response.json()

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if self.ready()[0] == 200:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"the edge was not ready after {timeout:.0f} s:\n{self.cluster.logs()}")

    def logs(self) -> str:
        return self.cluster.logs()

    def in_headers(self, session: str) -> dict[str, str] | None:
        """What routes a message for ``session`` to its partition, as the stack's services hash it
        (none with a mailbox per session): what a peer of the deployment adds, broken or not."""
        defaults = BrokerSettings.model_fields
        env = self.cluster.env
        if env.get("BARGEIN_MAILBOXES", defaults["mailboxes"].default) != "partitioned":
            return None
        return partition_headers(session, int(env.get("BARGEIN_PARTITIONS", defaults["partitions"].default)))

    def broker_state(self) -> str:
        """What a failure needs beside the logs: who consumes what and what waits unconfirmed on
        a live node, and the edge's transport counters."""
        nodes = self.rabbits.running() if self.rabbits is not None else [self.rabbit]
        out = []
        for args in (
            ("list_consumers", "queue_name", "channel_pid", "active", "activity_status"),
            ("list_channels", "pid", "connection", "consumer_count", "messages_unconfirmed"),
        ):
            done = nodes[0]._ctl(*args, check=False, timeout=30) if nodes else None
            out.append(f"== {' '.join(args)}\n{done.stdout.decode(errors='replace') if done else ''}")
        with contextlib.suppress(httpx.HTTPError):
            metrics = httpx.get(f"{self.url}/metrics", timeout=5).text.splitlines()
            out.append(
                "== the edge's transport\n" + "\n".join(m for m in metrics if 'service="rabbitmq"' in m)
            )
        return "\n".join(out)

    @contextlib.contextmanager
    def shown_on_failure(self) -> Iterator[None]:
        """Print :meth:`broker_state` and the logs should the block fail (pytest shows them)."""
        try:
            yield
        except BaseException:
            print(self.broker_state(), "\n", self.logs(), sep="")
            raise


@contextlib.contextmanager
def fault_stack(
    base: Path,
    *,
    reasoning: int = 2,
    speech: int = 1,
    aof: bool = False,
    sentinel: bool = False,
    rabbit_nodes: int = 1,
    rabbit_policy: str | None = None,
    **env: str,
) -> Iterator[FaultStack]:
    """Private brokers, then ``reasoning`` reasoning processes, ``speech`` speech processes and one
    edge; everything is stopped at the end, whatever happened. With ``sentinel`` Redis is a
    master, a replica and a Sentinel, and the services find the master through the Sentinel.
    With ``rabbit_nodes`` > 1 RabbitMQ is a cluster of that many nodes, every one of them in
    ``BARGEIN_RABBITMQ_URL``, and ``rabbit_policy`` (a policy definition, JSON) applies to every
    queue of bargein's, as an operator sets it (docs/operations.md)."""
    private_redis = (
        PrivateSentinelRedis(base / "redis") if sentinel else PrivateRedis(base / "redis", aof=aof)
    )
    rabbits = PrivateRabbitCluster(base / "rabbitmq", rabbit_nodes) if rabbit_nodes > 1 else None
    private_rabbit = rabbits if rabbits is not None else PrivateRabbit(base / "rabbitmq")
    with private_rabbit, private_redis as redis:
        rabbit = rabbits.nodes[0] if rabbits is not None else private_rabbit
        assert isinstance(rabbit, PrivateRabbit)
        if rabbit_policy is not None:
            rabbit.set_policy("bargein-replicated", QUEUES_OF_BARGEIN, rabbit_policy)
        environment = product_env(private_rabbit.url, redis.url, BARGEIN_HOST="127.0.0.1", **env)
        environment.setdefault("BARGEIN_PORT", str(free_port()))
        with Cluster(environment, base / "logs") as cluster:
            (base / "logs").mkdir(exist_ok=True)
            stack = FaultStack(rabbit, redis, cluster, rabbits=rabbits)
            for _ in range(reasoning):
                stack.start("reasoning")
            for _ in range(speech):
                stack.start("speech")
            stack.start("broadcast")
            stack.wait_ready()
            yield stack
