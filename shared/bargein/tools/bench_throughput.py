"""``bargein bench throughput``: chunks per second through one edge process, beside a raw hop.

Two rows, measured in one run on the same broker and machine:

* **raw**: aio-pika publishes the same encoded chunks to a queue of the bench's own and consumes
  them back, in order, acknowledging each, at the edge's prefetch: what the broker and the client
  library can do here, with no bargein code in the path;
* **edge**: a real ``bargein broadcast`` process (started by the bench) takes the chunks from its
  data queue, fences them and writes them to WebSocket clients (``--sessions`` of them, in the
  bench's process), the way a reasoning worker's answers reach callers.

Both publishers keep at most ``--window`` chunks in flight (published, not yet received), as
backpressure would, so neither run measures a queue filling up. The targets are at least 5,000
chunks/s through the edge and at least 70% of the raw rate. While the edge runs flat out, the bench
also interrupts a probe session twice a second and reports how long each ``clear`` took to reach
its client: control must overtake the data queued ahead of it.

The bench's sessions exist only in the directory and the lease (no agent runs for them: the bench
plays their owner); it removes them, its queue and the edge process at the end, even on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import aio_pika
import websockets
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from websockets.asyncio.client import ClientConnection

from bargein.agent.events import AgentResponse, TurnInterrupted
from bargein.edge.tokens import Tokens
from bargein.settings import BroadcastSettings, BrokerSettings, load
from bargein.tasks import cancel_and_wait
from bargein.tools.benchkit import (
    BenchError,
    Processes,
    free_port,
    run_main,
    say,
    service_env,
    start_service,
    summarize,
    verdict,
)
from bargein.transport import amqp_address
from bargein.transport.amqp import EDGE_ACK_EVERY
from bargein.transport.redis_store import RedisStateStore
from bargein.wire.envelope import Envelope, encode
from bargein.wire.names import EVENTS_EXCHANGE, OUT, TIER_REASONING, routing_key
from bargein.wire.session_info import SessionInfo

RATE_TARGET = 5_000.0  # chunks/s through one edge process
RATIO_TARGET = 0.70  # of the raw hop's rate
LEASE_MS = 600_000
CHUNK_TEXT = "and the forecast "  # about the size of a coalesced chunk
PROBE_EVERY_S = 0.5
STALL_S = 30.0  # no chunk arriving for this long: they are lost, not late


class _Counter:
    """Chunks received, and an event to wake a publisher waiting for room in its window."""

    def __init__(self) -> None:
        self.received = 0
        self.room = asyncio.Event()

    def got(self, n: int = 1) -> None:
        self.received += n
        self.room.set()


async def _publish_windowed(
    bodies: list[tuple[str, bytes]],
    publish: Callable[[bytes, str], Awaitable[object]],
    counter: _Counter,
    window: int,
) -> None:
    for published, (key, body) in enumerate(bodies):
        while published - counter.received >= window:
            counter.room.clear()
            await counter.room.wait()
        await publish(body, key)


async def _wait_received(counter: _Counter, total: int, stall_s: float = STALL_S) -> None:
    """Until ``total`` chunks have arrived; a run in which none arrives for ``stall_s`` has lost
    some, and fails saying how many came rather than waiting on."""
    while counter.received < total:
        counter.room.clear()
        try:
            await asyncio.wait_for(counter.room.wait(), stall_s)
        except TimeoutError:
            raise BenchError(
                f"{counter.received} of {total} chunks arrived, then none for {stall_s:.0f} s: lost"
            ) from None


class _ThroughputBench:
    def __init__(
        self, *, sessions: int, chunks: int, window: int, rabbitmq_url: str, redis_url: str, out: TextIO
    ) -> None:
        self.n_sessions = sessions
        self.n_chunks = chunks
        self.window = window
        self.rabbitmq_url = rabbitmq_url
        self.redis_url = redis_url
        self.out = out
        self.run_id = uuid.uuid4().hex[:8]
        self.prefetch = load(BroadcastSettings).edge_prefetch
        self.processes = Processes(out)
        self.connection: AbstractRobustConnection | None = None
        self.store: RedisStateStore | None = None
        self.sessions: list[str] = []
        self.epochs: dict[str, int] = {}
        self.owner = f"bench-throughput-{self.run_id}"

    def say(self, text: str) -> None:
        say(self.out, text)

    def _bodies(self, sessions: list[str]) -> list[tuple[str, bytes]]:
        """The chunks, encoded up front (the bench's own CPU goes to receiving, not encoding)."""
        bodies = []
        for i in range(self.n_chunks):
            sid = sessions[i % len(sessions)]
            envelope = Envelope.wrap(
                sid,
                AgentResponse(content=CHUNK_TEXT),
                turn=1,
                seq=i // len(sessions),
                epoch=self.epochs.get(sid, 1),
                source=self.owner,
            )
            bodies.append((routing_key(sid, OUT, "AgentResponse"), encode(envelope)))
        return bodies

    # --- raw ---------------------------------------------------------------------------------------

    async def raw(self) -> float:
        assert self.connection is not None
        self.say(f"raw: {self.n_chunks} chunks publish → consume (prefetch {self.prefetch})")
        publisher = await self.connection.channel(publisher_confirms=False)
        consumer = await self.connection.channel(publisher_confirms=False)
        await consumer.set_qos(prefetch_count=self.prefetch)
        queue = await consumer.declare_queue(f"bargein.bench.throughput.{self.run_id}", exclusive=True)
        counter = _Counter()
        bodies = [(queue.name, body) for _, body in self._bodies([f"raw{self.run_id}"])]

        async def drain() -> None:  # in order, acknowledged in batches: as the edge does
            inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
            await queue.consume(inbox.put)
            while True:
                message, handled = await inbox.get(), 1
                while handled < EDGE_ACK_EVERY and not inbox.empty():
                    message, handled = inbox.get_nowait(), handled + 1
                await message.ack(multiple=True)
                counter.got(handled)

        raw_channel = await publisher.get_underlay_channel()

        async def publish(body: bytes, key: str) -> None:
            await raw_channel.basic_publish(body, routing_key=key)

        draining = asyncio.create_task(drain())
        started = time.perf_counter()
        try:
            await _publish_windowed(bodies, publish, counter, self.window)
            await _wait_received(counter, self.n_chunks)
        finally:
            await cancel_and_wait(draining)
        rate = self.n_chunks / (time.perf_counter() - started)
        await consumer.close()
        await publisher.close()
        self.say(f"  {rate:,.0f} chunks/s")
        return rate

    # --- through the edge ---------------------------------------------------------------------------

    async def start_edge(self, secret: str) -> str:
        env = service_env(
            self.rabbitmq_url,
            self.redis_url,
            BARGEIN_EDGE_SECRET=secret,
            BARGEIN_HOST="127.0.0.1",
            BARGEIN_PORT=str(free_port()),
            BARGEIN_SEND_BUFFER=str(max(256, self.window)),
        )
        edge = await start_service(self.processes, "broadcast", "edge", env)
        return edge.url.replace("http://", "ws://")

    async def make_sessions(self, n: int) -> list[str]:
        """Sessions as far as the edge can tell: in the directory, with an owner's lease."""
        assert self.store is not None
        made = []
        for _ in range(n):
            sid = f"bench{self.run_id}{len(self.sessions):05d}"
            await self.store.register_session(TIER_REASONING, sid, SessionInfo(sid, {}).encode())
            epoch = await self.store.acquire_lease(TIER_REASONING, sid, self.owner, LEASE_MS)
            if epoch is None:
                raise BenchError(f"session {sid} is owned by someone else")
            self.epochs[sid] = epoch
            self.sessions.append(sid)
            made.append(sid)
        return made

    async def edge(self) -> tuple[float, dict[str, Any]]:
        assert self.connection is not None
        secret = secrets.token_hex(16)
        base = await self.start_edge(secret)
        tokens = Tokens(secret, 3600)
        sessions = await self.make_sessions(self.n_sessions)
        (probe,) = await self.make_sessions(1)
        self.say(f"edge: {self.n_chunks} chunks to {self.n_sessions} WebSocket clients")
        counter, clears = _Counter(), asyncio.Queue[float]()

        def url(sid: str) -> str:
            return f"{base}/v1/sessions/{sid}/ws?token={tokens.issue(sid, 'caller')}"

        async def receive(ws: ClientConnection) -> None:
            async for frame in ws:  # counted, not parsed: the bench's CPU is the edge's competitor
                if isinstance(frame, str) and '"agent_chunk"' in frame:
                    counter.got()

        async def receive_clears(ws: ClientConnection) -> None:
            async for frame in ws:
                if isinstance(frame, str) and '"clear"' in frame:
                    clears.put_nowait(time.perf_counter())

        sockets = [await websockets.connect(url(sid), max_size=None) for sid in sessions]
        probe_ws = await websockets.connect(url(probe), max_size=None)
        receivers = [asyncio.create_task(receive(ws)) for ws in sockets]
        receivers.append(asyncio.create_task(receive_clears(probe_ws)))
        channel = await self.connection.channel(publisher_confirms=False)
        raw_channel = await channel.get_underlay_channel()

        async def publish(body: bytes, key: str) -> None:
            await raw_channel.basic_publish(body, exchange=EVENTS_EXCHANGE, routing_key=key)

        stop = asyncio.Event()
        clear_latencies: list[float] = []

        async def interrupts() -> None:  # control, while data floods the edge
            control = await self.connection.channel(publisher_confirms=False)  # type: ignore[union-attr]
            events = await control.get_exchange(EVENTS_EXCHANGE)
            turn = 0
            while not stop.is_set():
                await asyncio.sleep(PROBE_EVERY_S)
                turn += 1
                envelope = Envelope.wrap(
                    probe, TurnInterrupted(turn=turn), turn=turn, epoch=self.epochs[probe], source=self.owner
                )
                sent = time.perf_counter()
                message = aio_pika.Message(encode(envelope), priority=1)
                await events.publish(message, routing_key(probe, OUT, "TurnInterrupted"))
                with contextlib.suppress(TimeoutError):
                    clear_latencies.append(await asyncio.wait_for(clears.get(), 10) - sent)
            await control.close()

        bodies = self._bodies(sessions)
        probing = asyncio.create_task(interrupts())
        started = time.perf_counter()
        try:
            await _publish_windowed(bodies, publish, counter, self.window)
            await _wait_received(counter, self.n_chunks)
            rate = self.n_chunks / (time.perf_counter() - started)
        finally:
            stop.set()
            await asyncio.gather(probing, return_exceptions=True)
            for task in receivers:
                task.cancel()
            for ws in [*sockets, probe_ws]:
                with contextlib.suppress(Exception):
                    await ws.close()
            await channel.close()
        self.say(f"  {rate:,.0f} chunks/s; {len(clear_latencies)} interrupts meanwhile")
        return rate, summarize(clear_latencies)

    # --- the run ------------------------------------------------------------------------------------

    async def connect(self) -> None:
        try:
            self.connection = await amqp_address.connect_robust(
                self.rabbitmq_url, client_properties={"connection_name": self.owner}
            )
        except Exception as exc:
            raise BenchError(f"RabbitMQ is not reachable ({type(exc).__name__}: {exc})") from exc
        self.store = RedisStateStore.from_url(self.redis_url)
        try:
            await self.store.redis.ping()
        except Exception as exc:
            raise BenchError(f"Redis is not reachable ({type(exc).__name__}: {exc})") from exc

    async def clean_up(self) -> None:
        await self.processes.stop()
        if self.store is not None:
            for sid in self.sessions:
                with contextlib.suppress(Exception):
                    await self.store.release_lease(TIER_REASONING, sid, self.owner, self.epochs[sid])
                    await self.store.unregister_session(TIER_REASONING, sid)
                    await self.store.delete_state(TIER_REASONING, sid)
            await self.store.close()
        if self.connection is not None:
            await self.connection.close()

    def report(self, raw: float, edge: float, clears: dict[str, Any]) -> dict[str, Any]:
        ratio = edge / raw if raw else 0.0
        result = {
            "run_id": self.run_id,
            "chunks": self.n_chunks,
            "sessions": self.n_sessions,
            "raw_per_s": raw,
            "edge_per_s": edge,
            "ratio": ratio,
            "rate_met": edge >= RATE_TARGET,
            "ratio_met": ratio >= RATIO_TARGET,
            "clear": clears,
        }
        rate_met, ratio_met = verdict(edge >= RATE_TARGET), verdict(ratio >= RATIO_TARGET)
        self.say("")
        self.say(f"  raw publish → consume   {raw:>9,.0f} chunks/s")
        self.say(
            f"  through one edge        {edge:>9,.0f} chunks/s   target ≥ {RATE_TARGET:,.0f}: {rate_met}"
        )
        self.say(
            f"  edge / raw              {ratio:>9.2f}            target ≥ {RATIO_TARGET:.2f}: {ratio_met}"
        )
        self.say(
            f"  interrupt → clear at the client under that load: p50 {clears['p50_ms']:.1f} ms, "
            f"max {clears['max_ms']:.1f} ms ({clears['count']} interrupts)"
        )
        return result

    async def run(self) -> dict[str, Any]:
        self.say(
            f"bench throughput (run {self.run_id}): {self.n_chunks} chunks, "
            f"{self.n_sessions} sessions, window {self.window}"
        )
        try:
            await self.connect()
            raw = await self.raw()
            edge, clears = await self.edge()
            return self.report(raw, edge, clears)
        finally:
            await self.clean_up()


async def run_throughput_bench(
    sessions: int = 20,
    chunks: int = 50_000,
    window: int = 2_000,
    rabbitmq_url: str | None = None,
    redis_url: str | None = None,
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Run the bench and return its numbers (also printed to ``out``, default stdout)."""
    for name, value in (("sessions", sessions), ("chunks", chunks), ("window", window)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    broker = load(BrokerSettings)
    bench = _ThroughputBench(
        sessions=sessions,
        chunks=chunks,
        window=window,
        rabbitmq_url=rabbitmq_url or broker.rabbitmq_url,
        redis_url=redis_url or broker.redis_url,
        out=out if out is not None else sys.stdout,
    )
    return await bench.run()


def throughput_main(sessions: int = 20, chunks: int = 50_000, window: int = 2_000) -> int:
    """``bargein bench throughput``: run the bench, print the report."""
    return run_main(lambda: run_throughput_bench(sessions, chunks, window), "throughput")
