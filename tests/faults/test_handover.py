"""A session moves to another process, and the caller notices nothing: SIGTERM, SIGKILL, and a
barge-in while the owner is dead.

The stack runs the default agent at product defaults (scripted replies of about 30 words at 20 a
second). Its replies are chosen by how many answers the history holds, so an answer the history
forgot shows up as the same reply twice: that is how "no answer is repeated" is checked.

Measured before the fixes: a SIGTERM drain always took the full 10 s; after a barge-in while the
owner was dead, the next answer repeated the cut one (6 of 6), because what the caller had heard was
not in the checkpoint and delivery reports could not add text back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import ClientConnection

from bargein.agent.llm import DEFAULT_REPLIES
from bargein.agent.nodes import ReasoningNode
from bargein.runtime import journal, snapshot
from bargein.transport.redis_store import RedisStateStore
from bargein.wire.names import TIER_REASONING, lease_key
from tests.client import Frame, connect, create_session, recv, say, until
from tests.faults.stack import FaultStack, fault_stack
from tests.integration.cluster import ServiceProcess

AGENT = "bargein.examples.default:agent"
T = 30.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    base = Path(tmp_path_factory.mktemp("handover"))
    with fault_stack(base, reasoning=2, speech=0, BARGEIN_AGENT=AGENT) as running:
        yield running


@pytest.fixture(autouse=True)
def two_workers(stack: FaultStack) -> Iterator[None]:
    """Every test starts with two reasoning processes, whatever the last one killed."""
    while len(stack.role("reasoning")) < 2:
        stack.start("reasoning")
    yield


async def owner_of(redis: aioredis.Redis, stack: FaultStack, session_id: str) -> ServiceProcess:
    """The reasoning process holding the session's lease (its owner id ends in <pid>-<random>)."""
    async with asyncio.timeout(T):
        while (lease := await redis.get(lease_key(TIER_REASONING, session_id))) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    pid = int(lease.decode().rsplit(":", 1)[0].split("-")[-2])
    return next(p for p in stack.role("reasoning") if p.pid == pid)


async def history(redis: aioredis.Redis, session_id: str) -> list[tuple[str, str]]:
    """The conversation as the session's checkpoint holds it (what the model sees next)."""
    store = RedisStateStore(redis)  # the checkpoint as the next owner reads it: record and log
    checkpoint = await journal.read(store, TIER_REASONING, session_id)
    assert checkpoint is not None
    nodes = checkpoint[0]["nodes"]
    node = ReasoningNode()
    snapshot.restore(node, next(iter(nodes.values())))
    return [(m["role"], m["content"]) for m in node.history_messages()]


async def history_of(redis: aioredis.Redis, session_id: str, entries: int) -> list[tuple[str, str]]:
    """The checkpointed history once it holds ``entries`` messages: the owner writes it right after
    the turn ends, a moment after the client saw ``turn_complete``."""
    async with asyncio.timeout(T):
        while len(found := await history(redis, session_id)) < entries:  # noqa: ASYNC110 - Redis
            await asyncio.sleep(0.05)
    return found


def text_of(frames: list[Frame], turn: int | None = None) -> str:
    return "".join(f["text"] for f in frames if f["type"] == "agent_chunk" and turn in (None, f["turn"]))


async def take_chunks(ws: ClientConnection, n: int, frames: list[Frame]) -> None:
    while sum(1 for f in frames if f["type"] == "agent_chunk") < n:
        frames.append(await recv(ws, T))


async def arrives_whole(ws: ClientConnection, log: list[Frame], reply: str, timeout: float = T) -> None:
    """The answer under way (its frames so far in ``log``) ends, with no error frame: all of
    ``reply`` (nothing missing), its chunks numbered 0, 1, 2... (nothing repeated)."""
    done = await until(ws, "turn_complete", log, timeout)
    assert not [f for f in log if f["type"] == "error"], log
    assert text_of(log, turn=done["turn"]) == reply
    seqs = [f["seq"] for f in log if f["type"] == "agent_chunk"]
    assert seqs == list(range(len(seqs)))


async def test_a_draining_owner_lets_its_answers_finish_then_hands_its_sessions_over(
    stack: FaultStack, redis: aioredis.Redis
) -> None:
    sessions = [await create_session(stack.url) for _ in range(6)]
    async with contextlib_all(sessions) as sockets:
        frames: list[list[Frame]] = [[] for _ in sessions]
        for ws in sockets:
            await say(ws, "hello")
        for ws, log in zip(sockets, frames, strict=True):
            await take_chunks(ws, 2, log)
        owner = await owner_of(redis, stack, sessions[0]["session_id"])
        started = time.monotonic()
        draining = asyncio.create_task(asyncio.to_thread(owner.terminate, 30.0))
        await asyncio.sleep(0.2)
        for ws in sockets:  # the callers go on talking while their owner drains
            await say(ws, "and then?")
        code = await draining
        drained_in = time.monotonic() - started
        assert code == 0
        # the running answers were cut by the callers' new questions, and the new turns wait for
        # the next owner: the drain is over in about the time it takes to stop a process
        assert drained_in < 3.0, f"the drain took {drained_in:.1f} s"
        for ws, log in zip(sockets, frames, strict=True):
            while not any(f["type"] == "turn_complete" and f["turn"] == 2 for f in log):
                log.append(await recv(ws, T))
            assert text_of(log, turn=2) == DEFAULT_REPLIES[1]  # the next reply, once, not the first again
            seqs = [f["seq"] for f in log if f["type"] == "agent_chunk" and f["turn"] == 2]
            assert seqs == list(range(len(seqs)))  # nothing repeated, nothing missing
            heard = text_of(log, turn=1)
            assert DEFAULT_REPLIES[0].startswith(heard)  # cut off by the second question
        survivor = next(p for p in stack.role("reasoning"))
        for session in sessions:  # every session now lives in the other process
            assert (await owner_of(redis, stack, session["session_id"])).pid == survivor.pid


async def test_what_the_caller_heard_survives_a_kill_and_a_barge_in_while_the_owner_is_dead(
    stack: FaultStack, redis: aioredis.Redis
) -> None:
    session = await create_session(stack.url)
    sid = session["session_id"]
    async with connect(session) as ws:
        await say(ws, "hello")
        frames: list[Frame] = []
        await take_chunks(ws, 5, frames)
        (await owner_of(redis, stack, sid)).kill()
        await say(ws, "wait, another question")  # the caller talks over an answer whose owner is dead
        heard = text_of(frames, turn=1)
        log: list[Frame] = []
        clear = await until(ws, "clear", log, T)
        heard += text_of(log, turn=1)  # what reached the caller before the clear
        assert clear["turn"] == 1
        log.clear()
        done = await until(ws, "turn_complete", log, T)
        assert text_of(log, turn=done["turn"]) == DEFAULT_REPLIES[1]  # not the cut answer again
        assert await history_of(redis, sid, 4) == [
            ("user", "hello"),
            ("assistant", heard),  # exactly what the caller heard, no more, no less
            ("user", "wait, another question"),
            ("assistant", DEFAULT_REPLIES[1]),
        ]
        log.clear()
        await say(ws, "and a third")
        done = await until(ws, "turn_complete", log, T)
        assert text_of(log, turn=done["turn"]) == DEFAULT_REPLIES[2]


async def test_a_killed_owners_answers_resume_within_two_seconds_whole(
    stack: FaultStack, redis: aioredis.Redis
) -> None:
    sessions = [await create_session(stack.url) for _ in range(6)]
    async with contextlib_all(sessions) as sockets:
        frames: list[list[Frame]] = [[] for _ in sessions]
        for ws in sockets:
            await say(ws, "hello")
        for ws, log in zip(sockets, frames, strict=True):
            await take_chunks(ws, 3, log)
        victim = await owner_of(redis, stack, sessions[0]["session_id"])
        owners = [await owner_of(redis, stack, s["session_id"]) for s in sessions]
        victim.kill()
        killed_at = time.monotonic()
        before = [len(log) for log in frames]
        # read every socket at once: a frame's _received is when it was read, not when it arrived
        await asyncio.gather(
            *(until(ws, "turn_complete", log, T) for ws, log in zip(sockets, frames, strict=True))
        )
        resumed_after: list[float] = []
        for log, start, owner in zip(frames, before, owners, strict=True):
            if owner.pid == victim.pid:
                new = [f for f in log[start:] if f["type"] == "agent_chunk"]
                assert new, "nothing arrived after the kill"
                resumed_after.append(new[0]["_received"] - killed_at)
        for log in frames:
            seqs = [f["seq"] for f in log if f["type"] == "agent_chunk"]
            assert seqs == list(range(len(seqs)))  # nothing repeated, nothing missing
            assert text_of(log) == DEFAULT_REPLIES[0]
        assert resumed_after and max(resumed_after) <= 2.0, resumed_after
        for session in sessions:  # all of them now live in the survivor
            assert (await owner_of(redis, stack, session["session_id"])).pid != victim.pid


class contextlib_all:
    """Connect to every session at once, as callers; close them all at the end."""

    def __init__(self, sessions: list[dict[str, Any]]) -> None:
        self._managers = [connect(s) for s in sessions]

    async def __aenter__(self) -> list[ClientConnection]:
        return [await m.__aenter__() for m in self._managers]

    async def __aexit__(self, *exc: object) -> None:
        for manager in self._managers:
            await manager.__aexit__(None, None, None)
