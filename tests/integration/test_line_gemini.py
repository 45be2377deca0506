"""The Gemini agent in Line's examples' shape (``bargein.examples.line_gemini_chat``) through the
distributed services: real reasoning processes, RabbitMQ and Redis, and the real ``google-genai``
client in those processes talking to a Gemini stand-in on loopback (``tests/gemini.py``).

What it shows for Line's examples: they run as written in a service process
(``BARGEIN_AGENT=...:handle_new_call``), their history reaches the model as the caller heard it, and
a turn whose process is killed mid-answer is finished by another, whole.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bargein.examples import line_gemini_chat
from tests.gemini import GeminiStandIn, contents

from .cluster import Cluster, cluster_env, reset_shared_queues
from .support import Client, T, ask, chunks, connected_client, text_of


@pytest.fixture(scope="module")
def gemini() -> Iterator[GeminiStandIn]:
    with GeminiStandIn() as stand_in:
        yield stand_in


@pytest.fixture(scope="module")
def cluster(
    rabbitmq_url: str, redis_url: str, gemini: GeminiStandIn, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    reset_shared_queues(rabbitmq_url, redis_url)
    env = cluster_env(
        rabbitmq_url,
        redis_url,
        BARGEIN_AGENT="bargein.examples.line_gemini_chat:handle_new_call",
        GOOGLE_GEMINI_BASE_URL=gemini.url,
        GEMINI_API_KEY="test-key",
    )
    with Cluster(env, Path(tmp_path_factory.mktemp("line-gemini"))) as c:
        c.start()
        c.start()
        yield c


@pytest.fixture
async def client(cluster: Cluster, rabbitmq_url: str, redis_url: str) -> AsyncIterator[Client]:
    async with connected_client(rabbitmq_url, redis_url, "test-line-gemini") as c:
        yield c


async def test_a_line_style_gemini_agent_answers_from_a_service_process(
    client: Client, gemini: GeminiStandIn
) -> None:
    caller = await client.open({})
    assert text_of(await caller.collect_turn(timeout=T)) == line_gemini_chat.GREETING
    await ask(caller, "hello")
    assert text_of(await caller.collect_turn(timeout=T)) == "You said hello."
    await ask(caller, "again")
    assert text_of(await caller.collect_turn(timeout=T)) == "You said again."
    assert contents(gemini.requests[-1])[-3:] == [
        ("user", "hello"),
        ("model", "You said hello."),
        ("user", "again"),
    ]


async def test_a_gemini_answer_whose_process_is_killed_arrives_whole(
    client: Client, cluster: Cluster, gemini: GeminiStandIn
) -> None:
    caller = await client.open({})
    await caller.collect_turn(timeout=T)
    await ask(caller, "one two three four five six seven eight [slow]")
    heard = await chunks(caller, 2)
    cluster.by_pid(await client.owner_pid(caller)).kill()
    cluster.start()  # two processes again, for whatever runs next
    rest = await caller.collect_turn(timeout=T)
    assert (
        heard + text_of(rest) == "You said one two three four five six seven eight."
    )  # nothing repeated or lost
