"""A worker's health and metrics over HTTP: ``/healthz``, ``/readyz`` and ``/metrics``.

The reasoning and speech services open no port for their work (they talk only to RabbitMQ and
Redis), so orchestrators could not probe them nor Prometheus scrape them. Each worker now serves a
small Starlette app on ``BARGEIN_PROBE_HOST``:``BARGEIN_PROBE_PORT`` (by default a free port on
loopback, logged at start-up; deployments set a fixed one), run by uvicorn on the worker's own event
loop:

* ``/healthz``: 200 while the process runs; it never asks the broker (a restart of RabbitMQ must
  not get every worker killed by its liveness probe);
* ``/readyz``: 200 when RabbitMQ is usable, Redis answers, the worker consumes session starts and
  is not overloaded; else 503 naming what is wrong, as the edge's does;
* ``/metrics``: :mod:`bargein.metrics` in Prometheus' text format.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bargein import metrics

log = logging.getLogger("bargein.hosting.probes")

Readiness = Callable[[], Awaitable[list[str]]]


class _Connected(Protocol):
    @property
    def connected(self) -> bool: ...


class _Pingable(Protocol):
    @property
    def redis(self) -> Any: ...


def readiness(
    transport: _Connected, store: _Pingable, consuming: Callable[[], bool], overloaded: Callable[[], bool]
) -> Readiness:
    """What every service's ``/readyz`` asks: RabbitMQ usable, Redis answering, its consumer running,
    not overloaded; the problems by name (none: ready)."""

    async def ready() -> list[str]:
        problems = []
        if not transport.connected:
            problems.append("rabbitmq")
        try:
            await store.redis.ping()
        except Exception:
            problems.append("redis")
        if not consuming():
            problems.append("consumer")
        if overloaded():
            problems.append("overloaded")
        return problems

    return ready


def probe_app(ready: Readiness) -> Starlette:
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        problems = await ready()
        if problems:
            return JSONResponse({"status": "not ready", "problems": problems}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def scrape(request: Request) -> Response:
        return Response(metrics.exposition(), media_type=metrics.CONTENT_TYPE)

    return Starlette(routes=[Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", scrape)])


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the worker service owns SIGTERM (it drains first)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Probes:
    """The probe server of one worker process."""

    def __init__(self, ready: Readiness, *, host: str = "127.0.0.1", port: int = 0) -> None:
        config = uvicorn.Config(probe_app(ready), host=host, port=port, log_level="warning", lifespan="off")
        self.server = _QuietServer(config)
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self) -> str:
        self._task = asyncio.create_task(self.server.serve(), name="probes")
        while not self.server.started and not self._task.done():  # noqa: ASYNC110 - uvicorn sets a flag
            await asyncio.sleep(0.02)
        if self._task.done():
            self._task.result()  # the port is taken, say: fail at start-up, naming it
            raise RuntimeError("the probe server did not start")
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        log.info("health and metrics on %s (/healthz, /readyz, /metrics)", self.url)
        return self.url

    async def stop(self) -> None:
        self.server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 5)
