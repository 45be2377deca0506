"""A caller's hang-up, whatever state the agent and the broker are in (issue 27's mass hang-up).

Its own stack: the agent's process is frozen, so no other test's workers may be running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path

from bargein.transport.redis_store import RedisStateStore
from bargein.wire.names import TIER_REASONING, TIER_SPEECH
from tests.client import Frame, connect, create_session, say, until
from tests.integration.cluster import Cluster, cluster_env, reset_shared_queues

T = 15.0


async def test_a_hang_up_is_never_refused_while_the_agent_is_behind(
    rabbitmq_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Issue 27's mass hang-up: 821 of 2,600 callers who said ``end`` at once were told
    ``unavailable`` (the broker took longer than ``BARGEIN_BROKER_WAIT_S`` to take their hang-ups),
    and their sessions went on. Here the agent's process is frozen until its mailbox is full, so
    the hang-up cannot be delivered for a while: the caller is told ``ended`` at once all the same,
    and the session ends on every tier once the agent can hear it. (The caller used to be told
    ``ended`` here too, by the edge's own copy of the hang-up, while the agent's full mailbox
    refused it: the agent never heard it and the session lived on.)"""
    await asyncio.to_thread(reset_shared_queues, rabbitmq_url, redis_url)
    env = cluster_env(
        rabbitmq_url,
        redis_url,
        BARGEIN_PORT="0",
        BARGEIN_QUEUE_MAX_MESSAGES="10",
        BARGEIN_BROKER_WAIT_S="1",
        BARGEIN_LEASE_TTL_MS="10000",  # the freeze is not a death: nobody takes the session over
    )
    with Cluster(env, tmp_path) as cluster:
        worker = cluster.start()
        session = await create_session(
            cluster.start_edge(), agent_options={"agent": "tests.integration.agents:probe", "tail": 5}
        )
        sid = session["session_id"]
        store = RedisStateStore.from_url(redis_url)
        try:
            async with connect(session) as ws:
                await say(ws, "hello")
                await until(ws, "turn_complete")
                worker.proc.send_signal(signal.SIGSTOP)
                try:
                    refused: Frame | None = None
                    for n in range(20):  # each text is three messages: the mailbox fills
                        await say(ws, f"more {n}")
                        with contextlib.suppress(TimeoutError):
                            refused = await until(ws, "error", timeout=1.5)
                            break
                    assert refused is not None and refused["code"] == "unavailable", refused
                    await ws.send(json.dumps({"type": "end"}))
                    frames: list[Frame] = []
                    ended = await until(ws, "ended", frames, timeout=5)
                    assert ended["reason"] == "caller"
                    assert not [f for f in frames if f["type"] == "error"], frames
                    await asyncio.sleep(3)  # the agent stays behind for longer than a publisher waits
                finally:
                    worker.proc.send_signal(signal.SIGCONT)
            deadline = time.monotonic() + T
            while any([await store.session_info(tier, sid) for tier in (TIER_REASONING, TIER_SPEECH)]):
                assert time.monotonic() < deadline, cluster.logs()
                await asyncio.sleep(0.2)
        finally:
            await store.close()


async def test_a_hang_up_reaches_a_speech_owner_that_was_slow_and_its_side_stays_ended(
    rabbitmq_url: str, redis_url: str, tmp_path: Path
) -> None:
    """The edge told the speech owner of a hang-up, then deleted the speech side's mailbox itself,
    with the hang-up still in it when the owner was slow (frozen here; busy with a thousand others
    in issue 27's mass hang-up): the owner never heard it, consumed its mailbox again, and the
    call lived on in the speech tier. An owned side is its owner's to end."""
    await asyncio.to_thread(reset_shared_queues, rabbitmq_url, redis_url)
    env = cluster_env(
        rabbitmq_url, redis_url, BARGEIN_PORT="0", BARGEIN_LEASE_TTL_MS="10000"
    )  # the freeze is not a death: nobody takes the session over
    with Cluster(env, tmp_path) as cluster:
        cluster.start()
        speech = cluster.start("services.speech")
        session = await create_session(cluster.start_edge())
        sid = session["session_id"]
        store = RedisStateStore.from_url(redis_url)
        try:
            deadline = time.monotonic() + T
            while await store.session_info(TIER_SPEECH, sid) is None:  # the speech tier owns it
                assert time.monotonic() < deadline, cluster.logs()
                await asyncio.sleep(0.1)
            async with connect(session) as ws:
                speech.proc.send_signal(signal.SIGSTOP)
                try:
                    await ws.send(json.dumps({"type": "end"}))
                    assert (await until(ws, "ended", timeout=5))["reason"] == "caller"
                    await asyncio.sleep(2)  # the edge has done all it does for a hang-up
                finally:
                    speech.proc.send_signal(signal.SIGCONT)
            deadline = time.monotonic() + T
            while f"session {sid} ended" not in speech.log():  # the owner heard the hang-up
                assert time.monotonic() < deadline, cluster.logs()
                await asyncio.sleep(0.2)
            await asyncio.sleep(2)  # and its side stays ended: nothing wrote it back
            assert await store.session_info(TIER_SPEECH, sid) is None, cluster.logs()
            assert await store.session_info(TIER_REASONING, sid) is None, cluster.logs()
        finally:
            await store.close()
