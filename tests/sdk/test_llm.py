"""The LLM clients: scripted replies and pacing, and a real streaming HTTP server for the OpenAI client.

The OpenAI-compatible client is exercised against an in-process uvicorn server speaking the chat
completions SSE format, which records what it received and whether each stream was cut short, so the
tests can check that abandoning a stream really stops the server from generating.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from bargein.agent.llm import (
    DEFAULT_REPLIES,
    Chunk,
    LLMClient,
    LLMError,
    OpenAICompatibleLLM,
    ScriptedLLM,
    close_shared_llms,
    llm_from_settings,
    shared_llm,
)
from bargein.agent.nodes import ReasoningNode
from bargein.errors import BargeinError
from bargein.settings import LLMSettings

pytestmark = pytest.mark.timeout(30)

MESSAGES = [
    {"role": "system", "content": "You are a helpful voice assistant."},
    {"role": "user", "content": "What's the weather like?"},
]


async def collect(stream: AsyncIterator[Chunk]) -> list[str]:
    return [chunk.text async for chunk in stream]


# --------------------------------------------------------------------------------------------------
# ScriptedLLM


async def test_scripted_joined_chunks_equal_reply_exactly() -> None:
    replies = ["Hello there, how are you today?", "  leading and   inner  spaces, trailing too  ", "x"]
    llm = ScriptedLLM(replies, first_token_delay=0, tokens_per_second=10_000)
    for i, reply in enumerate(replies):
        texts = await collect(llm.generate_stream(MESSAGES + [{"role": "assistant", "content": "-"}] * i))
        assert "".join(texts) == reply
        assert len(texts) == len(reply.split())


async def test_scripted_streams_word_by_word_keeping_spaces() -> None:
    llm = ScriptedLLM(["one two  three"], first_token_delay=0, tokens_per_second=10_000)
    assert await collect(llm.generate_stream(MESSAGES)) == ["one ", "two  ", "three"]


async def test_scripted_replies_follow_the_conversation() -> None:
    llm = ScriptedLLM(["a", "b", "c"], first_token_delay=0, tokens_per_second=10_000)
    history: list[dict[str, str]] = [{"role": "system", "content": "s"}]
    got = []
    for i in range(7):
        history.append({"role": "user", "content": f"q{i}"})
        answer = "".join(await collect(llm.generate_stream(history)))
        got.append(answer)
        history.append({"role": "assistant", "content": answer})
    assert got == ["a", "b", "c", "a", "b", "c", "a"]
    # a fresh client (another process adopting the session) answers the same history the same way
    again = ScriptedLLM(["a", "b", "c"], first_token_delay=0, tokens_per_second=10_000)
    assert "".join(await collect(again.generate_stream(history[:6]))) == "c"


async def test_scripted_single_string_is_one_reply() -> None:
    llm = ScriptedLLM("just this one", first_token_delay=0, tokens_per_second=10_000)
    assert "".join(await collect(llm.generate_stream(MESSAGES))) == "just this one"
    assert "".join(await collect(llm.generate_stream(MESSAGES))) == "just this one"


async def test_scripted_callable_gets_the_messages() -> None:
    seen: list[Sequence[Mapping[str, str]]] = []

    def reply(messages: Sequence[Mapping[str, str]]) -> str:
        seen.append(messages)
        return f"You said: {messages[-1]['content']}"

    llm = ScriptedLLM(reply, first_token_delay=0, tokens_per_second=10_000)
    text = "".join(await collect(llm.generate_stream(MESSAGES)))
    assert text == "You said: What's the weather like?"
    assert seen == [MESSAGES]


async def test_scripted_default_replies_are_long_enough_to_interrupt() -> None:
    assert len(DEFAULT_REPLIES) >= 3
    for reply in DEFAULT_REPLIES:
        assert 20 <= len(reply.split()) <= 40, reply
    llm = ScriptedLLM(first_token_delay=0, tokens_per_second=10_000)
    answered = [{"role": "assistant", "content": "-"}]
    got = [
        "".join(await collect(llm.generate_stream(MESSAGES + answered * i)))
        for i in range(len(DEFAULT_REPLIES))
    ]
    assert got == list(DEFAULT_REPLIES)


async def test_scripted_first_token_delay_and_rate_are_respected() -> None:
    llm = ScriptedLLM(["w1 w2 w3 w4 w5 w6"], first_token_delay=0.15, tokens_per_second=50)
    start = time.monotonic()
    stamps: list[float] = []
    async for _ in llm.generate_stream(MESSAGES):
        stamps.append(time.monotonic() - start)
    assert len(stamps) == 6
    assert stamps[0] >= 0.15
    # Five gaps of 1/50 s after the first token; lower bounds only, the machine may be slow.
    assert stamps[-1] - stamps[0] >= 5 * (1 / 50) * 0.9
    assert stamps[-1] < 5.0


async def test_scripted_cancelling_consumer_mid_stream_is_prompt() -> None:
    llm = ScriptedLLM(first_token_delay=0, tokens_per_second=20)  # a default reply takes > 1 s
    received: list[str] = []
    got_some = asyncio.Event()

    async def consume() -> None:
        async for chunk in llm.generate_stream(MESSAGES):
            received.append(chunk.text)
            if len(received) == 3:
                got_some.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_some.wait(), 5)
    start = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - start < 1.0
    assert 3 <= len(received) < len(DEFAULT_REPLIES[0].split())


def test_scripted_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        ScriptedLLM([])
    with pytest.raises(ValueError):
        ScriptedLLM(first_token_delay=-1)
    with pytest.raises(ValueError):
        ScriptedLLM(tokens_per_second=0)


def test_scripted_from_settings_uses_scripted_pacing() -> None:
    llm = ScriptedLLM.from_settings(LLMSettings(scripted_first_token_ms=120, scripted_tokens_per_s=8))
    assert llm.first_token_delay == pytest.approx(0.12)
    assert llm.tokens_per_second == 8


# --------------------------------------------------------------------------------------------------
# A real OpenAI-compatible streaming server


@dataclass
class StreamRecord:
    """What the server saw of one streamed response."""

    planned: int
    sent: int = 0
    finished: bool = False  # every token and [DONE] were sent
    done: asyncio.Event = field(default_factory=asyncio.Event)  # the generator has exited


class FakeOpenAIServer:
    def __init__(self) -> None:
        self.tokens = 200
        self.token_delay = 0.01
        self.requests: list[dict[str, Any]] = []
        self.peers: list[tuple[str, int] | None] = []  # each request's client address: its connection
        self.odd_events: list[object] = []  # sent after the role, before the text (other servers')
        self.error_after: int | None = None  # an error event in the stream after this many tokens
        self.streams: list[StreamRecord] = []
        self.base_url = ""
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/broken/v1/chat/completions", self.broken, methods=["POST"]),
            ]
        )

    @staticmethod
    def token(i: int) -> str:
        return f"tok{i} "

    def expected_text(self, n: int) -> str:
        return "".join(self.token(i) for i in range(n))

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        self.peers.append((request.client.host, request.client.port) if request.client else None)
        record = StreamRecord(planned=self.tokens)
        self.streams.append(record)
        model = body.get("model", "?")

        def event(delta: dict[str, str], finish: str | None = None) -> str:
            chunk = {
                "id": "chatcmpl-test",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(chunk)}\n\n"

        async def events() -> AsyncIterator[str]:
            try:
                yield event({"role": "assistant", "content": ""})  # like OpenAI: role first, no text
                for odd in self.odd_events:
                    yield f"data: {json.dumps(odd)}\n\n"
                for i in range(record.planned):
                    if i == self.error_after:
                        yield f"data: {json.dumps({'error': {'message': 'overloaded'}})}\n\n"
                        return
                    await asyncio.sleep(self.token_delay)
                    yield event({"content": self.token(i)})
                    record.sent += 1
                yield event({}, finish="stop")
                yield "data: [DONE]\n\n"
                record.finished = True
            finally:
                record.done.set()

        return StreamingResponse(events(), media_type="text/event-stream")

    async def broken(self, request: Request) -> Response:
        self.requests.append(await request.json())
        return JSONResponse({"error": {"message": "model exploded", "type": "server_error"}}, status_code=500)


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    fake = FakeOpenAIServer()
    config = uvicorn.Config(
        fake.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off", timeout_graceful_shutdown=2
    )
    uv = uvicorn.Server(config)
    task = asyncio.create_task(uv.serve())
    deadline = time.monotonic() + 5
    while not uv.started:
        if task.done():
            task.result()  # surface the start-up error
        assert time.monotonic() < deadline, "uvicorn did not start"
        await asyncio.sleep(0.01)
    port = uv.servers[0].sockets[0].getsockname()[1]
    fake.base_url = f"http://127.0.0.1:{port}/v1"
    try:
        yield fake
    finally:
        uv.should_exit = True
        await asyncio.wait_for(task, 5)


@pytest.fixture
async def llm(server: FakeOpenAIServer) -> AsyncIterator[OpenAICompatibleLLM]:
    client = OpenAICompatibleLLM(
        base_url=server.base_url,
        api_key="sk-test",
        model="test-model",
        temperature=0.3,
        timeout=5,
        max_retries=0,
    )
    try:
        yield client
    finally:
        await client.aclose()


async def wait_until_stream_ends(record: StreamRecord) -> None:
    await asyncio.wait_for(record.done.wait(), 5)


async def test_openai_short_stream_yields_exact_text_and_sends_request(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    server.tokens = 12
    server.token_delay = 0.001
    texts = await collect(llm.generate_stream(MESSAGES))
    assert "".join(texts) == server.expected_text(12)
    assert len(texts) == 12  # the role-only first delta and the empty final delta are skipped
    assert all(texts)

    [body] = server.requests
    assert body["model"] == "test-model"
    assert body["messages"] == MESSAGES
    assert body["stream"] is True
    assert body["temperature"] == pytest.approx(0.3)
    [record] = server.streams
    await wait_until_stream_ends(record)
    assert record.finished


async def test_openai_cancelling_consumer_closes_stream_so_server_stops(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    received: list[str] = []
    got_some = asyncio.Event()

    async def consume() -> None:
        async for chunk in llm.generate_stream(MESSAGES):
            received.append(chunk.text)
            if len(received) == 3:
                got_some.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_some.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)

    [record] = server.streams
    await wait_until_stream_ends(record)  # the server noticed the disconnect and stopped generating
    assert not record.finished
    assert record.sent < record.planned // 2, f"server kept generating: {record.sent}/{record.planned}"
    assert "".join(received) == server.expected_text(len(received))


async def test_openai_cancelling_consumer_busy_between_chunks_closes_stream(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    # The usual barge-in: the agent is awaiting something else (say, speech synthesis) when its turn is
    # cancelled, so the CancelledError lands in the consumer, not inside the stream.
    got_some = asyncio.Event()

    async def consume() -> None:
        async with contextlib.aclosing(llm.generate_stream(MESSAGES)) as stream:
            async for _ in stream:
                got_some.set()
                await asyncio.sleep(30)

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_some.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)

    [record] = server.streams
    await wait_until_stream_ends(record)
    assert not record.finished
    assert record.sent < record.planned // 2, f"server kept generating: {record.sent}/{record.planned}"


async def test_openai_breaking_out_and_aclose_closes_stream(
    server: FakeOpenAIServer, llm: OpenAICompatibleLLM
) -> None:
    stream = llm.generate_stream(MESSAGES)
    received: list[str] = []
    async for chunk in stream:
        received.append(chunk.text)
        if len(received) == 3:
            break
    await stream.aclose()

    [record] = server.streams
    await wait_until_stream_ends(record)
    assert not record.finished
    assert record.sent < record.planned // 2, f"server kept generating: {record.sent}/{record.planned}"
    assert received == [server.token(i) for i in range(3)]

    # The client is still usable afterwards.
    server.tokens = 4
    server.token_delay = 0.001
    assert "".join(await collect(llm.generate_stream(MESSAGES))) == server.expected_text(4)


async def test_openai_http_500_raises_llm_error(server: FakeOpenAIServer) -> None:
    client = OpenAICompatibleLLM(
        base_url=server.base_url.replace("/v1", "/broken/v1"), model="test-model", timeout=5, max_retries=0
    )
    try:
        with pytest.raises(LLMError, match="500") as info:
            await collect(client.generate_stream(MESSAGES))
    finally:
        await client.aclose()
    assert isinstance(info.value, BargeinError)
    assert "model exploded" in str(info.value)
    assert len(server.requests) == 1


async def test_openai_unreachable_server_raises_llm_error(server: FakeOpenAIServer) -> None:
    # Bind-and-release a port so nothing is listening on it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = OpenAICompatibleLLM(base_url=f"http://127.0.0.1:{port}/v1", timeout=2, max_retries=0)
    try:
        with pytest.raises(LLMError, match="could not be reached"):
            await collect(client.generate_stream(MESSAGES))
    finally:
        await client.aclose()


async def test_events_that_carry_no_text_are_skipped(
    llm: OpenAICompatibleLLM, server: FakeOpenAIServer
) -> None:
    """What servers other than OpenAI stream besides text (usage with no choices, a choice with no
    delta, a null content, a filter result) adds nothing to the answer and breaks nothing."""
    server.tokens, server.token_delay = 3, 0.001
    server.odd_events = [
        {"choices": [], "usage": {"prompt_tokens": 3}},
        {"choices": [{"index": 0, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": None}}]},
        {"choices": [{"index": 0, "delta": {"content": 7}}]},
        {"prompt_filter_results": [{"prompt_index": 0}]},
        [],
    ]
    assert "".join(await collect(llm.generate_stream(MESSAGES))) == server.expected_text(3)


async def test_an_error_in_the_stream_is_an_llm_error(
    llm: OpenAICompatibleLLM, server: FakeOpenAIServer
) -> None:
    server.tokens, server.token_delay, server.error_after = 5, 0.001, 2
    got: list[str] = []
    with pytest.raises(LLMError, match="overloaded"):
        async for chunk in llm.generate_stream(MESSAGES):
            got.append(chunk.text)
    assert "".join(got) == server.expected_text(2)


# --------------------------------------------------------------------------------------------------
# llm_from_settings


def test_llm_from_settings_without_url_is_scripted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BARGEIN_LLM_BASE_URL", raising=False)
    monkeypatch.setenv("BARGEIN_SCRIPTED_TOKENS_PER_S", "7")
    client = llm_from_settings()
    assert isinstance(client, ScriptedLLM)
    assert client.tokens_per_second == 7


async def test_llm_from_settings_with_url_is_openai_compatible(
    monkeypatch: pytest.MonkeyPatch, server: FakeOpenAIServer
) -> None:
    monkeypatch.setenv("BARGEIN_LLM_BASE_URL", server.base_url)
    monkeypatch.setenv("BARGEIN_LLM_MODEL", "from-env")
    client: LLMClient = llm_from_settings()
    assert isinstance(client, OpenAICompatibleLLM)
    assert client.model == "from-env"
    server.tokens = 3
    server.token_delay = 0.001
    try:
        assert "".join(await collect(client.generate_stream(MESSAGES))) == server.expected_text(3)
    finally:
        await client.aclose()
    assert server.requests[-1]["model"] == "from-env"


def test_llm_from_settings_explicit_settings() -> None:
    assert isinstance(llm_from_settings(LLMSettings(llm_base_url=None)), ScriptedLLM)
    client = llm_from_settings(LLMSettings(llm_base_url="http://127.0.0.1:1/v1"))
    assert isinstance(client, OpenAICompatibleLLM)


async def test_sessions_share_one_client_and_its_connection(
    monkeypatch: pytest.MonkeyPatch, server: FakeOpenAIServer
) -> None:
    """Every session's nodes stream from the process's one client: building one per session cost
    each session start 30 ms of CPU (the HTTP client's TLS set-up) and left a connection pool per
    session open. Three sessions' answers go over one kept-alive connection."""
    monkeypatch.setenv("BARGEIN_LLM_BASE_URL", server.base_url)
    server.tokens, server.token_delay = 2, 0.001
    nodes = [ReasoningNode() for _ in range(3)]
    try:
        for node in nodes:
            answer = await collect(node.llm_client.generate_stream(MESSAGES))
            assert "".join(answer) == server.expected_text(2)
        assert nodes[0].llm_client is nodes[1].llm_client is nodes[2].llm_client
        assert len(server.peers) == 3 and len(set(server.peers)) == 1, server.peers
        monkeypatch.setenv("BARGEIN_LLM_MODEL", "another")  # other settings: another client
        other = ReasoningNode().llm_client
        assert isinstance(other, OpenAICompatibleLLM) and other.model == "another"
        assert other is not nodes[0].llm_client
    finally:
        await close_shared_llms()
    assert shared_llm() is not nodes[0].llm_client  # closed clients are not handed out again
    await close_shared_llms()
