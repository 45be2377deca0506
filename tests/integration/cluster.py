"""Real reasoning processes for the integration tests: start, find, kill, stop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import redis

from bargein.tools import benchkit
from bargein.tools.benchkit import EDGE_READY
from bargein.wire.names import (
    DEAD_QUEUE,
    TIER_REASONING,
    TIER_SPEECH,
    session_directory_key,
    session_work_queue,
)

REPO = Path(__file__).resolve().parents[2]


@dataclass
class ServiceProcess:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """kill -9: no drain, no checkpoint, no lease release."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM: the service drains and exits by itself."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout)
        return self.proc.returncode


@dataclass
class Cluster:
    env: dict[str, str]
    log_dir: Path
    processes: list[ServiceProcess] = field(default_factory=list)
    _count: int = 0

    def start(self, module: str = "services.reasoning", ready: str = "ready (up to") -> ServiceProcess:
        self._count += 1
        name = f"{module.rsplit('.', 1)[-1]}-{self._count}"
        log_path = self.log_dir / f"{name}.log"
        out = log_path.open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", module], cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT
        )
        service = ServiceProcess(name, proc, log_path)
        self.processes.append(service)
        deadline = time.monotonic() + 30
        while ready not in service.log():
            if not service.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start:\n{service.log()[-3000:]}")
            time.sleep(0.05)
        return service

    def start_edge(self) -> str:
        """``services.broadcast``, once it listens: its base URL (it logs where)."""
        edge = self.start("services.broadcast", ready="edge ready on")
        match = EDGE_READY.search(edge.log())
        assert match, edge.log()[-2000:]
        return match.group(1)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        """Whatever happened (a process that would not start, a failed test), nothing is left running."""
        self.stop_all()

    def by_pid(self, pid: int) -> ServiceProcess:
        return next(p for p in self.processes if p.pid == pid)

    def stop_all(self) -> None:
        for p in self.processes:
            if p.alive():
                p.proc.send_signal(signal.SIGTERM)
        for p in self.processes:
            try:
                p.proc.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()

    def logs(self) -> str:
        return "\n".join(f"----- {p.name} (pid {p.pid}) -----\n{p.log()[-4000:]}" for p in self.processes)


def cluster_env(rabbitmq_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        BARGEIN_RABBITMQ_URL=rabbitmq_url,
        BARGEIN_REDIS_URL=redis_url,
        BARGEIN_AGENT="tests.integration.agents:by_option",
        BARGEIN_LEASE_TTL_MS="1500",
        BARGEIN_ADOPT_INTERVAL_S="0.3",
        BARGEIN_STATUS_INTERVAL_S="5",
        BARGEIN_LOG_FORMAT="text",  # read by the tests, and by people when one fails
        BARGEIN_MAX_MESSAGE_BYTES="65536",
        BARGEIN_DRAIN_TIMEOUT_S="0",  # hand running turns over at once: the tests check the resume
        BARGEIN_SCRIPTED_FIRST_TOKEN_MS="5",
        BARGEIN_SCRIPTED_TOKENS_PER_S="100",
        PYTHONUNBUFFERED="1",
    )
    env.pop("BARGEIN_LLM_BASE_URL", None)
    env.update(extra)
    return env


def reset_shared_queues(rabbitmq_url: str, redis_url: str) -> None:
    """Start from empty session queues and directories, and an empty dead-letter queue: sessions left
    over by earlier runs would otherwise be adopted by this stack's workers. And with no partitions,
    nor Redis's leases and count of them: what an earlier stack left in them is not this one's,
    and its leases would keep this stack's workers waiting for them to lapse."""
    asyncio.run(benchkit.forget_partitions(rabbitmq_url, redis_url))
    tiers = (TIER_REASONING, TIER_SPEECH)
    client = redis.Redis.from_url(redis_url)
    client.delete(*(session_directory_key(tier) for tier in tiers))
    client.close()

    async def purge() -> None:
        connection = await aio_pika.connect(rabbitmq_url)
        async with connection:
            for name in (*(session_work_queue(tier) for tier in tiers), DEAD_QUEUE):
                # a channel per queue: a failed passive declare (no such queue yet) closes its channel
                channel = await connection.channel()
                with contextlib.suppress(Exception):
                    queue = await channel.declare_queue(name, passive=True)
                    await queue.purge()

    asyncio.run(purge())
