"""A worker's probe server (/healthz, /readyz, /metrics) on a real port, and the log lines:
JSON with the session, turn and trace they concern, or text on a terminal."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import REGISTRY

from bargein import metrics, tracing
from bargein.hosting.logs import configure_logging
from bargein.hosting.probes import Probes
from bargein.tools.health import main as health_main


async def test_the_probes_answer_over_http() -> None:
    problems: list[str] = []

    async def ready() -> list[str]:
        return list(problems)

    probes = Probes(ready, port=0)
    url = await probes.start()
    try:
        metrics.count("reasoning", "probe_test")
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            assert (await http.get("/readyz")).status_code == 200
            problems.append("rabbitmq")
            answer = await http.get("/readyz")
            assert answer.status_code == 503 and answer.json()["problems"] == ["rabbitmq"]
            assert (await http.get("/healthz")).status_code == 200  # alive, whatever the broker
            scraped = await http.get("/metrics")
        assert scraped.headers["content-type"].startswith("text/plain")
        assert 'bargein_events_total{event="probe_test",service="reasoning"} 1.0' in scraped.text
        assert "bargein_interrupt_to_cancel_seconds_bucket" in scraped.text
    finally:
        await probes.stop()


def test_counted_counters_are_exported_as_they_grow() -> None:
    counters = metrics.Counted("edge")
    counters["clears_probe"] += 2
    counters["clears_probe"] += 1
    assert counters["clears_probe"] == 3
    exported = REGISTRY.get_sample_value("bargein_events_total", {"service": "edge", "event": "clears_probe"})
    assert exported == 3 == metrics.events_total("edge", "clears_probe")


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """configure_logging replaces the root logger's handlers: put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _capture(fmt: str, monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging("INFO", fmt)
    return stream


def test_json_log_lines_carry_the_session_and_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _capture("json", monkeypatch)
    session, turn = tracing.SESSION.set("s-123"), tracing.TURN.set(4)
    logging.getLogger("bargein.test").info("turn %d cleared", 4)
    tracing.SESSION.reset(session)
    tracing.TURN.reset(turn)
    logging.getLogger("bargein.test").warning("no session here")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "turn 4 cleared" and first["level"] == "INFO"
    assert (first["session"], first["turn"], first["logger"]) == ("s-123", 4, "bargein.test")
    assert first["time"].startswith("20")  # an ISO date and time
    assert second["session"] is None and second["level"] == "WARNING"


def test_auto_is_json_unless_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = _capture("auto", monkeypatch)  # a StringIO is no terminal
    logging.getLogger("bargein.test").info("hello")
    assert json.loads(stream.getvalue())["message"] == "hello"
    stream = _capture("text", monkeypatch)
    logging.getLogger("bargein.test").info("hello")
    assert stream.getvalue().rstrip().endswith("INFO    bargein.test: hello")


async def test_bargein_health_asks_the_probe_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """The image's HEALTHCHECK: 0 while the service answers /healthz, 1 once it does not."""

    async def ready() -> list[str]:
        return []

    probes = Probes(ready, port=0)
    url = await probes.start()
    monkeypatch.setenv("BARGEIN_PROBE_PORT", url.rsplit(":", 1)[1])
    assert await asyncio.to_thread(health_main) == 0
    await probes.stop()
    assert await asyncio.to_thread(health_main) == 1


class RobustChannel:  # named as aio-pika's, for the callback's repr
    def _on_close(self) -> None: ...


def test_a_broker_outage_the_connection_recovers_from_logs_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiormq and aio-pika report a lost connection and every failed reconnect as ERROR; the
    transport names the outage once itself, so those are dropped, and nothing else is."""
    stream = _capture("text", monkeypatch)
    aiormq, robust = logging.getLogger("aiormq.connection"), logging.getLogger("aio_pika.robust_connection")
    tools = logging.getLogger("aio_pika.tools")
    aiormq.error(
        'Unexpected connection close from remote "%s", Connection.Close(reply_code=%r)', "amqp://x", 320
    )
    aiormq.error("error when creating transport: %r", ConnectionRefusedError(111))
    robust.warning(
        'Connection attempt to "%s" failed: %s. Reconnecting after %r seconds.', "amqp://x", "no", 1
    )
    tools.error("Callback %r error: %s: %s", RobustChannel()._on_close, "RuntimeError", "closed")
    tools.error("Callback %r error: %s: %s", print, "ChannelInvalidStateError", "No active transport")
    assert stream.getvalue() == ""
    tools.error("Callback %r error: %s: %s", print, "ValueError", "a bug in a callback")
    aiormq.warning("Connection %r was blocked by: %r", "amqp://x", "low on memory")
    shown = stream.getvalue().splitlines()
    assert len(shown) == 2 and "a bug in a callback" in shown[0] and "blocked" in shown[1]
    configure_logging("INFO", "text")  # configured again (a test, a command): still one filter each
    assert len(tools.filters) == 1
