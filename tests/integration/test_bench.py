"""A short run of ``bargein bench interrupt``: it runs end to end and reports sane numbers.

It asserts no timing: the bench's targets are ratios a run *reports* (on a shared, noisy machine a
test that asserted them would fail for reasons that have nothing to do with the code). What it does
check is that every interrupt and every raw message was measured, that the numbers are positive,
that the report printed both rows, and that the run left nothing behind.
"""

from __future__ import annotations

import io
import math

import aio_pika
import pytest
import redis

from bargein.settings import BrokerSettings, load
from bargein.tools.bench import (
    busy_hop_queue,
    busy_samples_key,
    interrupt_samples_key,
    raw_samples_key,
    run_interrupt_bench,
)
from bargein.wire.names import TIER_REASONING, session_directory_key

SESSIONS = 10
SAMPLES = 20


async def test_interrupt_bench_runs_and_reports(rabbitmq_url: str, redis_url: str) -> None:
    out = io.StringIO()
    result = await run_interrupt_bench(
        sessions=SESSIONS,
        samples=SAMPLES,
        workers=1,
        rabbitmq_url=rabbitmq_url,
        redis_url=redis_url,
        out=out,
        warmup_s=0.2,
    )
    report = out.getvalue()

    # every sample is measured: each interrupt is aimed at a turn that is streaming (so its
    # generator is always cancelled and its handler always reports), and the bench waits for the
    # reports before reading them
    assert result["interrupt"]["count"] == SAMPLES, report
    assert result["raw"]["count"] == SAMPLES, report
    assert result["busy_raw"]["count"] == SAMPLES, report  # the busy baseline: the same delivery
    for row in ("interrupt", "raw", "busy_raw"):
        numbers = result[row]
        assert 0 < numbers["p50_ms"] <= numbers["p99_ms"] <= numbers["max_ms"], numbers
        assert math.isfinite(numbers["max_ms"]), numbers
    assert result["ratio_p50"] > 0 and result["ratio_p99"] > 0
    assert result["busy_ratio_p50"] > 0 and result["busy_ratio_p99"] > 0
    assert isinstance(result["busy_p50_met"], bool) and 0 < result["busy_cores"] < 1.5
    assert result["busy_chunks_per_s"] > 0  # it was busy: its chunks reached the bench
    # and its messages took the interrupts' kind of queue: a partition's (the default design) or,
    # with a mailbox per session, a priority mailbox (a classic queue delivers ~0.8 ms sooner)
    partitioned = load(BrokerSettings).partition_count > 0
    assert result["busy_mailbox"] == ("quorum" if partitioned else "priority"), report
    assert ("to a quorum queue" in report) == partitioned, report
    assert isinstance(result["p50_met"], bool) and isinstance(result["p99_met"], bool)
    assert result["sessions"] == SESSIONS and result["workers"] == 1
    assert result["chunks_per_s"] > 0
    # the worker's share of a core while it streamed (Linux's /proc), and its rate a core
    assert 0 < result["worker_cores"] < 1.5 and result["chunks_per_worker_core"] > result["chunks_per_s"]
    assert "of a core" in report

    assert "interrupt → CancelledError" in report
    assert "raw publish → consume" in report
    assert "busy raw: the same delivery" in report and "against the busy raw baseline" in report
    assert "ratio p50" in report and "ratio p99" in report
    assert "all 10 streaming" in report

    # it cleaned up after itself: sample lists gone, no bench session left in the directory
    client = redis.Redis.from_url(redis_url)
    try:
        run = result["run_id"]
        assert not client.exists(interrupt_samples_key(run), raw_samples_key(run), busy_samples_key(run))
        leftovers = [
            name
            for name in client.hkeys(session_directory_key(TIER_REASONING))
            if name.decode().startswith(f"bench-{run}-")
        ]
        assert leftovers == []
    finally:
        client.close()
    # and the busy baseline's durable queue is gone
    connection = await aio_pika.connect(rabbitmq_url)
    try:
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await (await connection.channel()).declare_queue(busy_hop_queue(run), passive=True)
    finally:
        await connection.close()
