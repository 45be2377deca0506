"""Trace context travels in envelopes: a turn and its output continue the trace of what started it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bargein import UserStartedSpeaking, UserStoppedSpeaking
from bargein.agent.llm import OpenAICompatibleLLM
from bargein.testing import LocalSession
from bargein.tracing import context_of, tracer

from ..agents import interruptible_agent
from .helpers import take_chunks, wait_for
from .test_llm import FakeOpenAIServer, server  # noqa: F401  (the fixture)

_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> Iterator[None]:
    """The SDK's provider with an in-memory exporter (the global provider can be set only once)."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        sdk = TracerProvider()
        sdk.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(sdk)
    yield
    _EXPORTER.shutdown()  # later tests in this process record nothing more
    _EXPORTER.clear()


@pytest.fixture(autouse=True)
def clean() -> None:
    _EXPORTER.clear()


agent = interruptible_agent(replies=("a b c d e f g h",), tokens_per_second=50)


def spans(name: str) -> list[ReadableSpan]:
    return [s for s in _EXPORTER.get_finished_spans() if s.name.startswith(name)]


async def test_a_turn_and_its_output_continue_the_callers_trace() -> None:
    async with LocalSession(agent) as s:
        with tracer.start_as_current_span("caller") as root:
            await s.emit(UserStoppedSpeaking())
        trace_id = root.get_span_context().trace_id
        await s.collect_turn()
        await wait_for(lambda: bool(spans("turn 1")))
    (dispatch,) = spans("dispatch UserStoppedSpeaking")
    (turn,) = spans("turn 1")
    assert dispatch.context is not None and turn.context is not None
    assert dispatch.context.trace_id == turn.context.trace_id == trace_id
    assert turn.parent is not None and turn.parent.span_id == root.get_span_context().span_id
    # every chunk the agent published carries the turn's span as its parent
    for envelope, _ in s.received:
        carried = trace.get_current_span(context_of(envelope.trace)).get_span_context()
        assert carried.trace_id == trace_id and carried.span_id == turn.context.span_id


async def test_an_interrupted_turn_says_so_in_its_span() -> None:
    async with LocalSession(agent) as s:
        with tracer.start_as_current_span("caller"):
            await s.emit(UserStoppedSpeaking())
        await take_chunks(s, 2)
        await s.emit(UserStartedSpeaking())
        await wait_for(lambda: bool(spans("turn 1")))
    (turn,) = spans("turn 1")
    assert turn.attributes is not None and turn.attributes["bargein.interrupted_by"] == "UserStartedSpeaking"
    assert [e.name for e in turn.events] == ["interrupted"]
    # the barge-in's own trace (its dispatch) links to the turn it cut off
    (barge,) = spans("dispatch UserStartedSpeaking")
    assert turn.context is not None
    assert [link.context.span_id for link in barge.links] == [turn.context.span_id]


async def test_the_llm_request_has_a_span_with_its_time_to_first_token(
    server: FakeOpenAIServer,  # noqa: F811 - the fixture imported above
) -> None:
    llm = OpenAICompatibleLLM(base_url=server.base_url, api_key="k", model="m", max_retries=0)
    with tracer.start_as_current_span("turn"):
        chunks = [c.text async for c in llm.generate_stream([{"role": "user", "content": "hi"}])]
    await llm.aclose()
    assert "".join(chunks)
    (request,) = spans("llm request")
    assert request.attributes is not None and request.attributes["bargein.model"] == "m"
    assert float(request.attributes["bargein.first_token_ms"]) >= 0


async def test_a_caller_event_without_a_trace_starts_one_at_the_owner() -> None:
    async with LocalSession(agent) as s:
        await s.emit(UserStoppedSpeaking())
        events = await s.collect_turn()
        assert events
    # the session's own spans exist (the runtime opens them), but the caller's event had no parent
    (dispatch,) = spans("dispatch UserStoppedSpeaking")
    assert dispatch.parent is None
