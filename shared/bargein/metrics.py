"""Every metric bargein exports, in one place (Prometheus, through the official ``prometheus-client``).

Each service serves them at ``/metrics``: the edge on its own port, the workers (reasoning, speech) on
their probe port (``BARGEIN_PROBE_PORT``, :mod:`bargein.hosting.probes`). One process is one service,
so the process-wide default registry is the service's. Latencies are measured from an event's
envelope timestamp (``Envelope.ts``, the publisher's wall clock) to the effect here: across
machines that relies on their clocks agreeing (NTP), as every distributed latency does.

The services' own counters (``Edge.count``, ``SessionRuntime.count``, the speech sessions' and the
workers') are exported too, by name, as ``bargein_events_total{service, event}``: everything that is
counted anywhere can be graphed, without a metric per counter.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

# from a millisecond to a few seconds: interrupts land at the low end, turns at the high end
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST

INTERRUPT_TO_CANCEL = Histogram(
    "bargein_interrupt_to_cancel_seconds",
    "An interrupt published → the generation it cuts off cancelled (reasoning).",
    buckets=LATENCY_BUCKETS,
)
INTERRUPT_TO_CLEAR = Histogram(
    "bargein_interrupt_to_clear_seconds",
    "A barge-in published → clear sent to the session's clients (edge).",
    buckets=LATENCY_BUCKETS,
)
ONSET_TO_PAUSE = Histogram(
    "bargein_onset_to_pause_seconds",
    "The caller's speech onset published (UserSpeechOnset) → the agent's audio paused (edge).",
    buckets=LATENCY_BUCKETS,
)
TURN_TO_FIRST_CHUNK = Histogram(
    "bargein_turn_to_first_chunk_seconds",
    "The event that started a turn (the end of the caller's speech) published → its first chunk published.",
    buckets=LATENCY_BUCKETS,
)
TURN_TO_FIRST_AUDIO = Histogram(
    "bargein_turn_to_first_audio_seconds",
    "The end of the caller's speech seen at the edge → the answer's first audio sent (edge).",
    buckets=LATENCY_BUCKETS,
)
LLM_FIRST_TOKEN = Histogram(
    "bargein_llm_first_token_seconds", "LLM request → its first token.", buckets=LATENCY_BUCKETS
)
STT_SECONDS = Histogram(
    "bargein_stt_seconds", "One transcription, by engine.", ["engine"], buckets=LATENCY_BUCKETS
)
TTS_SECONDS = Histogram(
    "bargein_tts_seconds", "One phrase synthesised, by engine.", ["engine"], buckets=LATENCY_BUCKETS
)
VAD_TICK_SECONDS = Histogram(
    "bargein_vad_tick_seconds", "One batched VAD inference.", buckets=LATENCY_BUCKETS
)
VAD_BATCH_SESSIONS = Histogram(
    "bargein_vad_batch_sessions",
    "Sessions in one batched VAD inference.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
GC_PAUSE_SECONDS = Histogram(
    "bargein_gc_pause_seconds",
    "One pass of Python's garbage collector (the event loop waits for it), by generation.",
    ["generation"],
    buckets=LATENCY_BUCKETS,
)
SESSIONS = Gauge("bargein_sessions", "Sessions this process owns (workers) or serves (edge).", ["tier"])
QUEUE_BACKLOG = Gauge("bargein_edge_backlog", "Chunks waiting in RabbitMQ for this edge process.")
# What the services count, by service: the totals of every Counted and of count(). They are read
# when /metrics is scraped (_EventsCollector), not pushed into a prometheus-client Counter as they
# grow: a counter is bumped several times for every chunk, and a labelled child's lock and float
# cost five times what the plain dictionary does.
_TOTALS: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)


class _EventsCollector(Collector):
    """``bargein_events_total{service, event}``: every service counter, as it stands when scraped."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "bargein_events",
            "What the services count (dropped chunks, clears, adoptions, bad frames, rate-limited "
            "clients, ...).",
            labels=["service", "event"],
        )
        for service, counts in list(_TOTALS.items()):
            for event, n in list(counts.items()):
                family.add_metric([service, event], n)
        yield family


REGISTRY.register(_EventsCollector())


def count(service: str, event: str, n: int = 1) -> None:
    _TOTALS[service][event] += n


def events_total(service: str, event: str) -> int:
    """What ``bargein_events_total{service, event}`` says now."""
    return _TOTALS[service][event]


class Counted(collections.Counter[str]):
    """A service's counters (``counters["bad_frames"] += 1``), also exported as
    ``bargein_events_total{service=..., event=...}``: every increase is added to the service's
    total."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service
        self._total = _TOTALS[service]

    def __setitem__(self, key: str, value: int) -> None:
        grew = value - self.get(key, 0)
        super().__setitem__(key, value)
        if grew > 0:
            self._total[key] += grew


def since(published: float) -> float:
    """Seconds from an envelope's timestamp to now (never negative: clocks may disagree a little)."""
    return max(0.0, time.time() - published)


def exposition() -> bytes:
    """The process's metrics in the Prometheus text format."""
    return generate_latest()
