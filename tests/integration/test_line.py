"""The four Line-style example agents (``services/reasoning/agents/line_*.py``) through the
distributed services: a real ``python -m services.reasoning`` process, real RabbitMQ and Redis.

The process runs ``tests.integration.line_agents:by_option``, which starts the ``handle_new_call`` a
session's options name. The test process plays the caller and the client edge with
:class:`bargein.caller.Caller`; node state is read back from the owner's checkpoint in Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from bargein import snapshot
from bargein.amqp import AmqpTransport
from bargein.caller import Caller
from bargein.envelope import new_session_id
from bargein.line.events import (
    AgentGenerationComplete,
    AgentResponse,
    DTMFInputEvent,
    EndCall,
    Event,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.llm import DEFAULT_REPLIES
from bargein.names import TIER_REASONING, lease_key
from bargein.redis_store import RedisStateStore
from bargein.runtime import SessionInfo
from bargein.sessions import create_session
from services.reasoning.agents import line_background, line_counter, line_storyteller

from .cluster import Cluster, cluster_env, reset_shared_queues

AGENTS = "services.reasoning.agents"
T = 15.0  # generous time-out for anything that should take well under a second


@pytest.fixture(scope="module")
def cluster(rabbitmq_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reset_shared_queues(rabbitmq_url, redis_url)
    env = cluster_env(
        rabbitmq_url,
        redis_url,
        BARGEIN_AGENT="tests.integration.line_agents:by_option",
        BARGEIN_SCRIPTED_TOKENS_PER_S="40",  # the storyteller's scripted model: about a second a story
    )
    c = Cluster(env, Path(tmp_path_factory.mktemp("line-reasoning")))
    c.start()
    yield c
    c.stop_all()


class Client:
    """The test's side: starts sessions naming a Line agent and plays caller + edge for each."""

    def __init__(
        self, transport: AmqpTransport, store: RedisStateStore, redis_client: aioredis.Redis
    ) -> None:
        self.transport = transport
        self.store = store
        self.redis = redis_client
        self.callers: list[Caller] = []

    async def open(self, agent: str, **options: Any) -> Caller:
        sid = new_session_id()
        caller = Caller(self.transport, sid)
        await caller.attach()
        info = SessionInfo(sid, {"agent": f"{AGENTS}.{agent}", **options}, edge_reports_delivery=True)
        await create_session(self.transport, self.store, info)
        self.callers.append(caller)
        return caller

    async def node_state(self, caller: Caller, node_id: str) -> dict[str, Any]:
        """The node's attributes as its owner last checkpointed them."""
        raw = await self.store.load_state(TIER_REASONING, caller.session_id)
        assert raw is not None, "no checkpoint yet"
        state: dict[str, Any] = snapshot.loads(raw)["nodes"][node_id]
        return state

    async def wait_state(self, caller: Caller, node_id: str, key: str, expected: Any) -> None:
        async with asyncio.timeout(T):
            while (await self.node_state(caller, node_id)).get(key) != expected:  # noqa: ASYNC110 - Redis
                await asyncio.sleep(0.05)


@pytest.fixture
async def client(cluster: Cluster, rabbitmq_url: str, redis_url: str) -> AsyncIterator[Client]:
    transport = await AmqpTransport.connect(rabbitmq_url, name="test-line-client")
    store = RedisStateStore.from_url(redis_url)
    redis_client = aioredis.Redis.from_url(redis_url)
    c = Client(transport, store, redis_client)
    try:
        yield c
    finally:
        for caller in c.callers:
            await caller.detach()
        await transport.close()
        await store.close()
        await redis_client.aclose()


async def ask(caller: Caller, text: str) -> None:
    await caller.emit(UserTranscriptionReceived(content=text))
    await caller.emit(UserStoppedSpeaking())


async def chunks(caller: Caller, n: int) -> str:
    out = ""
    for _ in range(n):
        event = await caller.next(timeout=T)
        assert isinstance(event, AgentResponse), event
        out += event.content
    return out


def text_of(events: list[Event]) -> str:
    return "".join(e.content for e in events if isinstance(e, AgentResponse))


async def test_line_echo_over_rabbitmq(client: Client) -> None:
    caller = await client.open("line_echo:handle_new_call")
    await ask(caller, "hello from far away")
    assert await caller.collect_turn(timeout=T) == [
        AgentResponse(content="You said: hello from far away"),
        AgentGenerationComplete(),
    ]
    await ask(caller, "and again")
    assert text_of(await caller.collect_turn(timeout=T)) == "You said: and again"
    assert {env.source for env, _ in caller.received} == {"echo"}


async def test_line_counter_greets_once_and_ends_the_call_after_its_last_chunk(client: Client) -> None:
    caller = await client.open("line_counter:app", turns=2)  # the VoiceAgentApp object runs too
    assert text_of(await caller.collect_turn(timeout=T)) == line_counter.greeting(2)
    await ask(caller, "one")
    assert text_of(await caller.collect_turn(timeout=T)) == "That was turn 1."
    await ask(caller, "two")
    last = await caller.collect_turn(timeout=T)
    assert text_of(last) == "That was turn 2. Goodbye!"
    assert isinstance(last[-2], EndCall) and isinstance(last[-3], AgentResponse)
    assert await caller.quiet(0.3) == []  # and no second greeting, ever


async def test_line_counter_end_call_ends_the_session(client: Client) -> None:
    """Once the edge has delivered the agent's EndCall, the session is over: its owner closes it,
    releases it and forgets its state."""
    caller = await client.open("line_counter:handle_new_call", turns=1)
    await caller.collect_turn(timeout=T)
    lease = lease_key(TIER_REASONING, caller.session_id)
    assert await client.redis.exists(lease)  # owned, with state
    assert await client.store.load_state(TIER_REASONING, caller.session_id) is not None
    await ask(caller, "bye")
    while not isinstance(await caller.next(timeout=T), EndCall):
        pass
    async with asyncio.timeout(T):
        while await client.redis.exists(lease):  # noqa: ASYNC110 - Redis has no event for it
            await asyncio.sleep(0.05)
    assert await client.store.load_state(TIER_REASONING, caller.session_id) is None


async def test_line_storyteller_stops_on_speech_and_on_its_button_only(client: Client) -> None:
    caller = await client.open("line_storyteller:handle_new_call")
    assert text_of(await caller.collect_turn(timeout=T)) == line_storyteller.GREETING

    await ask(caller, "a lighthouse story")
    heard = await chunks(caller, 2)
    await caller.emit(DTMFInputEvent(button="1"))  # a choice: recorded, the story goes on
    heard += await chunks(caller, 1)
    await caller.emit(DTMFInputEvent(button=line_storyteller.STOP_BUTTON))
    await caller.wait_interrupted(2, timeout=T)
    assert await caller.quiet(0.3) == []
    assert DEFAULT_REPLIES[1].startswith(heard)

    await ask(caller, "another")
    heard = await chunks(caller, 2)
    await caller.emit(UserStartedSpeaking())
    await caller.wait_interrupted(3, timeout=T)
    assert await caller.quiet(0.3) == []
    assert DEFAULT_REPLIES[2].startswith(heard)

    await ask(caller, "go on")
    await chunks(caller, 2)
    await caller.emit(DTMFInputEvent(button="5"))  # neither stop nor choice: nothing happens
    rest = await caller.collect_turn(timeout=T)
    assert isinstance(rest[-1], AgentGenerationComplete) and caller.interrupted_turns == [2, 3]
    await client.wait_state(caller, "storyteller", "interruptions", ["button #", "UserStartedSpeaking"])
    assert (await client.node_state(caller, "storyteller"))["choices"] == ["1"]


async def test_line_background_node_reasons_without_reaching_the_caller(client: Client) -> None:
    caller = await client.open("line_background:handle_new_call")
    await ask(caller, "is a sunny forecast coming")
    assert text_of(await caller.collect_turn(timeout=T)) == "Sounds like weather. So far: weather."
    await ask(caller, "I want a trip by train")
    assert text_of(await caller.collect_turn(timeout=T)) == "Sounds like travel. So far: weather, travel."
    assert await caller.quiet(0.3) == []
    assert {env.source for env, _ in caller.received} == {"chat"}
    assert not any(isinstance(e, line_background.TopicTagged) for _, e in caller.received)
    chat = await client.node_state(caller, "chat")
    tags = [e for e in chat["conversation_events"] if isinstance(e, line_background.TopicTagged)]
    assert [t.topic for t in tags] == ["weather", "travel"]
