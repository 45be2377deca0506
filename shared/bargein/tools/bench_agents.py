"""What the interrupt benchmark (:mod:`bargein.tools.bench`) runs in its child processes.

* :func:`agent` is the agent its reasoning processes run (``BARGEIN_AGENT=bargein.tools.bench_agents:agent``):
  every ``UserStoppedSpeaking`` starts a generation that streams until it is interrupted, and the
  node reports how long each interrupt took to reach the generator as a ``CancelledError``.
* ``python -m bargein.tools.bench_agents RUN_ID`` is the baseline: a bare aio-pika consumer that measures
  the raw publish → consume hop of the same broker, on the same machine, during the same run;
  with ``--busy`` it is the busy baseline: the same delivery an interrupt gets (persistent,
  acknowledged, prefetch 1, to the kind of queue the interrupt goes through: a partition's quorum
  queue, or with ``--mailbox priority`` a session mailbox's classic priority queue) to a process
  that sends as many chunks as the bench's workers meanwhile.

Both measure with ``time.time()`` against a timestamp the bench process took just before publishing,
so both numbers are process → broker → process on one clock, and their ratio is what the bench's
targets are about.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import os
import re
import signal
import struct
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aio_pika
import redis.asyncio as aioredis
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from bargein.agent.context import ConversationContext
from bargein.agent.events import AgentResponse, Event, UserStartedSpeaking, UserStoppedSpeaking
from bargein.agent.message import Message
from bargein.agent.nodes import ReasoningNode
from bargein.agent.routes import Bridge
from bargein.settings import BrokerSettings, load
from bargein.tools.bench import (
    DEFAULT_CHUNK_PERIOD_S,
    DEFAULT_WORDS_PER_CHUNK,
    OPT_CHUNK_PERIOD_S,
    OPT_RUN,
    OPT_WORDS_PER_CHUNK,
    RAW_HOP_BODY,
    RAW_HOP_READY,
    SAMPLES_TTL_S,
    MailboxKind,
    busy_hop_arguments,
    busy_hop_queue,
    busy_samples_key,
    busy_sink_queue,
    interrupt_samples_key,
    raw_hop_queue,
    raw_samples_key,
)
from bargein.transport import amqp_address
from bargein.wire.session_info import SessionInfo

log = logging.getLogger("bargein.tools.bench")

# What a streaming answer says; only its size matters (a chunk is a few words, like the coalesced
# chunks a real LLM + TTS pipeline would publish, not one message per token).
_TEXT = (
    "well the forecast for this weekend looks mostly dry with a light breeze from the west and "
    "temperatures climbing slowly through saturday before a few showers arrive late on sunday"
)
_WORDS = _TEXT.split()

# Interrupted answers are appended to the history; a bench session is interrupted over and over, so
# keep only the recent part, or every checkpoint would grow with the length of the run.
HISTORY_KEPT = 8

_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")

_redis: aioredis.Redis | None = None


def _samples_redis() -> aioredis.Redis:
    """One client per process, created on first use (in the service's event loop) from the same
    ``BARGEIN_REDIS_URL`` the service itself uses."""
    global _redis
    if _redis is None:
        _redis = aioredis.Redis.from_url(load(BrokerSettings).redis_url)
    return _redis


async def record_sample(client: aioredis.Redis, key: str, seconds: float) -> None:
    """Append one latency (seconds, as text) to a bench list. The list expires on its own, so a run
    that dies before its clean-up leaves nothing behind for long."""
    async with client.pipeline(transaction=False) as pipe:
        pipe.rpush(key, f"{seconds:.9f}")
        pipe.expire(key, SAMPLES_TTL_S)
        await pipe.execute()


class StreamingNode(ReasoningNode):
    """Streams a few words every ``chunk_period_s`` until it is interrupted.

    The instant the generator sees ``CancelledError`` is the end of the measured interval. It cannot
    be reported from the generator itself (it is being cancelled; the awaits of a report would be
    part of the unwinding), so it is kept in ``_cancelled_at`` and reported by :meth:`on_interrupt`,
    the route's interrupt handler, which runs once the turn has unwound and receives the interrupt
    message, whose ``timestamp`` is when the bench created it, just before publishing it. The
    attribute is private so that checkpoints leave it out.

    A session that is not the bench's (a start left over in the shared work queue, say) gets a node
    that answers nothing, rather than one that streams forever into a mailbox nobody reads.
    """

    def __init__(self, session: SessionInfo) -> None:
        super().__init__(max_context_length=HISTORY_KEPT)
        options = session.options
        self._run_id = str(options.get(OPT_RUN, ""))
        self._period = float(options.get(OPT_CHUNK_PERIOD_S, DEFAULT_CHUNK_PERIOD_S))
        self._words_per_chunk = max(1, int(options.get(OPT_WORDS_PER_CHUNK, DEFAULT_WORDS_PER_CHUNK)))
        self._cancelled_at: float | None = None

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        self._cancelled_at = None
        if not self._run_id:
            return
        words = itertools.cycle(_WORDS)
        try:
            while True:
                await asyncio.sleep(self._period)
                text = " ".join(itertools.islice(words, self._words_per_chunk))
                yield AgentResponse(content=text + " ")
        except asyncio.CancelledError:
            self._cancelled_at = time.time()
            raise

    async def on_interrupt(self, message: Message) -> None:
        """Report ``CancelledError`` time minus the interrupt's publish time to the run's Redis list."""
        cancelled_at, self._cancelled_at = self._cancelled_at, None
        del self.conversation_events[:-HISTORY_KEPT]
        if cancelled_at is None or not self._run_id:
            return  # cancelled before the generator ran: nothing was measured
        await record_sample(
            _samples_redis(), interrupt_samples_key(self._run_id), cancelled_at - message.timestamp
        )


def agent(session: SessionInfo) -> Bridge:
    """The bench's agent: one generation route, interrupted by the caller starting to speak."""
    node = StreamingNode(session)
    bridge = Bridge(node)
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt)
        .stream(node.generate)
        .broadcast()
    )
    return bridge


# --- the raw-hop consumer -----------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkLoad:
    """What keeps the busy raw consumer as busy as a bench worker: ``sessions`` streams, each
    sending ``words`` words every ``period_s`` and waiting for RabbitMQ's confirm, as the bench
    agent's generations do (one message a chunk: no bundling, which bargein's workers do)."""

    sessions: int
    period_s: float
    words: int


async def serve_raw_hop(
    run_id: str,
    rabbitmq_url: str,
    redis_url: str,
    *,
    exit_on_stdin_eof: bool = False,
    busy: ChunkLoad | None = None,
    mailbox: MailboxKind = "quorum",
) -> None:
    """Consume the run's raw-hop queue until SIGTERM/SIGINT, recording receive time minus sent time.

    Idle (``busy`` None): a transient message to an exclusive queue of this connection, which
    disappears with the process however it ends. Busy: the delivery an interrupt gets (persistent,
    acknowledged, prefetch 1, to a durable queue of the ``mailbox`` kind: :func:`busy_hop_arguments`)
    to a process that meanwhile sends ``busy``'s chunks; the queue is deleted at the end (and
    expires if not).
    With ``exit_on_stdin_eof`` the consumer also stops when its stdin closes, i.e. when the bench
    that started it is gone, even if it was killed before it could send SIGTERM.
    """
    stop = _stop_event(exit_on_stdin_eof)
    redis_client = aioredis.Redis.from_url(redis_url)
    connection = await amqp_address.connect_robust(
        rabbitmq_url, client_properties={"connection_name": f"bargein-bench-rawhop-{run_id}"}
    )
    streams: list[asyncio.Task[None]] = []
    try:
        channel = await connection.channel()
        if busy is None:
            queue = await channel.declare_queue(
                raw_hop_queue(run_id), exclusive=True, arguments={"x-queue-type": "classic"}
            )
            key, ack = raw_samples_key(run_id), False
        else:
            await channel.set_qos(prefetch_count=1)  # as a worker takes its mailbox: one at a time
            queue = await channel.declare_queue(
                busy_hop_queue(run_id),
                durable=True,
                arguments=busy_hop_arguments(mailbox),
            )
            key, ack = busy_samples_key(run_id), True
            streams = await _send_chunks(connection, run_id, busy)

        async def on_message(message: AbstractIncomingMessage) -> None:
            received = time.time()
            try:
                (sent,) = RAW_HOP_BODY.unpack(message.body)
            except struct.error:
                log.warning("ignoring a malformed raw-hop message (%d bytes)", len(message.body))
                return
            await record_sample(redis_client, key, received - sent)
            if ack:
                await message.ack()

        await queue.consume(on_message, no_ack=not ack)
        print(f"{RAW_HOP_READY} (queue {queue.name})", flush=True)
        await stop.wait()
    finally:
        for stream in streams:
            stream.cancel()
        if busy is not None:
            with contextlib.suppress(Exception):
                await (await connection.channel()).queue_delete(busy_hop_queue(run_id))
        with contextlib.suppress(Exception):
            await connection.close()
        with contextlib.suppress(Exception):
            await redis_client.aclose()


def _stop_event(exit_on_stdin_eof: bool) -> asyncio.Event:
    """Set on SIGINT or SIGTERM, and (``exit_on_stdin_eof``) when stdin closes."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if exit_on_stdin_eof:
        fd = sys.stdin.fileno()

        def on_stdin() -> None:
            if not os.read(fd, 4096):
                loop.remove_reader(fd)
                stop.set()

        loop.add_reader(fd, on_stdin)
    return stop


async def _send_chunks(
    connection: AbstractRobustConnection, run_id: str, load: ChunkLoad
) -> list[asyncio.Task[None]]:
    """``load``'s streams, started evenly spread over a period, each on the confirming channel, to
    the queue the bench reads them from (:func:`busy_sink_queue`, the bench's: it counts them as
    its edge counts a worker's chunks)."""
    channel = await connection.channel(publisher_confirms=True)
    sink = busy_sink_queue(run_id)
    body = " ".join(itertools.islice(itertools.cycle(_TEXT.split()), load.words)).encode()
    loop = asyncio.get_running_loop()

    async def stream(i: int) -> None:
        await asyncio.sleep(i * load.period_s / load.sessions)
        next_at = loop.time()
        while True:
            next_at += load.period_s
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key=sink)
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    return [asyncio.create_task(stream(i), name=f"chunks-{i}") for i in range(load.sessions)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bargein.tools.bench_agents",
        description="The interrupt benchmark's raw publish → consume baseline (started by the bench).",
    )
    parser.add_argument("run_id", help="the bench run this consumer measures for")
    parser.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="stop when stdin closes (the bench went away)"
    )
    parser.add_argument(
        "--busy",
        nargs=3,
        metavar=("SESSIONS", "PERIOD_S", "WORDS"),
        help="the busy baseline: send this chunk load meanwhile, take persistent messages",
    )
    parser.add_argument(
        "--mailbox",
        choices=("quorum", "priority"),
        default="quorum",
        help="the busy baseline's queue: a partition's (quorum, the default) or a session mailbox's",
    )
    args = parser.parse_args(argv)
    busy = None
    if args.busy is not None:
        sessions, period_s, words = args.busy
        busy = ChunkLoad(int(sessions), float(period_s), int(words))
    if not _RUN_ID.fullmatch(args.run_id):
        parser.error(f"run id must be 1-64 of [A-Za-z0-9_-], got {args.run_id!r}")
    broker = load(BrokerSettings)
    try:
        import uvloop

        uvloop.install()  # as the reasoning service does: both receiving ends run the same loop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio works too
        pass
    asyncio.run(
        serve_raw_hop(
            args.run_id,
            broker.rabbitmq_url,
            broker.redis_url,
            exit_on_stdin_eof=args.exit_on_stdin_eof,
            busy=busy,
            mailbox=args.mailbox,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
