"""Finding the real RabbitMQ and Redis the contract, integration and client tests talk to.

Where the services come from, per service:

1. ``BARGEIN_RABBITMQ_URL`` / ``BARGEIN_REDIS_URL``, when set: the operator said where it is.
2. Otherwise a throwaway testcontainers container, when a Docker daemon answers.
3. Otherwise the defaults ``amqp://guest:guest@localhost:5672/`` and ``redis://localhost:6379/0``.

Each service is checked once per test session. If it cannot be reached, its tests are skipped with
the reason, except under ``CI=true``, where they fail: CI must never pass by skipping everything.
The fixtures themselves are in ``tests/conftest.py``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, NoReturn
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import pytest
import redis

if TYPE_CHECKING:
    from testcontainers.core.container import DockerContainer

RABBITMQ_URL_VAR = "BARGEIN_RABBITMQ_URL"
REDIS_URL_VAR = "BARGEIN_REDIS_URL"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@localhost:5672/"
DEFAULT_REDIS_URL = "redis://localhost:6379/0"
RABBITMQ_IMAGE = "rabbitmq:3.13-alpine"
REDIS_IMAGE = "redis:7-alpine"

PROBE_TIMEOUT_S = 2.0  # a service that is down costs at most about this much, once
CONTAINER_READY_TIMEOUT_S = 60.0

# --- reachability ---------------------------------------------------------------------------------


def _redacted(url: str) -> str:
    """``url`` without its password, for messages that end up in CI logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[2]}"))


def _probe_redis(url: str) -> str | None:
    """None if Redis at ``url`` answers PING, else what went wrong."""
    client = redis.Redis.from_url(
        url, socket_connect_timeout=PROBE_TIMEOUT_S, socket_timeout=PROBE_TIMEOUT_S, retry_on_timeout=False
    )
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        client.close()
    return None


def _probe_rabbitmq(url: str) -> str | None:
    """None if RabbitMQ at ``url`` completes an AMQP handshake (and login), else what went wrong."""

    async def probe() -> None:
        connection = await aio_pika.connect(url, timeout=PROBE_TIMEOUT_S)
        await connection.close()

    # a private loop: never touches the loop pytest-asyncio manages
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(probe(), PROBE_TIMEOUT_S + 1))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    finally:
        loop.close()
    return None


@functools.cache
def _docker_answers() -> bool:
    """Whether a Docker daemon answers a ping within a couple of seconds (checked once)."""
    try:
        import docker

        client = docker.from_env(timeout=int(PROBE_TIMEOUT_S))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _unreachable(service: str, url: str, var: str, error: str) -> NoReturn:
    message = f"{service} is not reachable at {_redacted(url)} ({error}); start it, or set {var}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}. CI=true: integration tests must not be skipped.", pytrace=False)
    pytest.skip(message)


def _wait_until_ready(probe: Callable[[str], str | None], url: str) -> None:
    deadline = time.monotonic() + CONTAINER_READY_TIMEOUT_S
    while (error := probe(url)) is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"container at {_redacted(url)} not ready: {error}")
        time.sleep(0.5)


def _service_url(
    service: str,
    var: str,
    default: str,
    probe: Callable[[str], str | None],
    start_container: Callable[[], tuple[DockerContainer, str]],
) -> Iterator[str]:
    """The body of the session fixtures below: yields a reachable URL or skips/fails."""
    explicit = os.environ.get(var)
    container_error = ""
    if not explicit and _docker_answers():
        container: DockerContainer | None = None
        try:
            container, url = start_container()
            _wait_until_ready(probe, url)
        except Exception as exc:
            if container is not None:
                container.stop()
            container_error = f"; the testcontainers container failed: {type(exc).__name__}: {exc}"
        else:
            try:
                yield url
            finally:
                container.stop()
            return
    url = explicit or default
    error = probe(url)
    if error is not None:
        _unreachable(service, url, var, error + container_error)
    yield url


def _start_redis() -> tuple[DockerContainer, str]:
    try:
        from testcontainers.community.redis import RedisContainer
    except ImportError:  # testcontainers' older layout
        from testcontainers.redis import RedisContainer

    container = RedisContainer(REDIS_IMAGE)
    container.start()
    host, port = container.get_container_host_ip(), container.get_exposed_port(6379)
    return container, f"redis://{host}:{port}/0"


def _start_rabbitmq() -> tuple[DockerContainer, str]:
    container: DockerContainer
    try:
        try:
            from testcontainers.community.rabbitmq import RabbitMqContainer
        except ImportError:  # testcontainers' older layout
            from testcontainers.rabbitmq import RabbitMqContainer
        container = RabbitMqContainer(RABBITMQ_IMAGE)
    except ImportError:
        # RabbitMqContainer's readiness probe needs pika, which bargein does not depend on: run the
        # image plainly; _service_url waits for an aio-pika handshake instead
        from testcontainers.core.container import DockerContainer

        container = DockerContainer(RABBITMQ_IMAGE).with_exposed_ports(5672)
    container.start()
    host, port = container.get_container_host_ip(), container.get_exposed_port(5672)
    return container, f"amqp://guest:guest@{host}:{port}/"


# --- what the fixtures in tests/conftest.py yield -------------------------------------------------


def rabbitmq_service() -> Iterator[str]:
    """A reachable RabbitMQ's URL, for the life of the generator (a container's, if one was started)."""
    yield from _service_url(
        "RabbitMQ", RABBITMQ_URL_VAR, DEFAULT_RABBITMQ_URL, _probe_rabbitmq, _start_rabbitmq
    )


def redis_service() -> Iterator[str]:
    """A reachable Redis's URL, for the life of the generator."""
    yield from _service_url("Redis", REDIS_URL_VAR, DEFAULT_REDIS_URL, _probe_redis, _start_redis)
