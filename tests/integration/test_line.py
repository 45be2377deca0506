"""The four Line-style example agents (``services/reasoning/agents/line_*.py``) through the
distributed services: a real ``python -m services.reasoning`` process, real RabbitMQ and Redis.

The process runs ``tests.integration.line_agents:by_option``, which starts the ``handle_new_call`` a
session's options name. The test process plays the caller and the client edge with
:class:`bargein.testing.caller.Caller`; node state is read back from the owner's checkpoint in Redis.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from bargein.agent.events import register_model
from bargein.agent.llm import DEFAULT_REPLIES
from bargein.examples import line_background, line_counter, line_storyteller
from bargein.line.events import (
    AgentGenerationComplete,
    AgentResponse,
    DTMFInputEvent,
    EndCall,
    UserStartedSpeaking,
)
from bargein.testing.caller import Caller
from bargein.wire.names import TIER_REASONING, lease_key

from .cluster import Cluster, cluster_env, reset_shared_queues
from .line_agents import Lead
from .support import Client, T, ask, chunks, connected_client, text_of

AGENTS = "bargein.examples"


@pytest.fixture(scope="module")
def cluster(rabbitmq_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reset_shared_queues(rabbitmq_url, redis_url)
    env = cluster_env(
        rabbitmq_url,
        redis_url,
        BARGEIN_AGENT="tests.integration.line_agents:by_option",
        BARGEIN_SCRIPTED_TOKENS_PER_S="40",  # the storyteller's scripted model: about a second a story
    )
    with Cluster(env, Path(tmp_path_factory.mktemp("line-reasoning"))) as c:
        c.start()
        yield c


@pytest.fixture
async def client(cluster: Cluster, rabbitmq_url: str, redis_url: str) -> AsyncIterator[Client]:
    async with connected_client(rabbitmq_url, redis_url, "test-line-client") as c:
        yield c


async def start(client: Client, agent: str, **options: Any) -> Caller:
    """A session running one of the Line example agents (named relative to the agents package)."""
    return await client.open({"agent": f"{AGENTS}.{agent}", **options})


async def test_line_echo_over_rabbitmq(client: Client) -> None:
    caller = await start(client, "line_echo:handle_new_call")
    await ask(caller, "hello from far away")
    assert await caller.collect_turn(timeout=T) == [
        AgentResponse(content="You said: hello from far away"),
        AgentGenerationComplete(),
    ]
    await ask(caller, "and again")
    assert text_of(await caller.collect_turn(timeout=T)) == "You said: and again"
    assert {env.source for env, _ in caller.received} == {"echo"}


async def test_line_counter_greets_once_and_ends_the_call_after_its_last_chunk(client: Client) -> None:
    caller = await start(client, "line_counter:app", turns=2)  # the VoiceAgentApp object runs too
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
    caller = await start(client, "line_counter:handle_new_call", turns=1)
    await caller.collect_turn(timeout=T)
    lease = lease_key(TIER_REASONING, caller.session_id)
    assert await client.redis.exists(lease)  # owned, with state (the turn's last checkpoint
    async with asyncio.timeout(T):  # follows its last chunk: it may be a moment behind)
        while await client.store.load_state(TIER_REASONING, caller.session_id) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    await ask(caller, "bye")
    while not isinstance(await caller.next(timeout=T), EndCall):
        pass
    async with asyncio.timeout(T):
        while await client.redis.exists(lease):  # noqa: ASYNC110 - Redis has no event for it
            await asyncio.sleep(0.05)
    async with asyncio.timeout(T):  # the lease goes first, then the state (hosting/host.py close)
        while await client.store.load_state(TIER_REASONING, caller.session_id) is not None:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_line_storyteller_stops_on_speech_and_on_its_button_only(client: Client) -> None:
    caller = await start(client, "line_storyteller:handle_new_call")
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
    caller = await start(client, "line_background:handle_new_call")
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


async def test_a_line_agents_plain_pydantic_events_travel_and_survive_a_kill(
    client: Client, cluster: Cluster
) -> None:
    # sales_with_leads' shape: a background node broadcasts plain BaseModel events the speaking
    # node keeps in its history; the history is in the checkpoint, so another process has it too
    caller = await client.open({"agent": "tests.integration.line_agents:leads"})
    await ask(caller, "Ada")
    assert text_of(await caller.collect_turn(timeout=T)) == "Leads: Ada."
    register_model(Lead)  # as the worker's bridge.on(Lead) did: so this process can read the checkpoint
    history = [Lead(name="Ada"), AgentResponse(content="Leads: Ada.")]
    await client.wait_state(caller, "chat", "conversation_events", history)
    cluster.by_pid(await client.owner_pid(caller)).kill()
    cluster.start()
    await ask(caller, "Grace")
    assert text_of(await caller.collect_turn(timeout=T)) == "Leads: Ada, Grace."
    assert not any(type(e).__name__ == "Lead" for _, e in caller.received)  # never sent to the caller
