"""What every ``bargein bench`` shares: child processes run and stopped in order, percentiles, and
the one error a bench raises when it cannot run or measure (a missed target is a result, not an
error)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import os
import re
import signal
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any, TextIO, TypeVar

import aio_pika
from aio_pika.abc import AbstractRobustConnection

from bargein.errors import BargeinError
from bargein.hosting.sessions import forget_session
from bargein.settings import BrokerSettings, broker_addresses, load
from bargein.tools.llm_server import READY as LLM_SERVER_READY
from bargein.transport.amqp import AmqpTransport
from bargein.transport.redis_address import async_client
from bargein.transport.redis_store import RedisStateStore
from bargein.wire.names import (
    PARTITIONED_TIERS,
    TIER_REASONING,
    TIER_SPEECH,
    lease_key,
    partition_count_key,
    partition_kinds,
    partition_lease,
    partition_queue,
    partitions_exchange,
    session_work_queue,
)

T = TypeVar("T")

WORKER_READY = "ready (up to"  # bargein.hosting.worker logs it once it consumes session starts
EDGE_READY = re.compile(r"edge ready on (http://[^\s\"']+)")
START_TIMEOUT_S = 60.0  # a child process must be ready within this (imports are slow on a busy box)
STOP_TIMEOUT_S = 15.0  # SIGTERM → SIGKILL


class BenchError(BargeinError):
    """The bench could not run or measure (a missed target is not an error)."""


def say(out: TextIO, text: str) -> None:
    print(text, file=out, flush=True)


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of already sorted values, interpolating linearly between
    neighbours (numpy's default); NaN for no values."""
    if not sorted_values:
        return math.nan
    position = (len(sorted_values) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def summarize(seconds: list[float]) -> dict[str, Any]:
    """count, p50, p99 and max in milliseconds."""
    ms = sorted(value * 1000 for value in seconds)
    return {
        "count": len(ms),
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "max_ms": ms[-1] if ms else math.nan,
    }


# --- child processes --------------------------------------------------------------------------------


class Child:
    """A child process whose output is read continuously (a full pipe would stall it), kept as a
    short tail for error messages and whole in ``log`` (a bench's odd number is explained by what
    the services said at the time: a turn that waited, a burst that was held)."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, ready_marker: str, log: Path) -> None:
        self.name = name
        self.proc = proc
        self.ready = asyncio.Event()
        self.tail: collections.deque[str] = collections.deque(maxlen=15)
        self._marker = ready_marker
        self.url = ""  # an edge's, once it said where it listens
        self.log = log
        self.reader = asyncio.create_task(self._read(), name=f"bench-read:{name}")

    async def _read(self) -> None:
        stream = self.proc.stdout
        if stream is None:
            return
        with self.log.open("a", encoding="utf-8") as log:
            while True:
                try:
                    line = await stream.readline()
                except ValueError:  # a line longer than the stream's limit: take it in pieces
                    line = await stream.read(64 * 1024)
                if not line:
                    return
                text = line.decode(errors="replace").rstrip()
                log.write(text + "\n")
                self.tail.append(text)
                if self._marker in text:
                    self.ready.set()

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    def last_output(self) -> str:
        return "\n".join(f"    {line}" for line in self.tail) or "    (no output)"


class Processes:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.children: list[Child] = []
        self._logs: Path | None = None  # where the children's output is kept, made with the first

    def _log_for(self, name: str, pid: int) -> Path:
        if self._logs is None:
            self._logs = Path(tempfile.mkdtemp(prefix="bargein-bench-logs-"))
        return self._logs / f"{name.replace(' ', '-')}-{pid}.log"

    async def start(self, name: str, args: list[str], env: dict[str, str], ready_marker: str) -> Child:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE,  # the raw-hop consumer exits when it closes
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C reaches only the bench, which stops them in order
        )
        child = Child(name, proc, ready_marker, self._log_for(name, proc.pid))
        self.children.append(child)
        say(self.out, f"  started {name} (pid {proc.pid}, its output in {child.log})")
        return child

    async def wait_ready(self, child: Child, timeout: float = START_TIMEOUT_S) -> None:
        ready = asyncio.ensure_future(child.ready.wait())
        exited = asyncio.ensure_future(child.proc.wait())
        try:
            await asyncio.wait({ready, exited}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            exited.cancel()
        if child.ready.is_set():
            return
        if not child.running:
            await asyncio.wait({child.reader}, timeout=1.0)  # the rest of its output
            raise BenchError(
                f"{child.name} exited with code {child.proc.returncode} before it was ready:\n"
                f"{child.last_output()}"
            )
        raise BenchError(f"{child.name} was not ready after {timeout:.0f} s:\n{child.last_output()}")

    def check(self) -> None:
        """Fail at once if a child died, rather than wait for samples that will never come."""
        for child in self.children:
            if not child.running:
                raise BenchError(
                    f"{child.name} exited with code {child.proc.returncode} during the run:\n"
                    f"{child.last_output()}"
                )

    async def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every child (the workers drain), SIGKILL whatever is left after ``timeout``."""
        running = [child for child in self.children if child.running]
        try:
            for child in running:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
                if child.proc.stdin is not None:
                    child.proc.stdin.close()
            if running:
                await asyncio.wait({asyncio.ensure_future(c.proc.wait()) for c in running}, timeout=timeout)
            for child in running:
                if child.running:
                    say(self.out, f"  {child.name} did not stop within {timeout:.0f} s: killing it")
                    with contextlib.suppress(ProcessLookupError):
                        child.proc.kill()
                    await asyncio.wait_for(child.proc.wait(), timeout)
        finally:  # even if the waiting above was interrupted: never leave a child behind
            for child in self.children:
                if child.running:
                    with contextlib.suppress(ProcessLookupError):
                        child.proc.kill()
                child.reader.cancel()
        if running:
            codes = ", ".join(f"{c.name} {c.proc.returncode}" for c in running)
            say(self.out, f"  stopped {len(running)} processes (exit codes: {codes})")


def stalled(processes: Processes, what: str) -> BenchError:
    """A step of a bench that did not finish in time, with what each of its services said last."""
    tails = "\n".join(f"  {c.name}:\n{c.last_output()}" for c in processes.children)
    return BenchError(f"{what}; the services said:\n{tails}")


async def all_or_stalled(processes: Processes, steps: Iterable[Awaitable[T]], what: str) -> list[T]:
    """Every step's result, run at once (a bench's callers); a step's TimeoutError is the bench
    stalling: :func:`stalled` naming ``what``."""
    try:
        return await asyncio.gather(*steps)
    except TimeoutError:
        raise stalled(processes, what) from None


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user and system) process ``pid`` has used so far, from Linux's ``/proc``
    (the field numbers are proc(5)'s); None where there is no such file."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of(pids: Iterable[int]) -> float | None:
    """The CPU time a group of processes (a cluster's nodes) has used so far; None if any of them
    cannot be read, or there are none."""
    figures = [cpu_seconds(pid) for pid in pids]
    if not figures or None in figures:
        return None
    return sum(figure for figure in figures if figure is not None)


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def run_main(bench: Callable[[], Coroutine[Any, Any, object]], name: str) -> int:
    """Run one bench as a command: 0 once it reported (targets met or not), 1 if it could not run,
    130 on Ctrl-C (after cleaning up)."""
    try:
        import uvloop

        uvloop.install()  # as the services do
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio works too
        pass
    try:
        asyncio.run(bench())
    except BenchError as exc:
        print(f"bargein bench {name}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"bargein bench {name}: interrupted (cleaned up)", file=sys.stderr)
        return 130
    return 0


def service_env(rabbitmq_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    """The environment of a service process a bench starts: this one's, pointed at the bench's
    broker and Redis, logging at INFO (the ready lines are)."""
    env = dict(os.environ)
    env.update(
        BARGEIN_RABBITMQ_URL=rabbitmq_url,
        BARGEIN_REDIS_URL=redis_url,
        BARGEIN_LOG_LEVEL="INFO",
        BARGEIN_LOG_FORMAT="text",  # the bench reads them, and shows them when a service fails
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


SCRIPTED_AGENT = "bargein.examples.default:agent"


def scripted_stack_env(rabbitmq_url: str, redis_url: str, **extra: str) -> dict[str, str]:
    """The environment of a stack a bench starts of its own: the default agent on its scripted
    model (its replies are known), an edge on a free loopback port, status lines seldom, and no
    adoption of sessions other runs may have left behind."""
    env = service_env(
        rabbitmq_url,
        redis_url,
        BARGEIN_AGENT=SCRIPTED_AGENT,
        BARGEIN_HOST="127.0.0.1",
        BARGEIN_PORT=str(free_port()),
        BARGEIN_STATUS_INTERVAL_S="30",
        BARGEIN_ADOPT_INTERVAL_S="3600",
        **extra,
    )
    env.pop("BARGEIN_LLM_BASE_URL", None)
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def start_service(processes: Processes, service: str, name: str, env: dict[str, str]) -> Child:
    """``bargein <service>`` as a child, once it is ready (an edge's URL is in ``child.url``)."""
    marker = "edge ready on" if service == "broadcast" else WORKER_READY
    child = await processes.start(name, [sys.executable, "-m", "bargein", service], env, marker)
    await processes.wait_ready(child)
    if service == "broadcast":
        match = next((m for line in child.tail if (m := EDGE_READY.search(line))), None)
        if match is None:
            raise BenchError(f"{name} did not say where it listens:\n{child.last_output()}")
        child.url = match.group(1)
    return child


async def start_llm_server(processes: Processes) -> tuple[Child, str]:
    """An OpenAI-compatible server answering as the scripted model does
    (:mod:`bargein.tools.llm_server`), as a child: the stack's ``BARGEIN_LLM_BASE_URL``."""
    port = free_port()
    args = [sys.executable, "-m", "bargein.tools.llm_server", "--port", str(port)]
    child = await processes.start("llm", args, dict(os.environ), LLM_SERVER_READY)
    await processes.wait_ready(child)
    return child, f"http://127.0.0.1:{port}/v1"


async def check_work_queue(connection: AbstractRobustConnection, expected_consumers: int) -> int:
    """Refuse to run beside reasoning workers that are not the bench's: they would take some of
    its sessions (and run their own agent on them). Returns how many session starts wait."""
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(
            session_work_queue(TIER_REASONING), durable=True, arguments={"x-queue-type": "classic"}
        )
        consumers = queue.declaration_result.consumer_count or 0
        waiting = queue.declaration_result.message_count or 0
    finally:
        await channel.close()
    if consumers > expected_consumers:
        raise BenchError(
            f"{consumers - expected_consumers} other consumer(s) on {queue.name}: reasoning workers "
            "that are not the bench's would take some of its sessions. Stop them, or point the "
            "bench at a broker of its own (BARGEIN_RABBITMQ_URL)."
        )
    return waiting


async def delete_partitions(rabbitmq_url: str, partitions: int) -> None:
    """Remove the partitioned tiers' queues and exchanges (durable: they outlive the stack that
    declared them), with whatever waits in them."""
    connection = await aio_pika.connect(broker_addresses(rabbitmq_url)[0])
    async with connection:
        channel = await connection.channel()
        for tier in PARTITIONED_TIERS:
            for kind in partition_kinds(tier):
                for partition in range(partitions):
                    await channel.queue_delete(partition_queue(tier, partition, kind))
                await channel.exchange_delete(partitions_exchange(tier, kind))


async def forget_partitions(rabbitmq_url: str, redis_url: str, partitions: int | None = None) -> None:
    """:func:`delete_partitions`, and Redis's record of them (their count, their leases): how a
    bench or a test stack leaves the shared broker and Redis. Without ``partitions``, as many as
    Redis records a tier ran with, or the settings name, whichever is more (partitioned mailboxes
    are the default: every stack on the shared broker leaves some)."""
    client = async_client(redis_url, pool_size=2, timeout_s=5.0)
    try:
        if partitions is None:
            recorded = [int(await client.get(partition_count_key(tier)) or 0) for tier in PARTITIONED_TIERS]
            partitions = max(*recorded, load(BrokerSettings).partitions)
        await delete_partitions(rabbitmq_url, partitions)
        for tier in PARTITIONED_TIERS:
            await client.delete(partition_count_key(tier))
            await client.delete(*(lease_key(tier, partition_lease(p)) for p in range(partitions)))
    finally:
        await client.aclose()


async def forget_sessions(rabbitmq_url: str, redis_url: str, session_ids: list[str], out: TextIO) -> int:
    """Forget, on every tier, the bench's sessions that are still registered (a session whose
    hang-up had not been handled when the services stopped): left in the directory, they would be
    adopted by the next run's workers, or by the test suite's. Returns how many there were."""
    if not session_ids:
        return 0
    store = RedisStateStore.from_url(redis_url)
    transport = await AmqpTransport.connect(rabbitmq_url, partitions=load(BrokerSettings).partition_count)
    left = 0
    try:
        for tier in (TIER_REASONING, TIER_SPEECH):
            for session_id in session_ids:
                if await store.session_info(tier, session_id) is not None:
                    left += 1
                    await forget_session(transport, store, session_id, tier=tier)
        for session_id in session_ids:  # or the next edge ends them as calls its callers left
            await store.forget_callers(session_id)
    finally:
        await transport.close()
        await store.close()
    if left:
        say(out, f"  forgot {left} session records the services had not ended")
    return left
