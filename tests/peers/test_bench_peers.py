"""``bargein bench peers`` runs each framework's workload and reports every number it names.

A short run (a few sessions for a second) on each of bargein (in process, and distributed over the
test's RabbitMQ and Redis), Line 0.1.12 and Pipecat 1.14 (the ``peers`` extra, part of the dev
install): no speed is asserted, only that every framework ran, was interrupted, and that bargein's
answers are exact (handler ran, next turn right, no chunk lost).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from bargein.tools.bench_peers import main, round_ratios


@pytest.fixture
def brokers(rabbitmq_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The distributed run's RabbitMQ and Redis, for the workload's own process."""
    monkeypatch.setenv("BARGEIN_RABBITMQ_URL", rabbitmq_url)
    monkeypatch.setenv("BARGEIN_REDIS_URL", redis_url)


def test_every_framework_runs_the_workload_and_is_measured(
    tmp_path: Path, brokers: None, capsys: pytest.CaptureFixture[str]
) -> None:
    report, picture = tmp_path / "peers.json", tmp_path / "peers.png"
    assert main("3", 1.5, 1, 20.0, str(report), str(picture)) == 0
    results = json.loads(report.read_text())["results"]["3"]
    assert set(results) == {"bargein", "bargein-distributed", "line", "pipecat"}
    for framework, result in results.items():
        assert "error" not in result, (framework, result)
        assert result["interrupts"] >= 3 and result["chunks"] > 50, (framework, result)
        assert result["not_cancelled"] == 0, framework  # every interrupt cancelled the generation
        assert not math.isnan(result["cancel_p50_ms"]) and result["cpu_us_per_chunk"] > 0
    for ours in (results["bargein"], results["bargein-distributed"]):
        assert ours["handler_ran"] == ours["interrupts"] and ours["next_turn_wrong"] == 0
    assert results["line"]["handler_ran"] == results["line"]["interrupts"]
    assert results["pipecat"]["handler_ran"] is None  # Pipecat has no interrupt handler
    text = capsys.readouterr().out
    assert "CPU per chunk / the cheaper peer's" in text and "target <= 1.2x" in text
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_settings_are_refused() -> None:
    assert main("x", 1.0, 1) == 2  # a bad --sessions
    assert main("2", 0.0, 1) == 2  # no time to measure


def test_each_round_compares_bargein_with_the_cheaper_peer_of_that_round() -> None:
    def run(cpu_s: float, chunks: int = 1000) -> dict[str, Any]:
        return {"cpu_s": cpu_s, "chunks": chunks}

    runs: dict[str, list[dict[str, Any]]] = {
        "bargein": [run(0.2), run(0.3), {"error": "exit 1"}],
        "line": [run(0.25), run(0.2), run(0.2)],
        "pipecat": [run(0.1), {"error": "not installed"}, run(0.2)],
    }
    # round 1: Pipecat was cheaper (2x); round 2: only Line ran (1.5x); round 3: bargein did not run
    assert round_ratios(runs) == pytest.approx([2.0, 1.5])
    assert round_ratios({"bargein": [run(0.2)]}) == []  # no peer: nothing to compare
