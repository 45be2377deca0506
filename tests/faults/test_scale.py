"""``bargein bench scale --cluster`` on a private 3-node cluster, small: the stack's sessions are
created, measured on every node and answered, and each mailbox design comes back after the node
holding its mailbox's leader is SIGKILLed (the failover the issue's decision weighs)."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest

from bargein.tools.bench_scale import run_scale_bench
from bargein.tools.bench_sessions import broker_nodes
from bargein.tools.private_brokers import PrivateRabbit


@pytest.mark.timeout(900)
async def test_bench_scale_on_a_cluster_measures_both_designs_and_their_failover(
    rabbitmq_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BARGEIN_REDIS_URL", redis_url)
    out = io.StringIO()
    results = await run_scale_bench(
        levels=(8,), active=2, active_s=2.0, cluster=True, design_sessions=20, samples=5, out=out
    )
    text = out.getvalue()
    assert results["cluster"] is True, text
    (level,) = results["levels"]
    assert level["idle"] == 8 and level["starts_per_s"] > 0, text
    assert level["bytes"]["rabbitmq"] is not None, text  # every node's memory was read
    assert level["turns"]["turns"] >= 2 and level["turns"]["failed"] == 0, text
    for design in ("per-session", "partitioned"):
        row = results["designs"][design]
        assert row["control"]["n"] == 5, (design, text)
        # the first message sent after the leader's node died was handled: no mailbox was lost
        assert row["failover_s"] is not None and row["failover_s"] < 60, (design, text)
    assert results["designs"]["per-session"]["kb"] is not None, text
    assert "could not tell which node leads" not in text, text


async def test_the_benches_measure_the_broker_the_url_names_not_the_default_node(
    tmp_path: Path, rabbitmq_url: str
) -> None:
    """Pointed at another broker than the CLI's default node, ``bench scale`` and ``bench sessions``
    read that broker's memory, CPU and open files (they read the default node's, before)."""
    rabbit = PrivateRabbit(tmp_path)
    await asyncio.to_thread(rabbit.start)
    try:
        assert await broker_nodes(rabbit.url) == [rabbit.node]
    finally:
        await asyncio.to_thread(rabbit.stop)
    here = await broker_nodes(rabbitmq_url)
    assert len(here) == 1 and here != [rabbit.node], here
