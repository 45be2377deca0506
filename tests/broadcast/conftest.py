"""The real stack the client tests talk to: ``python -m services.broadcast`` (the edge) with a
reasoning process and a speech process, over real RabbitMQ and Redis (found, skipped or failed as
``tests/services.py`` says: under ``CI=true`` a missing broker fails the run).

One stack serves each test module (module scope, so two stacks never run at once: the workers
of every stack compete for the same shared session queues, and a session taken by another
stack's worker would run that stack's agent); every test opens its own sessions on it. The agent
is the default one with the scripted LLM slowed to a few words a second, so an answer lasts long
enough to be talked over.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from bargein.tools.benchkit import free_port
from tests.integration.cluster import REPO, Cluster, cluster_env, reset_shared_queues

__all__ = ["Stack", "stack"]

EDGE_READY = "edge ready"  # the broadcast service logs it once it listens
WORKER_READY = "ready (up to"  # bargein.hosting.worker logs it once it takes session starts
READY_TIMEOUT_S = 30.0
FIXTURES = REPO / "tests" / "fixtures" / "audio"
AGENT_WORDS_PER_S = 8  # a default reply (30-40 words) lasts about 4 s: time enough to barge in


@dataclass
class Stack:
    url: str  # the edge's base URL, http://127.0.0.1:PORT
    cluster: Cluster

    def logs(self) -> str:
        return self.cluster.logs()


def wait_ready(url: str, cluster: Cluster, timeout: float = READY_TIMEOUT_S) -> None:
    """Poll ``GET /readyz`` until it answers 200 (the edge's brokers answer and it consumes)."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            response = httpx.get(f"{url}/readyz", timeout=2.0)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.1)
    raise RuntimeError(f"the edge at {url} was not ready after {timeout:.0f} s ({last}):\n{cluster.logs()}")


@pytest.fixture(scope="module")
def stack(rabbitmq_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    reset_shared_queues(rabbitmq_url, redis_url)
    port = free_port()
    env = cluster_env(
        rabbitmq_url,
        redis_url,
        BARGEIN_AGENT="bargein.examples.default:agent",
        BARGEIN_SCRIPTED_FIRST_TOKEN_MS="100",
        BARGEIN_SCRIPTED_TOKENS_PER_S=str(AGENT_WORDS_PER_S),
        BARGEIN_HOST="127.0.0.1",
        BARGEIN_PORT=str(port),
    )
    log_dir: Path = tmp_path_factory.mktemp("edge-stack")
    cluster = Cluster(env, log_dir)
    url = f"http://127.0.0.1:{port}"
    try:
        cluster.start("services.reasoning", WORKER_READY)
        cluster.start("services.speech", WORKER_READY)
        cluster.start("services.broadcast", EDGE_READY)
        wait_ready(url, cluster)
        yield Stack(url, cluster)
    finally:
        cluster.stop_all()
