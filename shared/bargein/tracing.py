"""Traces that follow a turn across processes.

Every envelope's ``trace`` field carries W3C trace context (``traceparent``), injected from whatever
span is current when the envelope is made (:meth:`Envelope.wrap`). A consumer continues the trace
from it: the session runtime opens a ``dispatch`` span per event and a ``turn`` span per route run,
under the span of the event that started it, so a caller's text turn, the speech detector's
barge-in, the reasoning turn it cancels and the chunks that reach the edge line up in one trace.

Nothing is exported unless ``BARGEIN_TRACE_EXPORTER`` says where (``console`` or ``otlp``); without a
configured provider OpenTelemetry's API is a no-op, and injection writes nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import ProxyTracerProvider, Span, SpanKind

from bargein.settings import CoreSettings

tracer = trace.get_tracer("bargein")


# The session and the turn the code running now works for, for log lines (bargein.hosting.logs):
# set by the session runtime in its tasks and around each event it handles.
SESSION: contextvars.ContextVar[str | None] = contextvars.ContextVar("bargein_session", default=None)
TURN: contextvars.ContextVar[int | None] = contextvars.ContextVar("bargein_turn", default=None)


def trace_id() -> str | None:
    """The current span's trace id (hex), if tracing is on and a span is current."""
    context = trace.get_current_span().get_span_context()
    return format(context.trace_id, "032x") if context.is_valid else None


# OpenTelemetry installs a provider named by this variable on first use (read once: the environment
# of a running process does not change under it)
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def active() -> bool:
    """Whether a tracer provider is installed. Without one every span is a no-op, and the hot paths
    (every chunk published, every interrupt dispatched) skip tracing work altogether. Asked for
    every event dispatched, so it reads the provider OpenTelemetry holds rather than calling
    ``get_tracer_provider``, which looks the variable above up in ``os.environ`` each time it has
    none (a fifth of a dispatch's cost)."""
    provider = getattr(trace, "_TRACER_PROVIDER", None)  # set once, by set_tracer_provider
    if provider is None:
        if not _PROVIDER_FROM_ENV:
            return False
        provider = trace.get_tracer_provider()
    return not isinstance(provider, ProxyTracerProvider)


def current_carrier() -> dict[str, str]:
    """The current trace context as envelope headers (empty when there is no span: always, without
    a tracer provider, so that is not even asked for every message)."""
    if not active() or not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


@contextlib.contextmanager
def span(
    name: str,
    carrier: Mapping[str, str] | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    **attributes: Any,
) -> Iterator[Span | None]:
    """A span continuing ``carrier``'s trace (or the current one), or nothing when tracing is off.
    Exceptions (a cancelled turn, above all) are not recorded as errors: interrupts are normal."""
    if not active():
        yield None
        return
    parent = context_of(carrier) if carrier is not None else None
    with tracer.start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes={f"bargein.{k}": v for k, v in attributes.items()},
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        yield current


def start_span(name: str, **attributes: Any) -> Span | None:
    """A child of the current span that is not made current (for work that spans an async
    generator's yields, where a current span would leak into the consumer); end it yourself."""
    if not active():
        return None
    return tracer.start_span(name, attributes={f"bargein.{k}": v for k, v in attributes.items()})


def link_current_to(target: Span | None) -> None:
    """Link the current span (an interrupt's dispatch) to ``target`` (the turn it cuts off)."""
    current = trace.get_current_span()
    if target is not None and current.get_span_context().is_valid:
        current.add_link(target.get_span_context(), {"bargein.link": "interrupted"})


def context_of(carrier: Mapping[str, str]) -> Context:
    """The trace context an envelope carries, to continue it."""
    return propagate.extract(dict(carrier))


def configure(settings: CoreSettings, service_name: str) -> None:
    """Install a tracer provider that exports where the settings say (once, at process start)."""
    if settings.trace_exporter == "none":
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    exporter: SpanExporter
    if settings.trace_exporter == "console":
        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = (
            OTLPSpanExporter(endpoint=settings.otlp_endpoint)
            if settings.otlp_endpoint
            else OTLPSpanExporter()
        )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
