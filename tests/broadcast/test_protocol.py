"""The client protocol (docs/protocol.md) over real WebSockets, against real services.

A broadcast process and two reasoning processes run against the local RabbitMQ and Redis; the test
is a WebSocket client (or several) speaking the protocol, as a browser or `bargein call` would.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import pytest
import websockets

from bargein.agent.events import AgentResponse
from bargein.edge.tokens import Tokens
from bargein.runtime import journal
from bargein.transport.redis_store import RedisStateStore
from bargein.wire.envelope import Envelope, encode
from bargein.wire.names import EVENTS_EXCHANGE, OUT, TIER_REASONING, lease_key, routing_key
from bargein.wire.session_info import SessionInfo
from tests.client import Frame, chunks, connect, create_session, recv, say, until
from tests.integration.cluster import Cluster, cluster_env, reset_shared_queues

T = 15.0
SECRET = "protocol-test-secret"


@pytest.fixture(scope="module")
def stack(
    rabbitmq_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, str]]:
    reset_shared_queues(rabbitmq_url, redis_url)
    env = cluster_env(
        rabbitmq_url,
        redis_url,
        BARGEIN_PORT="0",
        BARGEIN_SEND_BUFFER="64",
        BARGEIN_REPORT_INTERVAL_MS="20",
        BARGEIN_EDGE_SECRET=SECRET,
    )
    with Cluster(env, Path(tmp_path_factory.mktemp("edge"))) as cluster:
        cluster.start()
        cluster.start()
        yield cluster, cluster.start_edge()


@pytest.fixture
def base(stack: tuple[Cluster, str]) -> str:
    return stack[1]


async def new_session(base: str, **body: Any) -> dict[str, Any]:
    body.setdefault(
        "agent_options", {"agent": "tests.integration.agents:probe", "tail": 40, "word_delay": 0.02}
    )
    return await create_session(base, **body)


# --- turns ----------------------------------------------------------------------------------------


async def test_a_text_turn_streams_in_order_and_completes(base: str) -> None:
    session = await new_session(base)
    async with connect(session) as ws:
        await say(ws, "hello there")
        frames: list[Frame] = []
        done = await until(ws, "turn_complete", frames)
    got = chunks(frames)
    assert [seq for _, seq, _ in got] == list(range(len(got)))
    assert {turn for turn, _, _ in got} == {done["turn"]}
    assert "".join(text for _, _, text in got).startswith("hello there tail0")
    assert [f["type"] for f in frames][:2] == ["user_started_speaking", "user_stopped_speaking"]


async def test_barge_in_again_and_again_nothing_of_a_cleared_turn_arrives(base: str) -> None:
    session = await new_session(base, agent_options={"agent": "tests.integration.agents:probe", "tail": 400})
    async with connect(session) as ws:
        cleared: list[int] = []
        after_clear: list[Frame] = []
        await say(ws, "go")
        for i in range(20):
            first = await until(ws, "agent_chunk")
            await until(ws, "agent_chunk")
            if i % 2:  # the stop button...
                await ws.send(json.dumps({"type": "interrupt"}))
            else:  # ...or talking over the agent (a new text turn)
                await say(ws, f"again {i}")
            clear = await until(ws, "clear")
            assert clear["turn"] >= first["turn"]
            cleared.append(clear["turn"])
            if i % 2:
                await say(ws, f"next {i}")
            # everything up to the next turn's first chunk: nothing of a cleared turn may be in it
            frames: list[Frame] = []
            await until(ws, "user_stopped_speaking", frames)
            after_clear.extend(frames)
        stale = [f for f in after_clear if f["type"] == "agent_chunk" and f["turn"] <= max(cleared)]
        assert stale == [], stale
        assert len(cleared) == 20 and cleared == sorted(cleared)


async def test_listeners_receive_the_same_stream(base: str) -> None:
    session = await new_session(base)
    async with (
        connect(session) as caller,
        connect(session, "listener") as a,
        connect(session, "listener") as b,
    ):
        await say(caller, "for everyone")
        got: dict[str, list[Frame]] = {"caller": [], "a": [], "b": []}
        await asyncio.gather(
            until(caller, "turn_complete", got["caller"]),
            until(a, "turn_complete", got["a"]),
            until(b, "turn_complete", got["b"]),
        )
    assert chunks(got["caller"]) == chunks(got["a"]) == chunks(got["b"]) != []


async def test_interrupted_answer_in_history_is_what_the_caller_received(base: str, redis_url: str) -> None:
    session = await new_session(base, agent_options={"agent": "tests.integration.agents:probe", "tail": 300})
    async with connect(session) as ws:
        await say(ws, "remember")
        frames: list[Frame] = []
        for _ in range(6):
            frames.append(await until(ws, "agent_chunk"))
        await ws.send(json.dumps({"type": "interrupt"}))
        await until(ws, "clear", frames)
        await asyncio.sleep(1.0)  # delivery reports flow back; the owner checkpoints the correction
    received = "".join(f["text"] for f in frames if f["type"] == "agent_chunk")
    store = RedisStateStore.from_url(redis_url)
    try:
        state = (await journal.read(store, TIER_REASONING, session["session_id"]) or ({}, None))[0]
    finally:
        await store.close()
    events = state["nodes"]["ProbeNode"]["conversation_events"]
    assistant = [e.content for e in events if isinstance(e, AgentResponse)]
    assert assistant == [received]


async def test_the_same_answer_after_the_owner_dies_each_chunk_once(stack: tuple[Cluster, str]) -> None:
    cluster, base = stack
    session = await new_session(
        base, agent_options={"agent": "tests.integration.agents:probe", "tail": 80, "word_delay": 0.03}
    )
    async with connect(session) as ws:
        await say(ws, "resume")
        frames = [await until(ws, "agent_chunk") for _ in range(10)]
        store = RedisStateStore.from_url(cluster.env["BARGEIN_REDIS_URL"])
        try:
            lease = await store.redis.get(f"bargein:{{{session['session_id']}}}:lease:reasoning")
        finally:
            await store.close()
        assert lease
        pid = int(lease.decode().rsplit(":", 1)[0].split("-")[-2])
        cluster.by_pid(pid).kill()
        cluster.start()
        await until(ws, "turn_complete", frames, timeout=30)
    got = chunks(frames)
    assert [seq for _, seq, _ in got] == list(range(len(got)))  # once each, in order, no gap
    assert "".join(t for _, _, t in got) == "resume " + " ".join(f"tail{i}" for i in range(80))


async def test_what_the_agent_says_once_the_socket_is_open_reaches_it(
    base: str, rabbitmq_url: str, redis_url: str
) -> None:
    # sessions this edge did not create (another edge did, behind the load balancer): the edge
    # starts listening for one when a caller joins, and must do so before the socket opens, or what
    # the agent says in between is published to nobody and lost
    owner, sessions = "protocol-test-owner", [f"joined{uuid.uuid4().hex[:12]}" for _ in range(3)]
    store = RedisStateStore.from_url(redis_url)
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        channel = await connection.channel(on_return_raises=True)
        events = await channel.get_exchange(EVENTS_EXCHANGE)
        for sid in sessions:
            await store.register_session(TIER_REASONING, sid, SessionInfo(sid, {}).encode())
            epoch = await store.acquire_lease(TIER_REASONING, sid, owner, 60_000)
            assert epoch is not None
            token = Tokens(SECRET, 3600).issue(sid, "caller")
            async with websockets.connect(
                f"{base.replace('http', 'ws', 1)}/v1/sessions/{sid}/ws?token={token}"
            ) as ws:
                chunk = Envelope.wrap(
                    sid, AgentResponse(content=f"hello {sid}"), turn=1, seq=0, epoch=epoch, source=owner
                )
                # at once: unroutable (the edge not yet bound to the session) raises, with on_return_raises
                key = routing_key(sid, OUT, "AgentResponse")
                await events.publish(aio_pika.Message(encode(chunk)), key, mandatory=True)
                assert (await until(ws, "agent_chunk"))["text"] == f"hello {sid}"
    finally:
        for sid in sessions:
            await store.redis.delete(lease_key(TIER_REASONING, sid))
            await store.unregister_session(TIER_REASONING, sid)
        await store.close()
        await connection.close()


# --- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["forged", "other_session", "listener_as_caller", "missing", "bad_role"])
async def test_bad_tokens_are_refused(base: str, case: str) -> None:
    session = await new_session(base)
    other = await new_session(base)
    token, role = {
        "forged": (session["token"][:-4] + "AAAA", "caller"),
        "other_session": (other["token"], "caller"),
        "listener_as_caller": (session["listener_token"], "caller"),
        "missing": ("", "caller"),
        "bad_role": (session["token"], "admin"),
    }[case]
    async with connect(session, role, token=token) as ws:
        frame = await recv(ws)
        assert frame["type"] == "error" and frame["code"] == "invalid_token"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await recv(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401


async def test_unknown_session_is_refused(base: str) -> None:
    session = await new_session(base)
    ghost = dict(session, ws_url=session["ws_url"].replace(session["session_id"], "nosuchsession"))
    # a token is bound to its session, so the unknown session fails the token check first; a
    # correctly signed token for a session that does not exist is refused as unknown
    async with connect(ghost) as ws:
        assert (await recv(ws))["code"] in ("invalid_token", "unknown_session")


async def test_bad_messages_get_errors_and_the_session_goes_on(base: str) -> None:
    session = await new_session(base)
    async with connect(session) as ws, connect(session, "listener") as listener:
        cases: list[tuple[str | bytes, str]] = [
            ("not json", "malformed_json"),
            ("[1, 2]", "malformed_json"),
            (json.dumps({"type": "dance"}), "unknown_type"),
            (json.dumps({"text": "no type"}), "unknown_type"),
            (json.dumps({"type": "played", "turn": -1, "seq": 0}), "unknown_type"),
            (json.dumps({"type": "text", "text": ""}), "unknown_type"),
            (b"\x00" * 3, "bad_audio_frame"),
            (b"\x00" * 200_000, "frame_too_large"),
        ]
        for payload, code in cases:
            await ws.send(payload)
            frame = await until(ws, "error")
            assert frame["code"] == code, (payload[:40], frame)
        await listener.send(json.dumps({"type": "text", "text": "hi"}))
        assert (await until(listener, "error"))["code"] == "listener_cannot_send"
        await say(ws, "still fine")  # the same connection, the same session
        frames: list[Frame] = []
        await until(ws, "turn_complete", frames)
        assert "".join(t for _, _, t in chunks(frames)).startswith("still fine")
        await until(listener, "turn_complete")


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        json.dumps({"turn_taking": {"min_silence_ms": "long"}}).encode(),
        json.dumps({"turn_taking": {"nonsense": 1}}).encode(),
        json.dumps({"turn_taking": {"min_silence_ms": 5}}).encode(),  # below the setting's own bound
        json.dumps({"surprise": 1}).encode(),
    ],
)
async def test_bad_session_requests_get_400(base: str, body: bytes) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{base}/v1/sessions", content=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


async def test_health_and_readiness(base: str) -> None:
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{base}/healthz")).json() == {"status": "ok"}
        ready = await client.get(f"{base}/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}


async def test_hanging_up_ends_the_session_for_everyone(base: str) -> None:
    session = await new_session(base)
    async with connect(session) as ws, connect(session, "listener") as listener:
        await ws.send(json.dumps({"type": "end"}))
        assert (await until(listener, "ended"))["reason"] == "caller"
        with pytest.raises(websockets.ConnectionClosed):
            await until(listener, "never")


async def test_sigterm_closes_the_callers_and_the_edge_exits_cleanly(
    rabbitmq_url: str, redis_url: str, tmp_path: Path
) -> None:
    """uvicorn closes every WebSocket with 1012 as it shuts down, before the app is told, and raises
    the signal again once it has: the callers heard no ``shutting_down``, and the edge died by the
    signal (status -15) before closing its broker connection."""
    env = cluster_env(rabbitmq_url, redis_url, BARGEIN_PORT="0", BARGEIN_EDGE_SECRET=SECRET)
    with Cluster(env, tmp_path) as cluster:
        session = await create_session(cluster.start_edge())
        edge = cluster.processes[-1]
        async with connect(session) as ws:
            await asyncio.to_thread(edge.proc.send_signal, signal.SIGTERM)
            going = await until(ws, "error")
            assert going["code"] == "shutting_down"  # as docs/protocol.md says: join again elsewhere
            with pytest.raises(websockets.ConnectionClosed):
                await until(ws, "never")
            assert ws.close_code == 1001
        assert await asyncio.to_thread(edge.proc.wait, 20) == 0, edge.log()[-3000:]
        assert "edge stopped" in edge.log()


async def test_sigterm_stops_the_edge_within_the_drain_timeout_whatever_is_still_at_work(
    rabbitmq_url: str, redis_url: str, tmp_path: Path
) -> None:
    """A request still at work when the signal comes (here a client that sent half a body and went
    quiet; a thousand callers hanging up at once did the same for 8 s) is cut at
    ``BARGEIN_DRAIN_TIMEOUT_S``: uvicorn alone would wait for it for ever."""
    drain_s = 2.0
    env = cluster_env(
        rabbitmq_url,
        redis_url,
        BARGEIN_PORT="0",
        BARGEIN_EDGE_SECRET=SECRET,
        BARGEIN_DRAIN_TIMEOUT_S=str(drain_s),
    )
    with Cluster(env, tmp_path) as cluster:
        base = cluster.start_edge()
        edge = cluster.processes[-1]
        host, port = base.removeprefix("http://").split(":")
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/sessions HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{"
        )
        await writer.drain()
        await asyncio.sleep(0.5)  # the request is being read
        loop = asyncio.get_running_loop()
        signalled = loop.time()
        await asyncio.to_thread(edge.proc.send_signal, signal.SIGTERM)
        assert await asyncio.to_thread(edge.proc.wait, 30) == 0, edge.log()[-3000:]
        took = loop.time() - signalled
        writer.close()
        assert "edge stopped" in edge.log()
        assert took < drain_s + 3.0, f"stopped {took:.1f} s after SIGTERM (drain time-out {drain_s} s)"
