"""One barge-in, traced across the three service processes: each exports its spans over OTLP/HTTP
to a stand-in collector on loopback (a real HTTP server decoding the real protobuf), and the spans
join into traces with the structure the code promises (docs/architecture.md, "Traces")."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import websockets
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.client import create_session, until
from tests.integration.cluster import Cluster, cluster_env, reset_shared_queues


class Collector:
    """An OTLP/HTTP traces endpoint that keeps every span it is sent: (service, span) pairs."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, Any]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers.get("content-length", 0))))
                for resource_spans in request.resource_spans:
                    attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                    for scope in resource_spans.scope_spans:
                        for span in scope.spans:
                            collector.spans.append((attributes.get("service.name", "?"), span))
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/traces"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def named(self, prefix: str) -> list[tuple[str, Any]]:
        return [(service, span) for service, span in self.spans if span.name.startswith(prefix)]


@pytest.fixture(scope="module")
def traced(
    rabbitmq_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Collector]]:
    reset_shared_queues(rabbitmq_url, redis_url)
    collector = Collector()
    env = cluster_env(
        rabbitmq_url,
        redis_url,
        BARGEIN_PORT="0",
        BARGEIN_TRACE_EXPORTER="otlp",
        BARGEIN_OTLP_ENDPOINT=collector.url,
        OTEL_BSP_SCHEDULE_DELAY="200",  # export within a fraction of a second
    )
    with Cluster(env, Path(tmp_path_factory.mktemp("traces"))) as cluster:
        cluster.start()
        cluster.start("services.speech")
        yield cluster.start_edge(), collector
    collector.httpd.shutdown()


async def test_a_barge_in_is_one_trace_from_the_edge_to_the_cancelled_turn(
    traced: tuple[str, Collector],
) -> None:
    url, collector = traced
    session = await create_session(
        url, agent_options={"agent": "tests.integration.agents:probe", "tail": 40, "word_delay": 0.1}
    )
    async with websockets.connect(f"{session['ws_url']}?token={session['token']}") as ws:
        await ws.send(json.dumps({"type": "text", "text": "go"}))
        await until(ws, "agent_chunk")
        await asyncio.sleep(0.3)
        await ws.send(json.dumps({"type": "interrupt"}))
        await until(ws, "clear")
        await ws.send(json.dumps({"type": "end"}))
    for _ in range(200):  # the services export in batches, each on its own schedule
        barge_ins = collector.named("dispatch UserStartedSpeaking")
        known = {span.span_id for _, span in collector.spans}
        if (
            collector.named("turn 1")
            and len(barge_ins) >= 2
            and all(span.parent_span_id in known for _, span in barge_ins)  # the edge's spans too
        ):
            break
        await asyncio.sleep(0.1)
    by_id = {span.span_id: (service, span) for service, span in collector.spans}
    (turn_service, turn), *_ = collector.named("turn 1")
    assert turn_service == "bargein-reasoning"
    # the turn continues the trace of the edge's `client text` span, through the envelope, as does
    # the dispatch of the event that started it
    parent_service, parent = by_id[turn.parent_span_id]
    assert (parent_service, parent.name) == ("bargein-broadcast", "client text")
    dispatches = [
        s for _, s in collector.named("dispatch UserStoppedSpeaking") if s.trace_id == turn.trace_id
    ]
    assert dispatches and dispatches[0].parent_span_id == parent.span_id
    # the turn says it was cut off, and by what
    attributes = {a.key: a.value.string_value for a in turn.attributes}
    assert attributes["bargein.interrupted_by"] == "UserStartedSpeaking"
    assert [e.name for e in turn.events] == ["interrupted"]
    # the barge-in is a trace of its own, from the stop button at the edge to the owner, linked to
    # the turn it cut
    # (a text turn is announced as speech too: its own UserStartedSpeaking is in the text's trace)
    barges = [
        span
        for _, span in collector.named("dispatch UserStartedSpeaking")
        if span.parent_span_id in by_id and by_id[span.parent_span_id][1].name == "client interrupt"
    ]
    assert len(barges) == 1, [by_id.get(s.parent_span_id) for _, s in collector.named("dispatch UserStarted")]
    (barge,) = barges
    assert barge.trace_id != turn.trace_id
    assert [link.span_id for link in barge.links] == [turn.span_id]
