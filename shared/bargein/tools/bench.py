"""``bargein bench interrupt``: how long an interrupt takes to reach a streaming generation.

With N sessions streaming, the bench measures the time from publishing ``UserStartedSpeaking`` to the
generation's ``CancelledError`` in the reasoning process, and prints its p50/p99 beside a raw
aio-pika publish → consume hop measured in the same run, on the same broker and machine. The
project's targets are ratios against that baseline (p50 within 1.5x, p99 within 2x at 200 streaming
sessions), because absolute milliseconds depend on the machine and on whatever else it is doing;
a ratio measured in one run does not. Missing a target is a result, not an error: the bench reports
it and exits 0.

What runs, all real:

* ``workers`` reasoning processes (``bargein reasoning``) running
  :func:`bargein.tools.bench_agents.agent`, whose generations stream a few words every ``chunk_period_s``
  until they are interrupted, and which report each interrupt's latency to a Redis list;
* one raw-hop consumer (``python -m bargein.tools.bench_agents RUN_ID``), a bare aio-pika consumer that
  reports each raw message's latency to another Redis list;
* this process, which creates the sessions, plays their caller (one :class:`~bargein.testing.caller.Caller`
  each, used only to publish) and their client edge (a bare consumer per edge mailbox that only
  counts chunks, to keep the bench's own CPU use small), and interleaves interrupts and raw
  messages, one of each per ``sample_interval_s``. After each interrupt it starts a new turn on
  that session, so the number of streaming sessions stays at N for the whole run.

Then the busy baseline, which the issue that set the targets asked for (the idle raw hop compares an
interrupt's persistent, priority delivery to a busy worker with a transient one to an idle process,
so its ratio measures the broker's load as much as bargein): the bench ends its sessions, starts
``python -m bargein.tools.bench_agents RUN_ID --busy ...``, a raw aio-pika process that sends the
same chunk load the worker did (a message a chunk, each confirmed, to a queue the bench counts them
from) and takes the same delivery an interrupt gets (persistent, prefetch 1, acknowledged, from the
kind of queue the interrupt goes through: a partition's quorum queue by default, a session mailbox's
classic priority queue with ``BARGEIN_MAILBOXES=session``), and sends it ``samples`` such messages.
Its targets: p50 within 1.3x, p99 within 1.5x. Run after bargein's phase, so the two never share the
machine's cores.

Everything the bench creates is named with a run id and removed at the end, even on error or
Ctrl-C: the child processes are stopped (SIGTERM, then SIGKILL), sessions are ended and forgotten,
mailboxes and Redis lists deleted. Nothing shared is purged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import struct
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TextIO

import aio_pika
import redis.asyncio as aioredis
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection
from aiormq.exceptions import AMQPError
from redis.exceptions import RedisError

from bargein.agent.events import AgentResponse, EndCall, Event, UserStartedSpeaking, UserStoppedSpeaking
from bargein.hosting.sessions import create_session, forget_session
from bargein.settings import BrokerSettings, load
from bargein.testing.caller import Caller
from bargein.tools.benchkit import (
    WORKER_READY,
    BenchError,
    Child,
    Processes,
    check_work_queue,
    cpu_seconds,
    run_main,
    say,
    summarize,
    verdict,
)
from bargein.transport import amqp_address
from bargein.transport.abc import EdgeQueue
from bargein.transport.amqp import AmqpTransport
from bargein.transport.redis_address import async_client
from bargein.transport.redis_store import RedisStateStore
from bargein.wire.envelope import Envelope
from bargein.wire.names import (
    PRIORITY_CONTROL,
    TIER_REASONING,
    session_directory_key,
    session_work_queue,
)
from bargein.wire.session_info import SessionInfo

log = logging.getLogger("bargein.tools.bench")

# --- names the bench adds ---------------------------------------------------------------------------
# bargein.wire.names holds the product's names; these exist only while a bench runs. Each carries the run
# id, so concurrent runs never mix, and the bench removes them at the end (the Redis lists also
# expire by themselves, in case a run is killed before its clean-up).
BENCH_KEY_PREFIX = "bargein-bench"  # Redis lists: bargein-bench:{<run>}:interrupt and ...:raw
RAW_HOP_QUEUE_PREFIX = "bargein.bench.rawhop"  # RabbitMQ: bargein.bench.rawhop.<run>, exclusive
SAMPLES_TTL_S = 3600


def interrupt_samples_key(run_id: str) -> str:
    """Redis list: one "interrupt published → CancelledError" latency (seconds) per sample."""
    return f"{BENCH_KEY_PREFIX}:{{{run_id}}}:interrupt"


def raw_samples_key(run_id: str) -> str:
    """Redis list: one raw "publish → consume" latency (seconds) per sample."""
    return f"{BENCH_KEY_PREFIX}:{{{run_id}}}:raw"


def raw_hop_queue(run_id: str) -> str:
    """The raw-hop consumer's queue (default exchange, exclusive to the consumer's connection)."""
    return f"{RAW_HOP_QUEUE_PREFIX}.{run_id}"


def busy_samples_key(run_id: str) -> str:
    """Redis list: one "publish → consume" latency (seconds) of the busy raw baseline per sample."""
    return f"{BENCH_KEY_PREFIX}:{{{run_id}}}:busy"


def busy_hop_queue(run_id: str) -> str:
    """The busy raw consumer's mailbox: durable, of the interrupts' kind (:func:`busy_hop_arguments`;
    it goes at the end)."""
    return f"{RAW_HOP_QUEUE_PREFIX}.{run_id}.busy"


BUSY_EXPIRY_MS = 600_000  # the busy baseline's queue, if its process dies before deleting it
MailboxKind = Literal["quorum", "priority"]


def busy_hop_arguments(kind: MailboxKind) -> dict[str, Any]:
    """The busy baseline's queue: the kind an interrupt travels through, so that the two deliveries
    differ only in what takes them. ``quorum``: a partition's control lane (BARGEIN_MAILBOXES=
    partitioned, the default; replicated, one active consumer); ``priority``: a session's mailbox
    (BARGEIN_MAILBOXES=session; classic, with priorities). On RabbitMQ 3.10 a quorum queue delivers
    under this load about 0.8 ms later than a classic one (docs/architecture.md, "Keeping the
    interrupt path short"), so a baseline of the other kind measures the queue, not bargein."""
    if kind == "quorum":
        return {"x-queue-type": "quorum", "x-single-active-consumer": True, "x-expires": BUSY_EXPIRY_MS}
    return {"x-queue-type": "classic", "x-max-priority": PRIORITY_CONTROL, "x-expires": BUSY_EXPIRY_MS}


def busy_sink_queue(run_id: str) -> str:
    """Where the busy raw consumer sends its chunks: the bench's (exclusive to its connection), which
    counts them as its edge counts a worker's."""
    return f"{RAW_HOP_QUEUE_PREFIX}.{run_id}.sink"


# Session options the bench agent reads.
OPT_RUN = "bench_run"
OPT_CHUNK_PERIOD_S = "chunk_period_s"
OPT_WORDS_PER_CHUNK = "words_per_chunk"
DEFAULT_CHUNK_PERIOD_S = 0.1
DEFAULT_WORDS_PER_CHUNK = 8
# p99 of 200 samples is the second slowest, of 1,000 the tenth: runs agreed within 0.1x only then
DEFAULT_SAMPLES = 1_000

RAW_HOP_BODY = struct.Struct("!d")  # the raw message: the sender's time.time()
RAW_HOP_READY = "bench raw-hop consumer ready"
BENCH_AGENT = "bargein.tools.bench_agents:agent"

P50_TARGET = 1.5
P99_TARGET = 2.0
BUSY_P50_TARGET = 1.3  # against the busy raw baseline: the same delivery to an equally busy process
BUSY_P99_TARGET = 1.5
MAILBOX_DELIVERY: dict[MailboxKind, str] = {  # what the busy baseline's messages go through, said
    "quorum": "persistent, to a quorum queue as a partition's control lane",
    "priority": "persistent, priority, to a classic priority queue as a session's mailbox",
}
WORKER_RATE_TARGET = 5_000  # chunks/s one reasoning worker (one process: one core) carries

RESULTS_TIMEOUT_S = 15.0  # how long to wait for the last samples to be reported
END_TIMEOUT_S = 10.0  # how long the workers get to forget the ended sessions
PROGRESS_EVERY_S = 2.0


def _ratio(slow: dict[str, Any], fast: dict[str, Any], percentile: str) -> float:
    return float(slow[percentile] / fast[percentile]) if fast[percentile] > 0 else math.inf


def _ratio_line(percentile: str, ratio: float, target: float) -> str:
    return f"ratio {percentile}  {ratio:5.2f}x  (target <= {target:g}x)  {verdict(ratio <= target)}"


# --- the client edge --------------------------------------------------------------------------------


class _Session:
    __slots__ = ("caller", "chunks", "sampled_turn", "sid", "turn")

    def __init__(self, sid: str, caller: Caller) -> None:
        self.sid = sid
        self.caller = caller
        self.chunks = 0
        self.turn = 0  # the newest turn a chunk arrived from
        self.sampled_turn = 0  # the turn the last interrupt was aimed at


class _Edge:
    """The sessions' client edge, as cheap as it can be: one queue for all of them, as a broadcast
    process has (:meth:`~bargein.transport.abc.Transport.open_edge_queue`), whose handler only
    counts chunks, so the bench's own CPU stays small. Being the edge of the transport the callers
    publish on, it is where the worker sends these sessions' output, bundled as to any edge.

    A session is *ready* to be sampled while it streams a turn no interrupt was aimed at yet.
    """

    def __init__(self) -> None:
        self.sessions: dict[str, _Session] = {}
        self.ready: set[str] = set()
        self.chunks = 0
        self.streaming = 0  # sessions that have received at least one chunk

    async def on_event(self, envelope: Envelope, event: Event) -> None:
        session = self.sessions.get(envelope.session)
        if session is None or not isinstance(event, AgentResponse):
            return
        self.chunks += 1
        if session.chunks == 0:
            self.streaming += 1
        session.chunks += 1
        if envelope.turn > session.turn:
            session.turn = envelope.turn
        if session.turn > session.sampled_turn:
            self.ready.add(session.sid)

    def take_ready(self) -> _Session | None:
        if not self.ready:
            return None
        sid = random.choice(tuple(self.ready))
        self.ready.discard(sid)
        session = self.sessions[sid]
        session.sampled_turn = session.turn
        return session


# --- the bench --------------------------------------------------------------------------------------


class _InterruptBench:
    def __init__(
        self,
        *,
        sessions: int,
        samples: int,
        workers: int,
        rabbitmq_url: str,
        redis_url: str,
        out: TextIO,
        chunk_period_s: float,
        words_per_chunk: int,
        sample_interval_s: float,
        warmup_s: float,
    ) -> None:
        self.n_sessions = sessions
        self.n_samples = samples
        self.n_workers = workers
        self.rabbitmq_url = rabbitmq_url
        self.redis_url = redis_url
        self.out = out
        self.chunk_period_s = chunk_period_s
        self.words_per_chunk = words_per_chunk
        self.sample_interval_s = sample_interval_s
        self.warmup_s = warmup_s
        self.run_id = uuid.uuid4().hex[:12]
        self.processes = Processes(out)
        self.edge = _Edge()
        self.transport: AmqpTransport | None = None
        self.store: RedisStateStore | None = None
        self.redis: aioredis.Redis | None = None
        self.edge_queue: EdgeQueue | None = None
        self.raw_connection: AbstractRobustConnection | None = None
        self.raw_channel: AbstractChannel | None = None
        self.workers: list[Child] = []
        self.worker_cores: float | None = None  # cores the workers used while sampling
        self.created: list[str] = []
        self.sent_interrupts = 0
        self.sent_raw = 0
        self.sent_busy = 0
        self.sessions_ended = False
        self.busy_cores: float | None = None  # cores the busy raw consumer used while sampled
        self.busy_chunks_per_s = 0.0  # and the chunks it sent meanwhile
        # the busy baseline's queue: the kind the interrupts travel through (busy_hop_arguments)
        self.partitions = load(BrokerSettings).partition_count
        self.mailbox: MailboxKind = "quorum" if self.partitions else "priority"

    def say(self, text: str) -> None:
        say(self.out, text)

    # --- set-up ----------------------------------------------------------------------------------

    def _env(self, leftover_starts: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            BARGEIN_LOG_FORMAT="text",
            BARGEIN_AGENT=BENCH_AGENT,
            BARGEIN_RABBITMQ_URL=self.rabbitmq_url,
            BARGEIN_REDIS_URL=self.redis_url,
            # Exactly enough room: a worker with no room hands a start back to the queue, so the
            # sessions still all find a place, and once they have, the bench's workers are full and
            # cannot take a session start that is not theirs (another client's, on a shared broker).
            # Starts already waiting in the queue are taken first, so they get room too.
            BARGEIN_MAX_SESSIONS=str(math.ceil((self.n_sessions + leftover_starts) / self.n_workers)),
            BARGEIN_STATUS_INTERVAL_S="30",
            # the bench's workers must not adopt sessions other runs or tests left in the directory
            BARGEIN_ADOPT_INTERVAL_S="3600",
            BARGEIN_LOG_LEVEL="INFO",  # the ready line is logged at INFO
            PYTHONUNBUFFERED="1",
        )
        return env

    async def _check_work_queue(self, expected_consumers: int) -> int:
        assert self.raw_connection is not None
        return await check_work_queue(self.raw_connection, expected_consumers)

    async def start_processes(self) -> None:
        self.say(f"starting {self.n_workers} reasoning worker(s) and the raw-hop consumer")
        leftover = await self._check_work_queue(expected_consumers=0)
        if leftover:
            self.say(
                f"  note: {leftover} session start(s) left by earlier runs wait in "
                f"{session_work_queue(TIER_REASONING)}; the bench's workers take them too (they stay idle)"
            )
        env = self._env(leftover)
        self.workers = [
            await self.processes.start(
                f"reasoning-{i + 1}", [sys.executable, "-m", "bargein", "reasoning"], env, WORKER_READY
            )
            for i in range(self.n_workers)
        ]
        started = list(self.workers)
        started.append(
            await self.processes.start(
                "raw-hop consumer",
                [sys.executable, "-m", "bargein.tools.bench_agents", self.run_id, "--exit-on-stdin-eof"],
                env,
                RAW_HOP_READY,
            )
        )
        for child in started:
            await self.processes.wait_ready(child)
        await self._check_work_queue(expected_consumers=self.n_workers)
        self.say("  all processes ready")

    async def connect(self) -> None:
        client = async_client(self.redis_url, pool_size=16, timeout_s=5.0)
        try:
            await client.ping()
        except (RedisError, OSError) as exc:
            await client.aclose()
            raise BenchError(f"Redis is not reachable ({type(exc).__name__}: {exc})") from exc
        self.redis = client
        self.store = RedisStateStore.from_url(self.redis_url)
        try:
            self.raw_connection = await amqp_address.connect_robust(
                self.rabbitmq_url, client_properties={"connection_name": f"bargein-bench-raw-{self.run_id}"}
            )
        except (AMQPError, OSError) as exc:
            raise BenchError(f"RabbitMQ is not reachable ({type(exc).__name__}: {exc})") from exc
        self.raw_channel = await self.raw_connection.channel()  # with publisher confirms, as interrupts
        self.transport = await AmqpTransport.connect(  # its mailboxes as the services': the settings'
            self.rabbitmq_url,
            name=f"bargein-bench-{self.run_id}",
            partitions=self.partitions,
        )
        self.edge_queue = await self.transport.open_edge_queue(f"bench-{self.run_id}", self.edge.on_event)

    async def create_sessions(self) -> None:
        assert self.transport is not None and self.store is not None and self.edge_queue is not None
        self.say(f"creating {self.n_sessions} sessions")
        options = {
            OPT_RUN: self.run_id,
            OPT_CHUNK_PERIOD_S: self.chunk_period_s,
            OPT_WORDS_PER_CHUNK: self.words_per_chunk,
        }
        for i in range(self.n_sessions):
            sid = f"bench-{self.run_id}-{i:05d}"
            info = SessionInfo(sid, dict(options), edge_reports_delivery=False)
            self.created.append(sid)
            session = _Session(sid, Caller(self.transport, sid, report_delivery=False))
            self.edge.sessions[sid] = session
            await self.edge_queue.add_session(sid)  # listen before the session starts
            await create_session(self.transport, self.store, info)
            await session.caller.emit(UserStoppedSpeaking())  # the first turn: streams until interrupted
            if (i + 1) % 50 == 0 or i + 1 == self.n_sessions:
                self.say(f"  {i + 1}/{self.n_sessions} sessions created")
                self.processes.check()

    async def wait_streaming(self) -> None:
        timeout = 30.0 + self.n_sessions * 0.1
        self.say(f"waiting for all {self.n_sessions} sessions to stream")
        started = time.monotonic()
        last_report = started
        while self.edge.streaming < self.n_sessions:
            self.processes.check()
            now = time.monotonic()
            if now - started > timeout:
                raise BenchError(
                    f"only {self.edge.streaming} of {self.n_sessions} sessions streamed "
                    f"within {timeout:.0f} s"
                )
            if now - last_report >= PROGRESS_EVERY_S:
                self.say(f"  {self.edge.streaming}/{self.n_sessions} streaming")
                last_report = now
            await asyncio.sleep(0.05)
        self.say(f"  all {self.n_sessions} streaming after {time.monotonic() - started:.1f} s")
        if self.warmup_s > 0:
            await asyncio.sleep(self.warmup_s)

    # --- sampling --------------------------------------------------------------------------------

    async def _ready_session(self, timeout: float = 30.0) -> _Session:
        deadline = time.monotonic() + timeout
        while (session := self.edge.take_ready()) is None:
            self.processes.check()
            if time.monotonic() > deadline:
                raise BenchError(f"no session was streaming a fresh turn for {timeout:.0f} s")
            await asyncio.sleep(0.005)
        return session

    async def _publish_raw(self) -> None:
        assert self.raw_channel is not None
        message = aio_pika.Message(RAW_HOP_BODY.pack(time.time()))
        await self.raw_channel.default_exchange.publish(message, routing_key=raw_hop_queue(self.run_id))
        self.sent_raw += 1

    def workers_cpu(self) -> float | None:
        """CPU seconds the reasoning workers have used so far (None if that cannot be read)."""
        used = [cpu_seconds(child.proc.pid) for child in self.workers]
        return None if None in used else sum(u for u in used if u is not None)

    async def sample(self) -> float:
        """Interleave interrupts and raw messages; return the edge's chunks/s meanwhile (and keep
        how much of a core the workers used meanwhile in ``worker_cores``)."""
        self.say(
            f"sampling: {self.n_samples} interrupts and {self.n_samples} raw hops, "
            f"one of each every {self.sample_interval_s * 1000:.0f} ms"
        )
        loop = asyncio.get_running_loop()
        every = max(1, self.n_samples // 10)
        chunks_before, started, cpu_before = self.edge.chunks, time.monotonic(), self.workers_cpu()
        tick = loop.time()
        for i in range(self.n_samples):
            tick += self.sample_interval_s
            session = await self._ready_session()
            await session.caller.emit(UserStartedSpeaking())  # Envelope.wrap stamps ts: the start
            self.sent_interrupts += 1
            await session.caller.emit(UserStoppedSpeaking())  # keep it streaming for later samples
            await asyncio.sleep(max(0.0, tick - self.sample_interval_s / 2 - loop.time()))
            await self._publish_raw()
            await asyncio.sleep(max(0.0, tick - loop.time()))
            if (i + 1) % every == 0 or i + 1 == self.n_samples:
                elapsed = time.monotonic() - started
                rate = (self.edge.chunks - chunks_before) / elapsed if elapsed > 0 else 0.0
                self.say(f"  {i + 1}/{self.n_samples} samples sent ({rate:.0f} chunks/s at the edge)")
                self.processes.check()
        elapsed, cpu_after = time.monotonic() - started, self.workers_cpu()
        if cpu_before is not None and cpu_after is not None and elapsed > 0:
            self.worker_cores = (cpu_after - cpu_before) / elapsed
        return (self.edge.chunks - chunks_before) / elapsed if elapsed > 0 else 0.0

    async def sample_busy(self) -> list[float]:
        """The busy baseline, after bargein's sessions have ended (so the two never share the CPU):
        a raw consumer sending the same chunk load the workers did, taking the same delivery an
        interrupt gets (persistent, confirmed, to the kind of queue it went through), ``samples``
        times."""
        assert self.raw_channel is not None
        await self._end_sessions()
        self.sessions_ended = True
        load = [str(self.n_sessions), f"{self.chunk_period_s:g}", str(self.words_per_chunk)]
        self.say(
            f"the busy baseline: a raw consumer sending {self.n_sessions} streams' chunks meanwhile,"
            f" taking the interrupt's delivery ({MAILBOX_DELIVERY[self.mailbox]})"
        )
        received = [0]

        async def count(_message: AbstractIncomingMessage) -> None:
            received[0] += 1

        sink = await self.raw_channel.declare_queue(busy_sink_queue(self.run_id), exclusive=True)
        await sink.consume(count, no_ack=True)
        child = await self.processes.start(
            "busy raw consumer",
            [
                sys.executable,
                "-m",
                "bargein.tools.bench_agents",
                self.run_id,
                "--exit-on-stdin-eof",
                "--busy",
                *load,
                "--mailbox",
                self.mailbox,
            ],
            self._env(0),
            RAW_HOP_READY,
        )
        await self.processes.wait_ready(child)
        await asyncio.sleep(self.warmup_s + self.chunk_period_s)
        loop = asyncio.get_running_loop()
        tick, started, cpu_before = loop.time(), time.monotonic(), cpu_seconds(child.proc.pid)
        received_before = received[0]
        for _ in range(self.n_samples):
            tick += self.sample_interval_s
            message = aio_pika.Message(
                RAW_HOP_BODY.pack(time.time()),
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                priority=PRIORITY_CONTROL,
            )
            await self.raw_channel.default_exchange.publish(message, routing_key=busy_hop_queue(self.run_id))
            self.sent_busy += 1
            await asyncio.sleep(max(0.0, tick - loop.time()))
        cpu_after, elapsed = cpu_seconds(child.proc.pid), time.monotonic() - started
        if cpu_before is not None and cpu_after is not None and elapsed > 0:
            self.busy_cores = (cpu_after - cpu_before) / elapsed
        self.busy_chunks_per_s = (received[0] - received_before) / elapsed if elapsed > 0 else 0.0
        (busy,) = await self.collect(("busy raw", busy_samples_key(self.run_id), self.sent_busy))
        return busy

    async def collect(self, *wanted: tuple[str, str, int]) -> list[list[float]]:
        """Wait (bounded) until each sample list (what it holds, its key, how many samples were
        sent) has every sample reported, then read them."""
        assert self.redis is not None
        deadline = time.monotonic() + RESULTS_TIMEOUT_S
        while True:
            got = [(int(await self.redis.llen(key)), sent, what) for what, key, sent in wanted]
            if all(n >= sent for n, sent, _ in got):
                break
            if time.monotonic() > deadline:
                told = " and ".join(f"{n}/{sent} {what}" for n, sent, what in got)
                self.say(f"  gave up waiting after {RESULTS_TIMEOUT_S:.0f} s: {told} samples reported")
                break
            self.processes.check()
            await asyncio.sleep(0.05)
        return [[float(value) for value in await self.redis.lrange(key, 0, -1)] for _, key, _ in wanted]

    # --- the report ------------------------------------------------------------------------------

    def report(
        self, interrupts: list[float], raw: list[float], busy: list[float], chunks_per_s: float
    ) -> dict[str, Any]:
        if not interrupts or not raw or not busy:
            raise BenchError(
                f"nothing to compare: {len(interrupts)} interrupt, {len(raw)} raw and {len(busy)} busy raw"
                " samples were reported"
            )
        cancel, hop, busy_hop = summarize(interrupts), summarize(raw), summarize(busy)
        ratio_p50, ratio_p99 = _ratio(cancel, hop, "p50_ms"), _ratio(cancel, hop, "p99_ms")
        busy_p50, busy_p99 = _ratio(cancel, busy_hop, "p50_ms"), _ratio(cancel, busy_hop, "p99_ms")
        nominal = self.n_sessions / self.chunk_period_s
        result: dict[str, Any] = {
            "run_id": self.run_id,
            "sessions": self.n_sessions,
            "workers": self.n_workers,
            "samples": self.n_samples,
            "interrupt": cancel,
            "raw": hop,
            "ratio_p50": ratio_p50,
            "ratio_p99": ratio_p99,
            "target_p50": P50_TARGET,
            "target_p99": P99_TARGET,
            "p50_met": ratio_p50 <= P50_TARGET,
            "p99_met": ratio_p99 <= P99_TARGET,
            "busy_raw": busy_hop,
            "busy_mailbox": self.mailbox,
            "busy_ratio_p50": busy_p50,
            "busy_ratio_p99": busy_p99,
            "busy_p50_met": busy_p50 <= BUSY_P50_TARGET,
            "busy_p99_met": busy_p99 <= BUSY_P99_TARGET,
            "busy_cores": self.busy_cores,
            "busy_chunks_per_s": self.busy_chunks_per_s,
            "chunks_per_s": chunks_per_s,
            "nominal_chunks_per_s": nominal,
            "worker_cores": self.worker_cores,
        }
        rows = [
            ("interrupt → CancelledError", cancel),
            ("raw publish → consume", hop),
            ("busy raw: the same delivery", busy_hop),
        ]
        lines = [
            "",
            f"{'':28}{'count':>7}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}",
            *(
                f"{name:28}{row['count']:>7}{row['p50_ms']:>10.2f}{row['p99_ms']:>10.2f}{row['max_ms']:>10.2f}"
                for name, row in rows
            ),
            "",
            _ratio_line("p50", ratio_p50, P50_TARGET),
            _ratio_line("p99", ratio_p99, P99_TARGET),
            f"against the busy raw baseline ({MAILBOX_DELIVERY[self.mailbox]}, to a process sending the"
            " same chunks):",
            _ratio_line("p50", busy_p50, BUSY_P50_TARGET),
            _ratio_line("p99", busy_p99, BUSY_P99_TARGET),
            f"{self.n_sessions} streaming sessions, {self.n_workers} worker(s), {chunks_per_s:.0f} chunks/s "
            f"at the edge during sampling (nominal {nominal:.0f})",
        ]
        if self.worker_cores is not None and self.busy_cores is not None:
            lines.append(
                f"how busy: the worker(s) used {self.worker_cores:.0%} of a core, the busy raw consumer"
                f" {self.busy_cores:.0%} for {self.busy_chunks_per_s:.0f} chunks/s (a message a chunk;"
                " bargein's workers bundle them)"
            )
        if self.worker_cores is not None:
            per_core = chunks_per_s / self.worker_cores if self.worker_cores > 0 else math.inf
            result["chunks_per_worker_core"] = per_core
            if self.n_workers == 1 and nominal >= WORKER_RATE_TARGET:
                met = verdict(chunks_per_s >= WORKER_RATE_TARGET)
                target = f"one worker carrying >= {WORKER_RATE_TARGET:,} chunks/s, target: {met}"
            else:  # the sessions ask for less than the target: it says nothing about it
                target = f"the target of {WORKER_RATE_TARGET:,} chunks/s a worker needs --chunk-ms 20"
            lines.append(
                f"the worker(s) used {self.worker_cores:.0%} of a core: {per_core:,.0f} chunks/s a core "
                f"({target})"
            )
        lost = (
            self.sent_interrupts - cancel["count"],
            self.sent_raw - hop["count"],
            self.sent_busy - busy_hop["count"],
        )
        if any(lost):
            lines.append(f"missing samples: {lost[0]} interrupt, {lost[1]} raw, {lost[2]} busy raw")
        refused = sum(n for name, n in self.transport_counters().items() if name.startswith("dead:"))
        if refused:
            lines.append(f"messages the edge refused (dead-lettered): {refused}")
        self.say("\n".join(lines))
        return result

    def transport_counters(self) -> dict[str, int]:
        return dict(self.transport.counters) if self.transport is not None else {}

    # --- clean-up --------------------------------------------------------------------------------

    async def _end_sessions(self) -> None:
        """EndCall through each session's caller: its owner closes it and forgets it everywhere."""
        assert self.transport is not None and self.redis is not None
        sessions = [self.edge.sessions[sid] for sid in self.created if sid in self.edge.sessions]
        for session in sessions:
            await session.caller.emit(EndCall(reason="bench finished"))
        deadline = time.monotonic() + END_TIMEOUT_S
        directory = session_directory_key(TIER_REASONING)
        while await self._registered(directory):
            if time.monotonic() > deadline or not any(child.running for child in self.workers):
                return  # the rest is for _forget_leftovers
            await asyncio.sleep(0.1)

    async def _registered(self, directory: str) -> list[str]:
        assert self.redis is not None
        if not self.created:
            return []
        present = await self.redis.hmget(directory, self.created)
        return [sid for sid, value in zip(self.created, present, strict=True) if value is not None]

    async def _forget_leftovers(self) -> None:
        """Whatever the workers did not forget (they were killed, or never got the session): the
        directory entry, state and mailboxes go, so no later worker adopts a bench session."""
        assert self.transport is not None and self.store is not None
        left = await self._registered(session_directory_key(TIER_REASONING))
        if left:
            self.say(f"  forgetting {len(left)} session(s) their owner did not end")
        for sid in left:
            await forget_session(self.transport, self.store, sid, tier=TIER_REASONING)

    async def clean_up(self) -> None:
        """Every step runs even if an earlier one failed; the child processes are always stopped."""
        self.say("cleaning up")
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        if self.edge_queue is not None:
            steps.append(("closing the edge queue", self.edge_queue.cancel))
        if self.created and self.transport is not None and not self.sessions_ended:
            steps.append(("ending the sessions", self._end_sessions))
        steps.append(("stopping the processes", self.processes.stop))
        if self.created and self.transport is not None:
            steps.append(("forgetting leftover sessions", self._forget_leftovers))
        if self.redis is not None:
            keys = (
                interrupt_samples_key(self.run_id),
                raw_samples_key(self.run_id),
                busy_samples_key(self.run_id),
            )
            redis_client = self.redis

            async def delete_lists() -> None:
                await redis_client.delete(*keys)

            steps.append(("deleting the sample lists", delete_lists))
        for thing in (self.raw_connection, self.transport, self.store):
            if thing is not None:
                steps.append((f"closing {type(thing).__name__}", thing.close))
        if self.redis is not None:
            steps.append(("closing the Redis client", self.redis.aclose))
        try:
            for what, step in steps:
                try:
                    await step()
                except Exception as exc:
                    self.say(f"  {what} failed: {type(exc).__name__}: {exc}")
        finally:
            for child in self.processes.children:  # if the clean-up itself was interrupted
                if child.running:
                    with contextlib.suppress(ProcessLookupError):
                        child.proc.kill()

    async def run(self) -> dict[str, Any]:
        self.say(
            f"bench interrupt (run {self.run_id}): {self.n_sessions} streaming sessions "
            f"({self.words_per_chunk} words every {self.chunk_period_s * 1000:.0f} ms each), "
            f"{self.n_workers} reasoning worker(s), {self.n_samples} samples"
        )
        try:
            await self.connect()
            await self.start_processes()
            await self.create_sessions()
            await self.wait_streaming()
            chunks_per_s = await self.sample()
            interrupts, raw = await self.collect(
                ("interrupt", interrupt_samples_key(self.run_id), self.sent_interrupts),
                ("raw", raw_samples_key(self.run_id), self.sent_raw),
            )
            busy = await self.sample_busy()
            return self.report(interrupts, raw, busy, chunks_per_s)
        finally:
            await self.clean_up()


async def run_interrupt_bench(
    sessions: int = 200,
    samples: int = DEFAULT_SAMPLES,
    workers: int = 1,
    rabbitmq_url: str | None = None,
    redis_url: str | None = None,
    out: TextIO | None = None,
    *,
    chunk_period_s: float = DEFAULT_CHUNK_PERIOD_S,
    words_per_chunk: int = DEFAULT_WORDS_PER_CHUNK,
    sample_interval_s: float = 0.04,
    warmup_s: float = 1.0,
) -> dict[str, Any]:
    """Run the interrupt benchmark and return its numbers (also printed to ``out``, default stdout).

    The URLs default to ``BARGEIN_RABBITMQ_URL`` / ``BARGEIN_REDIS_URL``. Raises
    :class:`BenchError` if the bench cannot run or measure; a missed target is only reported
    (``p50_met`` / ``p99_met`` in the result).
    """
    for name, value in (("sessions", sessions), ("samples", samples), ("workers", workers)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if chunk_period_s <= 0 or sample_interval_s <= 0 or words_per_chunk < 1 or warmup_s < 0:
        raise ValueError(
            "chunk_period_s and sample_interval_s must be > 0, words_per_chunk >= 1, warmup_s >= 0"
        )
    broker = load(BrokerSettings)
    bench = _InterruptBench(
        sessions=sessions,
        samples=samples,
        workers=workers,
        rabbitmq_url=rabbitmq_url or broker.rabbitmq_url,
        redis_url=redis_url or broker.redis_url,
        out=out if out is not None else sys.stdout,
        chunk_period_s=chunk_period_s,
        words_per_chunk=words_per_chunk,
        sample_interval_s=sample_interval_s,
        warmup_s=warmup_s,
    )
    return await bench.run()


def interrupt_main(
    sessions: int = 200,
    samples: int = DEFAULT_SAMPLES,
    workers: int = 1,
    *,
    chunk_period_s: float = DEFAULT_CHUNK_PERIOD_S,
    words_per_chunk: int = DEFAULT_WORDS_PER_CHUNK,
) -> int:
    """``bargein bench interrupt``: run the bench, print the report."""
    return run_main(
        lambda: run_interrupt_bench(
            sessions, samples, workers, chunk_period_s=chunk_period_s, words_per_chunk=words_per_chunk
        ),
        "interrupt",
    )
