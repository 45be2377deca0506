"""A speech process dies: another adopts its sessions' audio, and turn-taking carries on."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from websockets.asyncio.client import ClientConnection

from bargein.tools.call import frames_of, read_wav
from bargein.wire.names import TIER_SPEECH, lease_key
from tests.client import Frame, connect, create_session, until
from tests.faults.stack import FaultStack, fault_stack

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "audio"
T = 30.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultStack]:
    base = Path(tmp_path_factory.mktemp("speech"))
    with fault_stack(base, reasoning=1, speech=2, BARGEIN_AGENT="bargein.examples.default:agent") as running:
        yield running


async def speak(ws: ClientConnection, pcm: bytes) -> None:
    """Send ``pcm`` as 20 ms frames, four times faster than real time (speech detection counts
    windows, not wall-clock time), then a second of silence so the turn's end is heard."""
    for frame in frames_of(pcm + bytes(32_000)):
        await ws.send(frame)
        await asyncio.sleep(0.005)


async def test_a_killed_speech_owners_sessions_keep_being_heard(stack: FaultStack) -> None:
    pcm = read_wav(FIXTURES / "one_utterance.wav")
    session = await create_session(stack.url)
    client = aioredis.Redis.from_url(stack.redis.url)
    try:
        async with connect(session) as ws:
            frames: list[Frame] = []
            await speak(ws, pcm)
            await until(ws, "user_started_speaking", frames, T)
            await until(ws, "user_stopped_speaking", frames, T)
            await until(ws, "turn_complete", frames, T)  # the agent answered the spoken turn

            lease = await client.get(lease_key(TIER_SPEECH, session["session_id"]))
            assert lease is not None
            pid = int(lease.decode().rsplit(":", 1)[0].split("-")[-2])
            owner = next(p for p in stack.role("speech") if p.pid == pid)
            owner.kill()

            frames.clear()
            await speak(ws, pcm)  # what the caller says while its speech owner is dead waits for the next
            await until(ws, "user_started_speaking", frames, T)
            await until(ws, "user_stopped_speaking", frames, T)
            await until(ws, "turn_complete", frames, T)
            new_lease = await client.get(lease_key(TIER_SPEECH, session["session_id"]))
            assert new_lease is not None and str(pid) not in new_lease.decode().split(":")[0]
    finally:
        await client.aclose()
