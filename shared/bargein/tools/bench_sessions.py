"""``bargein bench sessions``: how fast sessions are created, and what an idle one costs where.

The bench runs one reasoning, one speech and one edge process (``bargein reasoning|speech|
broadcast``) on the configured broker and Redis, then creates ``--sessions`` sessions the way a
client does (``POST /v1/sessions``, join as the caller, say something, wait for the first chunk of
the answer), ``--concurrency`` at a time. It reports sessions created per second (including that
first answer) and, with all of them idle and their callers still connected, the resident memory per
session of each service process, of RabbitMQ (when ``rabbitmqctl`` can reach the node) and of
Redis: the growth over the same figure before the first session, divided by the sessions.
At the end every session is hung up, the bench waits until the services have ended them, stops the
processes and forgets any record left, so the next run (or test suite) does not adopt them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal, TextIO

import httpx
import redis.asyncio as aioredis
import websockets
from websockets.asyncio.client import ClientConnection

from bargein.settings import BrokerSettings, load
from bargein.tasks import cancel_and_wait
from bargein.tools.benchkit import (
    BenchError,
    Child,
    Processes,
    check_work_queue,
    forget_sessions,
    run_main,
    say,
    scripted_stack_env,
    start_llm_server,
    start_service,
)
from bargein.transport import amqp_address
from bargein.wire.names import TIER_REASONING, session_directory_key

log = logging.getLogger("bargein.bench")

SETTLE_S = 3.0  # after the last session, before memory is read (queues and buffers settle)
T = 60.0
SERVICES = ("reasoning", "speech", "broadcast")
# the agent's model: the scripted client in the reasoning process, or the same answers from an
# OpenAI-compatible server (bargein.tools.llm_server) over HTTP, the path a deployment takes
LLMChoice = Literal["scripted", "server"]
HANG_UP_WAIT_S = 60.0  # for the services to end every session after the callers hung up


def rss_bytes(pid: int) -> int | None:
    """A process's resident set size (Linux /proc), or None where that is not available."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# the CLI boots an Erlang node of its own each call: on a busy machine it fails now and then
RABBITMQCTL_TRIES = 3


def rabbitmqctl(node: str | None, *args: str, timeout_s: float = 30, tries: int = 1) -> str | None:
    """What ``rabbitmqctl`` answers on ``node`` (None: the CLI's default node), or None when it is
    not installed here, cannot reach the node or fails ``tries`` times: every broker figure the
    benches read comes through here, and one that cannot be read is reported as not measured."""
    if shutil.which("rabbitmqctl") is None:
        return None
    which = ["-n", node] if node is not None else []
    for attempt in range(tries):
        try:
            done = subprocess.run(
                ["rabbitmqctl", *which, *args], capture_output=True, timeout=timeout_s, check=True
            )
            return done.stdout.decode()
        except (OSError, subprocess.SubprocessError) as exc:
            if tries > 1:
                log.warning(
                    "rabbitmqctl %s failed (try %d of %d): %s", " ".join(args), attempt + 1, tries, exc
                )
                time.sleep(1.0)
    return None


def broker_eval(node: str | None, expression: str) -> str | None:
    """An Erlang expression evaluated on a RabbitMQ node, as the CLI prints its value."""
    return rabbitmqctl(node, "-q", "eval", expression)


def rabbitmq_bytes(node: str | None = None) -> int | None:
    """The memory the RabbitMQ node uses (``node``: another than the CLI's default), if
    ``rabbitmqctl`` is here and may talk to it."""
    status = rabbitmqctl(node, "-q", "status", "--formatter", "json", tries=RABBITMQCTL_TRIES)
    try:
        total = json.loads(status)["memory"]["total"] if status is not None else None
        return None if total is None else int(total["erlang"] if isinstance(total, dict) else total)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("rabbitmqctl status answered what is not a memory figure: %s", exc)
        return None


def rabbitmq_total(nodes: list[str]) -> int | None:
    """The memory of every node of a cluster (:func:`broker_nodes`), if each told; None when no
    node was found or one did not tell: not measured, rather than part of it."""
    figures = [rabbitmq_bytes(node) for node in nodes]
    return None if not figures or None in figures else sum(f for f in figures if f is not None)


# every node of the cluster with its AMQP port: [{rabbit@host,5672}, ...]
_LISTENERS = (
    "[{element(2, L), element(6, L)} || L <- rabbit_networking:active_listeners(), element(3, L) =:= amqp]."
)
_NODE_PORT = re.compile(r"\{'?([^,'{}]+@[^,'{}]+)'?,(\d+)\}")


async def broker_nodes(rabbitmq_url: str) -> list[str]:
    """The RabbitMQ nodes behind ``rabbitmq_url``, by name, for ``rabbitmqctl -n`` to measure: the
    cluster of the CLI's default node, or of the node the broker names itself after (its cluster
    name, by default its first node's name with the machine's full host name, which the node itself
    may not go by: tried as it is, on ``localhost`` and on the short host name), whichever listens
    on the URL's port; [] if neither does (a broker on another machine,
    or one the CLI may not talk to): its figures are then not measured, rather than another
    node's (the benches read the default node's whatever the URL said, before)."""
    connection = await amqp_address.connect_robust(rabbitmq_url)
    async with connection:
        underlay = connection.transport  # the connection made: its server's properties
        named = underlay.connection.server_properties.get("cluster_name") if underlay else None
        port = connection.url.port or 5672  # of the address it reached
    candidates: list[str | None] = [None]  # the CLI's default node
    if isinstance(named, str) and "@" in named:  # by name, on the host it gives or as this machine
        prefix = named.partition("@")[0]
        candidates += [named, f"{prefix}@localhost", f"{prefix}@{socket.gethostname()}"]
    for node in dict.fromkeys(candidates):
        nodes = await asyncio.to_thread(_cluster_listening_on, node, port)
        if nodes:
            return nodes
    return []


def _cluster_listening_on(node: str | None, port: int) -> list[str]:
    """The nodes of ``node``'s cluster (None: the CLI's default node), if one of them takes AMQP
    on ``port``."""
    answer = broker_eval(node, _LISTENERS) or ""
    listening = [(name, int(number)) for name, number in _NODE_PORT.findall(answer)]
    return sorted({name for name, _ in listening}) if any(p == port for _, p in listening) else []


class _SessionsBench:
    def __init__(
        self,
        *,
        sessions: int,
        concurrency: int,
        rabbitmq_url: str,
        redis_url: str,
        out: TextIO,
        llm: LLMChoice = "scripted",
    ) -> None:
        self.n_sessions = sessions
        self.llm = llm
        self.concurrency = concurrency
        self.rabbitmq_url = rabbitmq_url
        self.redis_url = redis_url
        self.out = out
        self.run_id = uuid.uuid4().hex[:8]
        self.processes = Processes(out)
        self.env = scripted_stack_env(rabbitmq_url, redis_url, BARGEIN_MAX_SESSIONS=str(sessions + 50))
        self.children: dict[str, Child] = {}
        self.sockets: list[ClientConnection] = []
        # each caller reads what it is sent, as a client does; by socket, since the callers get
        # their first chunk (and their reader) in another order than they connected
        self.readers: dict[ClientConnection, asyncio.Task[None]] = {}
        self.session_ids: list[str] = []
        self.redis: aioredis.Redis | None = None
        # the nodes whose memory is the broker's (None: not looked up yet, stack() does it)
        self.rabbit_nodes: list[str] | None = None

    def say(self, text: str) -> None:
        say(self.out, text)

    async def memory(self) -> dict[str, int | None]:
        assert self.redis is not None
        figures: dict[str, int | None] = {
            name: rss_bytes(child.proc.pid) for name, child in self.children.items()
        }
        figures["rabbitmq"] = await asyncio.to_thread(rabbitmq_total, self.rabbit_nodes or [])
        figures["redis"] = int((await self.redis.info("memory"))["used_memory"])
        return figures

    async def create_one(self, client: httpx.AsyncClient, edge: str) -> None:
        response = await client.post(f"{edge}/v1/sessions", json={})
        if response.status_code != 201:
            raise BenchError(f"POST /v1/sessions answered {response.status_code}: {response.text[:200]}")
        created = response.json()
        self.session_ids.append(created["session_id"])
        ws = await websockets.connect(f"{created['ws_url']}?token={created['token']}", max_size=None)
        self.sockets.append(ws)
        await ws.send(json.dumps({"type": "text", "text": "hello"}))
        try:
            async with asyncio.timeout(T):
                while json.loads(await ws.recv())["type"] != "agent_chunk":
                    pass
        except TimeoutError:
            raise BenchError(
                f"session {created['session_id']}: no answer to its first turn in {T:.0f} s"
            ) from None
        # the rest is read and dropped: a caller that stops reading fills its socket's queue, misses
        # the keepalive pings and is dropped after a while (and its hang-up with it)
        self.readers[ws] = asyncio.create_task(self._drain(ws))

    @staticmethod
    async def _drain(ws: ClientConnection) -> None:
        with contextlib.suppress(websockets.ConnectionClosed):
            async for _ in ws:
                pass

    def connected(self) -> int:
        return sum(not reader.done() for reader in self.readers.values())

    async def create_all(self, edge: str, count: int | None = None) -> float:
        """Create ``count`` more sessions (all of ``--sessions`` by default); returns how many a
        second."""
        count = self.n_sessions if count is None else count
        self.say(f"creating {count} sessions, {self.concurrency} at a time")
        todo = iter(range(count))
        done = 0
        started = time.perf_counter()
        last_said = started

        async def creator(client: httpx.AsyncClient) -> None:
            nonlocal done, last_said
            for _ in todo:
                await self.create_one(client, edge)
                done += 1
                if time.perf_counter() - last_said > 5:
                    last_said = time.perf_counter()
                    self.say(f"  {done}/{count} ({done / (last_said - started):.1f}/s)")

        async with httpx.AsyncClient(timeout=T) as client:
            await asyncio.gather(*(creator(client) for _ in range(self.concurrency)))
        return count / (time.perf_counter() - started)

    async def take_over(self, index: int) -> ClientConnection:
        """The ``index``-th caller's socket, no longer read by its drain (the caller reads it)."""
        reader = self.readers[self.sockets[index]]
        await cancel_and_wait(reader)
        return self.sockets[index]

    def give_back(self, index: int) -> None:
        """The ``index``-th caller's socket is read and dropped again."""
        ws = self.sockets[index]
        self.readers[ws] = asyncio.create_task(self._drain(ws))

    async def registered(self) -> int:
        """How many of the bench's sessions the reasoning tier still has in its directory."""
        assert self.redis is not None
        if not self.session_ids:
            return 0
        found = await self.redis.hmget(session_directory_key(TIER_REASONING), self.session_ids)
        return sum(entry is not None for entry in found)

    async def hang_up(self) -> None:
        """End every session as a caller would, and wait (a while) until the services have."""
        unsent = 0
        for ws in self.sockets:
            try:
                await ws.send(json.dumps({"type": "end"}))
            except Exception:  # that caller's socket is gone: its session ends when it goes idle
                unsent += 1
        if unsent:
            self.say(f"  {unsent} callers could not hang up: their sockets had closed")
        deadline = time.monotonic() + HANG_UP_WAIT_S
        with contextlib.suppress(Exception):  # whatever is left is forgotten after the services stop
            while (left := await self.registered()) and time.monotonic() < deadline:
                self.say(f"  hanging up: {left} sessions still open")
                await asyncio.sleep(1.0)
        for ws in self.sockets:
            with contextlib.suppress(Exception):
                await ws.close()
        for reader in self.readers.values():
            reader.cancel()

    @contextlib.asynccontextmanager
    async def stack(self) -> AsyncIterator[dict[str, int | None]]:
        """The services running, with the memory figures before any session; on the way out
        every session hung up, the services stopped and what they left forgotten."""
        try:
            self.redis = aioredis.Redis.from_url(self.redis_url)
            try:
                connection = await amqp_address.connect_robust(self.rabbitmq_url)
            except Exception as exc:
                raise BenchError(f"RabbitMQ is not reachable ({type(exc).__name__}: {exc})") from exc
            async with connection:
                await check_work_queue(connection, expected_consumers=0)
            if self.rabbit_nodes is None:
                self.rabbit_nodes = await broker_nodes(self.rabbitmq_url)
                self.say(f"  the broker's memory is read on {', '.join(self.rabbit_nodes) or 'no node'}")
                if not self.rabbit_nodes:
                    self.say(f"  (rabbitmqctl here reaches no node listening at {self.rabbitmq_url})")
            if self.llm == "server":  # the agent's answers over HTTP, as in a deployment
                self.children["llm"], url = await start_llm_server(self.processes)
                self.env["BARGEIN_LLM_BASE_URL"] = url
                self.say(f"  the agent's model: an OpenAI-compatible server at {url}")
            for service in SERVICES:
                self.children[service] = await start_service(self.processes, service, service, self.env)
            await asyncio.sleep(SETTLE_S)
            yield await self.memory()
        finally:
            await self.hang_up()
            if "llm" in self.children:
                await self.say_model_answers()
            await self.processes.stop()
            if self.redis is not None:
                await self.redis.aclose()
            await forget_sessions(self.rabbitmq_url, self.redis_url, self.session_ids, self.out)

    async def say_model_answers(self) -> None:
        """How many answers the model server streamed: the stack asked it, not a model of its own."""
        url = self.env["BARGEIN_LLM_BASE_URL"].removesuffix("/v1") + "/stats"
        try:
            async with httpx.AsyncClient(timeout=5) as client:
                answered = (await client.get(url)).json()["answered"]
        except Exception as exc:  # the bench's numbers stand without it
            self.say(f"  the model server could not say how many it answered ({type(exc).__name__})")
            return
        self.say(f"  the model server streamed {answered} answers")

    async def run(self) -> dict[str, Any]:
        self.say(f"bench sessions (run {self.run_id}): {self.n_sessions} sessions")
        async with self.stack() as before:
            rate = await self.create_all(self.children["broadcast"].url)
            await asyncio.sleep(SETTLE_S)
            after = await self.memory()
            return self.report(rate, before, after)

    def report(
        self, rate: float, before: dict[str, int | None], after: dict[str, int | None]
    ) -> dict[str, Any]:
        per_session = growth_per_session(before, after, self.n_sessions)
        self.say("")
        self.say(f"  sessions created per second (with the first answer): {rate:.1f}")
        connected = self.connected()
        self.say(f"  memory per idle session ({self.n_sessions} sessions, {connected} callers connected):")
        for name, value in per_session.items():
            shown = "n/a" if value is None else f"{value / 1024:,.1f} KB"
            if value is not None and value < 0:  # a few sessions weigh less than the process's own churn
                shown += " (it freed more than the sessions took: too few sessions to measure)"
            self.say(f"    {name:<10} {shown}")
        return {
            "run_id": self.run_id,
            "sessions": self.n_sessions,
            "per_s": rate,
            "bytes": per_session,
            "connected": connected,
        }


def growth_per_session(
    before: dict[str, int | None], after: dict[str, int | None], sessions: int
) -> dict[str, float | None]:
    """Each process's memory growth over ``sessions`` (None where a figure is missing)."""
    per_session: dict[str, float | None] = {}
    for name in (*SERVICES, "rabbitmq", "redis"):
        low, high = before.get(name), after.get(name)
        per_session[name] = None if low is None or high is None else (high - low) / sessions
    return per_session


async def run_sessions_bench(
    sessions: int = 1000,
    concurrency: int = 20,
    rabbitmq_url: str | None = None,
    redis_url: str | None = None,
    out: TextIO | None = None,
    llm: LLMChoice = "scripted",
) -> dict[str, Any]:
    """Run the bench and return its numbers (also printed to ``out``, default stdout)."""
    if sessions < 1 or concurrency < 1:
        raise ValueError("sessions and concurrency must be at least 1")
    broker = load(BrokerSettings)
    bench = _SessionsBench(
        sessions=sessions,
        concurrency=concurrency,
        rabbitmq_url=rabbitmq_url or broker.rabbitmq_url,
        redis_url=redis_url or broker.redis_url,
        out=out if out is not None else sys.stdout,
        llm=llm,
    )
    return await bench.run()


def sessions_main(sessions: int = 1000, concurrency: int = 20, llm: LLMChoice = "scripted") -> int:
    """``bargein bench sessions``: run the bench, print the report."""
    return run_main(lambda: run_sessions_bench(sessions, concurrency, llm=llm), "sessions")
