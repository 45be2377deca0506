"""``bargein bench failover``: SIGKILL the owner mid-answer, again and again; how soon does the
caller hear the rest, and is it the rest (nothing repeated, nothing missing)?

The bench runs two reasoning processes and one edge (``bargein reasoning``, ``bargein broadcast``)
on the configured broker and Redis, with the default agent on its scripted model (replies of about
thirty words at twenty a second). For each of ``--kills`` rounds it creates a session, joins it as
a caller, asks, and after a few chunks SIGKILLs the process that holds the session's lease; it
measures the time from the kill to the next chunk at the client, then compares the whole answer with
the reply the agent was scripted to give, and starts a new reasoning process in the dead one's place.
The target is a first resumed chunk within 2 s of the kill (p50 lower), and 0 characters repeated
or missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import sys
import time
import uuid
from typing import Any, TextIO

import httpx
import redis.asyncio as aioredis
import websockets
from aio_pika.abc import AbstractRobustConnection
from websockets.asyncio.client import ClientConnection

from bargein.agent.llm import DEFAULT_REPLIES
from bargein.hosting.host import owner_pid
from bargein.settings import BrokerSettings, load
from bargein.tools.benchkit import (
    BenchError,
    Child,
    Processes,
    check_work_queue,
    forget_sessions,
    run_main,
    say,
    scripted_stack_env,
    start_service,
    summarize,
    verdict,
)
from bargein.transport import amqp_address
from bargein.wire.names import TIER_REASONING, lease_key

CHUNKS_BEFORE_KILL = 4
TARGET_MAX_S = 2.0
T = 30.0


def damage(heard: str, expected: str) -> tuple[int, int]:
    """(characters repeated or extra, characters missing) of ``heard`` against ``expected``."""
    matcher = difflib.SequenceMatcher(a=expected, b=heard, autojunk=False)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    return len(heard) - matched, len(expected) - matched


class _FailoverBench:
    def __init__(self, *, kills: int, rabbitmq_url: str, redis_url: str, out: TextIO) -> None:
        self.n_kills = kills
        self.rabbitmq_url = rabbitmq_url
        self.redis_url = redis_url
        self.out = out
        self.run_id = uuid.uuid4().hex[:8]
        self.processes = Processes(out)
        # no adoption: only the heartbeat path is measured
        self.env = scripted_stack_env(rabbitmq_url, redis_url)
        self.workers: list[Child] = []
        self.edge: Child | None = None
        self.redis: aioredis.Redis | None = None
        self.connection: AbstractRobustConnection | None = None
        self.started = 0
        self.session_ids: list[str] = []

    def say(self, text: str) -> None:
        say(self.out, text)

    async def start_worker(self) -> None:
        self.started += 1
        child = await start_service(self.processes, "reasoning", f"reasoning-{self.started}", self.env)
        self.workers.append(child)

    async def owner_of(self, session_id: str) -> Child:
        assert self.redis is not None
        async with asyncio.timeout(T):
            while (lease := await self.redis.get(lease_key(TIER_REASONING, session_id))) is None:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        pid = owner_pid(lease)
        for child in self.workers:
            if child.proc.pid == pid and child.running:
                return child
        raise BenchError(
            f"session {session_id} is owned by pid {pid}, which is not one of the bench's workers"
        )

    async def one_kill(self, client: httpx.AsyncClient) -> dict[str, Any]:
        assert self.edge is not None
        created = (await client.post(f"{self.edge.url}/v1/sessions", json={})).json()
        self.session_ids.append(created["session_id"])
        url = f"{created['ws_url']}?token={created['token']}"
        async with websockets.connect(url, max_size=None) as ws:
            await ws.send(json.dumps({"type": "text", "text": "what is the weather like?"}))
            chunks: list[dict[str, Any]] = []
            while len(chunks) < CHUNKS_BEFORE_KILL:
                frame = await self._frame(ws)
                if frame["type"] == "agent_chunk":
                    chunks.append(frame)
            victim = await self.owner_of(created["session_id"])
            victim.proc.kill()
            killed = time.perf_counter()
            resumed = None
            while True:
                frame = await self._frame(ws)
                if frame["type"] == "agent_chunk":
                    chunks.append(frame)
                    if resumed is None:
                        resumed = time.perf_counter() - killed
                elif frame["type"] == "turn_complete":
                    break
            await ws.send(json.dumps({"type": "end"}))
        await victim.proc.wait()
        self.workers.remove(victim)
        heard = "".join(c["text"] for c in chunks)
        repeated, missing = damage(heard, DEFAULT_REPLIES[0])
        return {"resumed_s": resumed, "repeated": repeated, "missing": missing}

    async def _frame(self, ws: ClientConnection) -> dict[str, Any]:
        try:
            frame: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), T))
        except TimeoutError:
            tails = "\n".join(f"  {child.name}:\n{child.last_output()}" for child in self.processes.children)
            raise BenchError(f"the caller heard nothing for {T:.0f} s; the services said:\n{tails}") from None
        return frame

    async def run(self) -> dict[str, Any]:
        self.say(f"bench failover (run {self.run_id}): {self.n_kills} kills of the owner mid-answer")
        try:
            self.redis = aioredis.Redis.from_url(self.redis_url)
            try:
                self.connection = await amqp_address.connect_robust(self.rabbitmq_url)
            except Exception as exc:
                raise BenchError(f"RabbitMQ is not reachable ({type(exc).__name__}: {exc})") from exc
            await check_work_queue(self.connection, expected_consumers=0)
            for _ in range(2):
                await self.start_worker()
            self.edge = await start_service(self.processes, "broadcast", "edge", self.env)
            rounds = []
            async with httpx.AsyncClient(timeout=T) as client:
                for i in range(self.n_kills):
                    result = await self.one_kill(client)
                    rounds.append(result)
                    self.say(
                        f"  kill {i + 1}/{self.n_kills}: resumed after {result['resumed_s'] * 1000:.0f} ms, "
                        f"{result['repeated']} repeated, {result['missing']} missing"
                    )
                    await self.start_worker()  # two workers again, as before the kill
            return self.report(rounds)
        finally:
            await self.processes.stop()
            if self.redis is not None:
                await self.redis.aclose()
            if self.connection is not None:
                with contextlib.suppress(Exception):
                    await self.connection.close()
            await forget_sessions(self.rabbitmq_url, self.redis_url, self.session_ids, self.out)

    def report(self, rounds: list[dict[str, Any]]) -> dict[str, Any]:
        resumed = summarize([r["resumed_s"] for r in rounds if r["resumed_s"] is not None])
        repeated = sum(r["repeated"] for r in rounds)
        missing = sum(r["missing"] for r in rounds)
        met = resumed["max_ms"] <= TARGET_MAX_S * 1000
        clean = repeated == 0 and missing == 0
        self.say("")
        self.say(
            f"  kill → first resumed chunk: p50 {resumed['p50_ms']:.0f} ms, max {resumed['max_ms']:.0f} ms "
            f"(target ≤ {TARGET_MAX_S * 1000:.0f} ms: {verdict(met)})"
        )
        self.say(f"  characters repeated {repeated}, missing {missing} (target 0: {verdict(clean)})")
        return {
            "run_id": self.run_id,
            "kills": len(rounds),
            "resumed": resumed,
            "repeated": repeated,
            "missing": missing,
            "target_met": met,
            "clean": clean,
        }


async def run_failover_bench(
    kills: int = 20, rabbitmq_url: str | None = None, redis_url: str | None = None, out: TextIO | None = None
) -> dict[str, Any]:
    """Run the bench and return its numbers (also printed to ``out``, default stdout)."""
    if kills < 1:
        raise ValueError(f"kills must be at least 1, got {kills}")
    broker = load(BrokerSettings)
    bench = _FailoverBench(
        kills=kills,
        rabbitmq_url=rabbitmq_url or broker.rabbitmq_url,
        redis_url=redis_url or broker.redis_url,
        out=out if out is not None else sys.stdout,
    )
    return await bench.run()


def failover_main(kills: int = 20) -> int:
    """``bargein bench failover``: run the bench, print the report."""
    return run_main(lambda: run_failover_bench(kills), "failover")
