"""The workload of ``bargein bench peers``, written once and run on each framework in a process of
its own: ``python -m bargein.tools.peer_workloads <framework> <json settings>`` prints one JSON line.

``S`` sessions run at once. Each session's agent answers a turn by streaming a chunk every
``chunk_ms`` (``t<turn>w<i> ``) until it is interrupted; the caller interrupts each answer at a
random point (0.3 to 1.0 s in), then starts the next turn. What is measured, per interrupt:

* interrupt → ``CancelledError`` in the agent's generator (the cancellation itself);
* interrupt → the interrupted turn's last chunk at the sink (what the caller could still get);
* the chunks of that turn that reached the sink after the interrupt;
* whether the interrupt handler ran (frameworks that have one) and whether the next turn was
  correct (its chunks from ``w0`` on, none of the old turn after it began);

and for the whole run, the CPU time (``time.process_time``) per chunk that reached the sink.

The frameworks: ``bargein`` (the in-process runtime, :class:`~bargein.testing.local.LocalSession`,
delivery reports on, as always), ``bargein-distributed`` (the same agent hosted by one
:class:`~bargein.hosting.host.SessionHost`, the reasoning worker's, over RabbitMQ and Redis from
``BARGEIN_RABBITMQ_URL`` / ``BARGEIN_REDIS_URL``, its callers' edge in the same process on a
connection of its own: the CPU counted is the worker's and the edge's, not the broker's or
Redis'), ``line`` (Cartesia Line 0.1.12's bus and bridges, as its voice
agents use them), ``pipecat`` (a Pipecat 1.14 pipeline whose processor streams in
``process_frame``, interrupted by an ``InterruptionFrame``). Line and Pipecat come with the
``peers`` extra (``pip install 'bargein[peers]'``); both log through loguru, set to WARNING here as a
deployment would.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import bargein
from bargein import (
    AgentResponse,
    Bridge,
    Event,
    UserStartedSpeaking,
    UserStoppedSpeaking,
)
from bargein.hosting.host import SessionHost
from bargein.hosting.sessions import forget_session
from bargein.settings import BrokerSettings, load
from bargein.testing.caller import Caller
from bargein.testing.local import LocalSession
from bargein.transport.abc import EdgeQueue
from bargein.transport.amqp import AmqpTransport
from bargein.transport.redis_store import RedisStateStore
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN, TIER_REASONING
from bargein.wire.session_info import SessionInfo

FRAMEWORKS = ("bargein", "bargein-distributed", "line", "pipecat")
SETTLE_S = 0.15  # after an interrupt: late chunks still count, then the next turn starts


@dataclass
class Interrupt:
    turn: int
    at: float
    cancelled_at: float | None = None
    last_chunk_at: float | None = None
    chunks_after: int = 0
    handler_ran: bool = False


@dataclass
class Recorder:
    """What one session's sink and agent saw, against the interrupts the caller made."""

    interrupts: dict[int, Interrupt] = field(default_factory=dict)
    first_chunk: dict[int, int] = field(default_factory=dict)  # turn → its first chunk's index
    started: dict[int, float] = field(default_factory=dict)  # turn → when its first chunk arrived
    late_old: int = 0  # chunks of a turn that arrived after the next turn's first
    chunks: int = 0
    measuring: bool = False

    def chunk(self, text: str) -> None:
        now = time.perf_counter()
        turn_part, _, index_part = text.strip().partition("w")
        turn, index = int(turn_part[1:]), int(index_part)
        if self.measuring:
            self.chunks += 1
        self.first_chunk.setdefault(turn, index)
        self.started.setdefault(turn, now)
        if any(later > turn for later in self.started):
            self.late_old += 1
        interrupt = self.interrupts.get(turn)
        if interrupt is not None and now >= interrupt.at:
            interrupt.chunks_after += 1
            interrupt.last_chunk_at = now

    def cancelled(self, turn: int) -> None:
        interrupt = self.interrupts.get(turn)
        if interrupt is not None and interrupt.cancelled_at is None:
            interrupt.cancelled_at = time.perf_counter()

    def handled(self, turn: int) -> None:
        interrupt = self.interrupts.get(turn)
        if interrupt is not None:
            interrupt.handler_ran = True


class Session:
    """One framework's session, as the driver sees it."""

    recorder: Recorder
    has_handler = True

    async def start(self) -> None: ...

    async def turn(self, turn: int) -> None: ...

    async def interrupt(self) -> None: ...

    async def stop(self) -> None: ...


async def chunks(turn: int, chunk_s: float, recorder: Recorder) -> Any:
    """The agent's answer: a chunk every ``chunk_s``, and the time of its cancellation."""
    try:
        for i in range(100_000):
            await asyncio.sleep(chunk_s)
            yield f"t{turn}w{i} "
    except asyncio.CancelledError:
        recorder.cancelled(turn)
        raise


def agent_bridge(api: Any, chunk_s: float, recorder: Recorder, **node_args: Any) -> Any:
    """The agent, on bargein's or on Line's classes (``api``: a module with ``ReasoningNode``,
    ``Bridge``, ``AgentResponse``, ``UserStartedSpeaking`` and ``UserStoppedSpeaking``): one node
    and one route, written once, so both frameworks run the very same agent."""

    class Streamer(api.ReasoningNode):  # type: ignore[misc]
        turn = 0

        async def process_context(self, context: Any) -> Any:
            self.turn += 1
            try:
                async for text in chunks(self.turn, chunk_s, recorder):
                    yield api.AgentResponse(content=text)
            except asyncio.CancelledError:  # at the yield: the runtime was publishing the chunk
                recorder.cancelled(self.turn)
                raise

        def on_interrupt_generate(self, message: Any) -> None:  # Line's handlers are synchronous
            recorder.handled(self.turn)

    node = Streamer(**node_args)
    bridge = api.Bridge(node)
    (
        bridge.on(api.UserStoppedSpeaking)
        .interrupt_on(api.UserStartedSpeaking, handler=node.on_interrupt_generate)
        .stream(node.generate)
        .broadcast()
    )
    return bridge


# --- bargein -------------------------------------------------------------------------------------


class BargeinSession(Session):
    def __init__(self, chunk_s: float) -> None:
        self.recorder = Recorder()

        def agent(session: Any) -> Bridge:
            bridge: Bridge = agent_bridge(bargein, chunk_s, self.recorder)
            return bridge

        self.local = LocalSession(agent, keep_received=False)  # a sink, as the peers' are
        self.caller: Caller = self.local
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.local.__aenter__()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            event = await self.caller.next(timeout=None)
            if isinstance(event, AgentResponse) and event.content.strip():
                self.recorder.chunk(event.content)

    async def turn(self, turn: int) -> None:
        await self.caller.emit(UserStoppedSpeaking())

    async def interrupt(self) -> None:
        await self.caller.emit(UserStartedSpeaking())

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.local.__aexit__(None, None, None)


class DistributedBargeinSession(BargeinSession):
    """The same agent and caller, through RabbitMQ and Redis: one worker hosts every session of
    the run (:class:`Distributed`), and the callers hear their sessions on one edge queue, as a
    broadcast process's callers do."""

    def __init__(self, cluster: Distributed) -> None:
        self.recorder = Recorder()
        self.cluster = cluster
        self.session_id = f"peers{uuid.uuid4().hex[:12]}"
        self.caller = Caller(cluster.edge, self.session_id, keep_received=False)
        cluster.recorders[self.session_id] = self.recorder
        cluster.callers[self.session_id] = self.caller
        self._reader = None

    async def start(self) -> None:
        info = SessionInfo(self.session_id, {}, edge_reports_delivery=True)
        await self.caller.attach(self.cluster.need_edge_queue())
        await self.cluster.worker.declare_mailbox(self.session_id, TIER_REASONING, IN)
        await self.cluster.host.open(info)
        self._reader = asyncio.create_task(self._read())

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.cluster.host.close(self.session_id)
        await self.caller.detach()
        await forget_session(self.cluster.worker, self.cluster.store, self.session_id, tier=TIER_REASONING)


class Distributed:
    """One reasoning worker's host and one edge connection, shared by a run's sessions."""

    def __init__(self, chunk_s: float) -> None:
        self.chunk_s = chunk_s
        self.recorders: dict[str, Recorder] = {}
        self.callers: dict[str, Caller] = {}
        self.edge_queue: EdgeQueue | None = None

    async def __aenter__(self) -> Distributed:
        broker = load(BrokerSettings)
        self.worker = await AmqpTransport.connect(broker.rabbitmq_url, name="bargein-peers-worker")
        self.edge = await AmqpTransport.connect(broker.rabbitmq_url, name="bargein-peers-edge")
        self.store = RedisStateStore.from_url(broker.redis_url)

        def agent(session: Any) -> Bridge:
            bridge: Bridge = agent_bridge(bargein, self.chunk_s, self.recorders[session.session_id])
            return bridge

        self.host = SessionHost.for_agent(self.worker, self.store, agent, owner=f"peers-{os.getpid()}")
        self.edge_queue = await self.edge.open_edge_queue(f"peers-{os.getpid()}", self._hear)
        return self

    async def _hear(self, envelope: Envelope, event: Event) -> None:
        caller = self.callers.get(envelope.session)
        if caller is not None:
            await caller.receive(envelope, event)

    def need_edge_queue(self) -> EdgeQueue:
        assert self.edge_queue is not None, "the cluster is entered first"
        return self.edge_queue

    async def __aexit__(self, *exc: object) -> None:
        await self.host.close_all()
        if self.edge_queue is not None:
            await self.edge_queue.cancel()
        await self.edge.close()
        await self.worker.close()
        await self.store.close()


# --- Line 0.1.12 -----------------------------------------------------------------------------------


class LineSession(Session):
    def __init__(self, chunk_s: float) -> None:
        from line import Bridge, Bus, Message, ReasoningNode
        from line.events import (
            AgentResponse,
            UserStartedSpeaking,
            UserStoppedSpeaking,
            UserTranscriptionReceived,
        )

        self.recorder = recorder = Recorder()
        self._message = Message
        self._events = (UserStartedSpeaking, UserStoppedSpeaking, UserTranscriptionReceived)
        self.bus = Bus()
        api = SimpleNamespace(
            ReasoningNode=ReasoningNode,
            Bridge=Bridge,
            AgentResponse=AgentResponse,
            UserStartedSpeaking=UserStartedSpeaking,
            UserStoppedSpeaking=UserStoppedSpeaking,
        )
        bridge = agent_bridge(api, chunk_s, recorder, system_prompt="")
        node = bridge.node
        bridge.on(UserTranscriptionReceived).map(node.add_event)  # Line answers only a conversation
        sink = Bridge("sink")
        sink.on(AgentResponse).map(lambda message: recorder.chunk(message.event.content))
        self.bus.register_bridge(node.id, bridge)
        self.bus.register_bridge("sink", sink)

    async def start(self) -> None:
        await self.bus.start()
        await self.bus.broadcast(self._message(source="user", event=self._events[2](content="hello")))

    async def turn(self, turn: int) -> None:
        await self.bus.broadcast(self._message(source="user", event=self._events[1]()))

    async def interrupt(self) -> None:
        await self.bus.broadcast(self._message(source="user", event=self._events[0]()))

    async def stop(self) -> None:
        for bridge in self.bus.bridges.values():
            await bridge.stop()
        await self.bus.cleanup()


# --- Pipecat 1.14 ----------------------------------------------------------------------------------


class PipecatSession(Session):
    has_handler = False  # an interrupt cancels the processor's task; there is no handler to run

    def __init__(self, chunk_s: float) -> None:
        from pipecat.frames.frames import DataFrame, InterruptionFrame, LLMTextFrame
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.task import PipelineParams, PipelineTask
        from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

        self.recorder = recorder = Recorder()

        @dataclass
        class Answer(DataFrame):
            turn: int = 0

        self._answer, self._interruption = Answer, InterruptionFrame

        class Streamer(FrameProcessor):
            async def process_frame(self, frame: Any, direction: Any) -> None:
                await super().process_frame(frame, direction)
                if isinstance(frame, Answer):
                    async for text in chunks(frame.turn, chunk_s, recorder):
                        await self.push_frame(LLMTextFrame(text))
                else:
                    await self.push_frame(frame, direction)

        class Sink(FrameProcessor):
            async def process_frame(self, frame: Any, direction: Any) -> None:
                await super().process_frame(frame, direction)
                if isinstance(frame, LLMTextFrame):
                    recorder.chunk(frame.text)
                await self.push_frame(frame, direction)

        self.task = PipelineTask(
            Pipeline([Streamer(), Sink()]),
            params=PipelineParams(),
            enable_rtvi=False,
            idle_timeout_secs=None,
            enable_tracing=False,
            enable_turn_tracking=False,
        )
        self._direction = FrameDirection
        self._runner: asyncio.Task[None] | None = None

    async def start(self) -> None:
        from pipecat.pipeline.runner import PipelineRunner

        with warnings.catch_warnings():  # deprecated in 1.3 for WorkerRunner, which runs workers
            warnings.simplefilter("ignore", DeprecationWarning)
            runner = PipelineRunner(handle_sigint=False)
        self._runner = asyncio.create_task(runner.run(self.task))
        await asyncio.sleep(0.1)

    async def turn(self, turn: int) -> None:
        await self.task.queue_frame(self._answer(turn=turn))

    async def interrupt(self) -> None:
        await self.task.queue_frame(self._interruption())

    async def stop(self) -> None:
        await self.task.cancel()
        if self._runner is not None:
            self._runner.cancel()


SESSIONS: dict[str, Callable[[float], Session]] = {
    "bargein": BargeinSession,
    "line": LineSession,
    "pipecat": PipecatSession,
}


async def drive(session: Session, seconds: float, warmup: float, rng: random.Random) -> None:
    recorder = session.recorder
    started = time.perf_counter()
    turn = 1
    await session.turn(turn)
    while time.perf_counter() - started < warmup + seconds:
        await asyncio.sleep(rng.uniform(0.3, 1.0))
        measuring = time.perf_counter() - started >= warmup
        if measuring:
            recorder.interrupts[turn] = Interrupt(turn, time.perf_counter())
        await session.interrupt()
        await asyncio.sleep(SETTLE_S)
        turn += 1
        await session.turn(turn)


async def run(framework: str, sessions: int, seconds: float, chunk_ms: float, seed: int) -> dict[str, Any]:
    chunk_s = chunk_ms / 1000
    if framework == "bargein-distributed":
        async with Distributed(chunk_s) as cluster:
            made: list[Session] = [DistributedBargeinSession(cluster) for _ in range(sessions)]
            return await measure(framework, made, seconds, chunk_ms, seed)
    return await measure(
        framework, [SESSIONS[framework](chunk_s) for _ in range(sessions)], seconds, chunk_ms, seed
    )


async def measure(
    framework: str, made: list[Session], seconds: float, chunk_ms: float, seed: int
) -> dict[str, Any]:
    sessions = len(made)
    from loguru import logger  # after the frameworks' imports: Line's resets it to DEBUG

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    for session in made:
        await session.start()
    rng = random.Random(seed)
    warmup = 1.0
    drivers = [asyncio.create_task(drive(s, seconds, warmup, random.Random(rng.random()))) for s in made]
    await asyncio.sleep(warmup)
    for session in made:
        session.recorder.measuring = True
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*drivers)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    for session in made:
        session.recorder.measuring = False
    await asyncio.sleep(SETTLE_S)
    for session in made:
        await session.stop()
    interrupts = [i for s in made for i in s.recorder.interrupts.values()]
    return {
        "framework": framework,
        "sessions": sessions,
        "chunk_ms": chunk_ms,
        "wall_s": wall,
        "cpu_s": cpu,
        "chunks": sum(s.recorder.chunks for s in made),
        "has_handler": made[0].has_handler,
        "cancel_ms": [1000 * (i.cancelled_at - i.at) for i in interrupts if i.cancelled_at is not None],
        "last_chunk_ms": [1000 * max(0.0, (i.last_chunk_at or i.at) - i.at) for i in interrupts],
        "chunks_after": [i.chunks_after for i in interrupts],
        "handler_ran": sum(i.handler_ran for i in interrupts),
        "interrupts": len(interrupts),
        "not_cancelled": sum(i.cancelled_at is None for i in interrupts),
        "next_turn_wrong": sum(
            sum(first != 0 for turn, first in s.recorder.first_chunk.items() if turn > 1) for s in made
        )
        + sum(s.recorder.late_old for s in made),
    }


def main(argv: list[str]) -> int:
    framework, settings = argv[0], json.loads(argv[1])
    if framework not in FRAMEWORKS:
        print(json.dumps({"framework": framework, "error": f"unknown framework {framework!r}"}))
        return 2
    try:
        result = asyncio.run(run(framework, **settings))
    except ImportError as exc:
        print(
            json.dumps(
                {"framework": framework, "error": f"not installed ({exc}): pip install 'bargein[peers]'"}
            )
        )
        return 3
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
