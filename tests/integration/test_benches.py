"""Short runs of the reliability benches: each runs end to end against real service processes.

As with ``test_bench.py``, no timing is asserted (targets are what a run *reports*); what is checked
is that every sample was measured, the numbers are sane, the report names its targets, and the run
left nothing behind for the next one to trip over.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from bargein.tools.bench_all import SCENARIOS
from bargein.tools.bench_checkpoint import run_checkpoint_bench
from bargein.tools.bench_failover import damage
from bargein.tools.bench_throughput import run_throughput_bench
from bargein.wire.names import TIER_REASONING, TIER_SPEECH, session_directory_key


def bench_sessions_left(redis_url: str, prefix: str) -> list[str]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [
            name.decode()
            for tier in (TIER_REASONING, TIER_SPEECH)
            for name in client.hkeys(session_directory_key(tier))
            if name.decode().startswith(prefix)
        ]
    finally:
        client.close()


def test_damage_counts_repeats_and_gaps() -> None:
    # the failover bench's verdict rests on this diff: it must see both kinds of damage
    assert damage("one two three", "one two three") == (0, 0)
    assert damage("one two two three", "one two three")[0] > 0
    assert damage("one three", "one two three")[1] > 0


async def test_throughput_bench_runs_and_reports(rabbitmq_url: str, redis_url: str) -> None:
    out = io.StringIO()
    result = await run_throughput_bench(
        sessions=4, chunks=2_000, window=200, rabbitmq_url=rabbitmq_url, redis_url=redis_url, out=out
    )
    report = out.getvalue()
    assert result["chunks"] == 2_000 and result["sessions"] == 4
    assert result["raw_per_s"] > 0 and result["edge_per_s"] > 0, report
    assert result["ratio"] == result["edge_per_s"] / result["raw_per_s"]
    assert isinstance(result["rate_met"], bool) and isinstance(result["ratio_met"], bool)
    # the control probe ran under the load: interrupts overtook the data and came back as clears
    assert result["clear"]["count"] > 0, report
    assert 0 < result["clear"]["p50_ms"] <= result["clear"]["max_ms"]
    assert "raw publish → consume" in report and "through one edge" in report
    assert "target ≥ 5,000" in report and "target ≥ 0.70" in report
    assert bench_sessions_left(redis_url, f"bench{result['run_id']}") == []


def test_the_sessions_bench_runs_its_stack_on_a_model_server() -> None:
    """``--llm server``: the agent's answers come over HTTP from the bench's model server (the
    path a deployment takes, which the scripted model in process never paid), every session's."""
    done = run_cli("bench", "sessions", "--sessions", "4", "--concurrency", "2", "--llm", "server")
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert re.search(r"the agent's model: an OpenAI-compatible server at http://127\.0\.0\.1:\d+/v1", report)
    assert re.search(r"sessions created per second \(with the first answer\): \d", report), report
    answered = re.search(r"the model server streamed (\d+) answers", report)
    assert answered is not None and int(answered.group(1)) >= 4, report


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bargein.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_barge_in_decision_bench_runs_and_reports(tmp_path: Path) -> None:
    report = tmp_path / "decisions.json"
    done = run_cli("bench", "bargein-decisions", "--voices", "en-us", "--rates", "170", "--phrases", "2",
                   "--json", str(report))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "6 clips" in out and "real interruptions that interrupted" in out and "target ≥ 95%" in out
    assert "backchannels and noises that did not" in out and "target ≥ 90%" in out
    assert "decision after the caller began: p50" in out
    data = json.loads(report.read_text())
    assert len(data["clips"]) == 6 and {c["kind"] for c in data["clips"]} == {
        "interruption",
        "backchannel",
        "noise",
    }
    assert 0 <= data["scores"]["recall"] <= 1


def test_the_speech_benches_refuse_to_run_without_an_engine() -> None:
    env = {**os.environ, "BARGEIN_STT": "none"}
    done = subprocess.run(
        [sys.executable, "-m", "bargein.tools.cli", "bench", "stt", "--phrases", "1"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 1 and "BARGEIN_STT" in done.stderr


async def test_the_checkpoint_bench_runs_and_reports(redis_url: str) -> None:
    out = io.StringIO()
    report = await run_checkpoint_bench(120, redis_url, out)
    text = out.getvalue()
    assert set(report.turns) == {1, 100, 120}
    assert report.history_events == 240  # the whole call came back
    # the baseline grows with the call, the journaled checkpoint does not
    assert report.turns[120]["whole_bytes"] > 20 * report.turns[1]["whole_bytes"]
    assert report.turns[120]["bytes"] < 2 * report.turns[1]["bytes"]
    assert "target <= 1.5x" in text and "target < 100 ms" in text


@pytest.mark.timeout(1200)
def test_bench_all_runs_every_scenario_and_tabulates_what_each_found(
    tmp_path: Path, rabbitmq_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the smoke test of every bench at once: each runs for a second or two, as `bench all --quick`
    monkeypatch.setenv("BARGEIN_RABBITMQ_URL", rabbitmq_url)
    monkeypatch.setenv("BARGEIN_REDIS_URL", redis_url)

    table, report = tmp_path / "performance.md", tmp_path / "all.json"
    done = subprocess.run(
        [sys.executable, "-m", "bargein.tools.cli", "bench", "all", "--quick",
         "--markdown", str(table), "--json", str(report), "--plots", str(tmp_path / "plots")],
        capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
    outcomes = {o["scenario"]: o for o in json.loads(report.read_text())["outcomes"]}
    assert set(outcomes) == {s.name for s in SCENARIOS}
    for name, outcome in outcomes.items():
        assert outcome["exit_code"] == 0, (name, outcome["output"][-20:])
        assert outcome["results"], (name, outcome["output"][-20:])  # it stated what it measured
    # what each scenario is there to report reached the table
    text = table.read_text()
    assert text.count("\n| ") == len(SCENARIOS) + 1  # the header and a row each
    for expected in ("ratio p50", "chunks/s", "kill → first resumed chunk", "per second", "restore:",
                     "CPU per chunk", "real-time sessions", "false cuts", "word error rate",
                     "real interruptions that interrupted"):  # fmt: skip
        assert expected in text, expected
    assert "--quick" in text and "cores" in text  # the command and the machine
    assert (tmp_path / "plots" / "peers.png").stat().st_size > 0
    # the failover, e2e and sessions benches' reports (they have no other smoke test)
    failover = "\n".join(outcomes["failover"]["output"])
    assert re.search(r"kill → first resumed chunk: p50 \d+ ms", failover), failover
    assert "characters repeated 0, missing 0" in failover, failover  # the answer arrived whole
    e2e = "\n".join(outcomes["e2e"]["output"])
    assert "false cuts" in e2e and "first agent audio" in e2e, e2e
    assert "agent's audio stopped" in e2e or "false cuts: 1 of 1" in e2e, e2e  # cut, or no barge-in said
    assert "synthesis request → audio" in e2e, e2e
    # a phone line beside the web, the same questions: both answered, the gap reported
    assert "web callers (1 rounds)" in e2e and "phone callers (1 rounds)" in e2e, e2e
    assert re.search(r"the phone's turn latency over the web's \(p50\): [+-]\d+ ms", e2e), e2e
    sessions = "\n".join(outcomes["sessions"]["output"])
    assert re.search(r"sessions created per second \(with the first answer\): \d", sessions), sessions
    for service in ("reasoning", "speech", "broadcast", "rabbitmq", "redis"):  # each measured here
        # measured, not n/a (five sessions may weigh less than a process's churn: "-1.2 KB")
        assert re.search(rf"^\s+{service}\s+-?\d", sessions, re.MULTILINE), (service, sessions)
    # measured with every caller still on the line; each hung up, and the services ended each session
    assert re.search(r"\((\d+) sessions, \1 callers connected\)", sessions), sessions
    assert "could not hang up" not in sessions and "had not ended" not in sessions, sessions
    # the scale bench's report (no other smoke test): each level measured everywhere with every
    # caller connected, the active callers answered, both mailbox designs measured on the broker
    scale = "\n".join(outcomes["scale"]["output"])
    assert re.search(r"sessions started a second \(with the first answer\): \d", scale), scale
    assert re.search(r"5 idle sessions \(5 callers connected\)", scale), scale
    for service in ("reasoning", "speech", "broadcast", "rabbitmq", "redis"):
        assert re.search(rf"memory per idle session, {service}\s+-?\d", scale), (service, scale)
    assert re.search(
        r"2 active callers: text → first chunk p50 \d+ ms, p95 \d+ ms \(\d+ turns, 0 failed\)", scale
    )
    assert re.search(
        r"^\s+per-session\s+\d+\s+\d+\.\d ms\s+-?\d+\.\d\s+\d+\.\d / \d+\.\d ms\s+\d+/s$", scale, re.M
    ), scale
    assert re.search(
        r"^\s+partitioned\s+no broker work\s+0\.0 ms\s+0\.0\s+\d+\.\d / \d+\.\d ms\s+\d+/s$", scale, re.M
    )
    assert "had not ended" not in scale, scale
    # the turn-taking bench's report (no other smoke test): each way of ending a turn measured, the
    # speculative turns counted by both services, the peers judged offline beside them
    turns = "\n".join(outcomes["turns"]["output"])
    variants = ("text", "text, no speculation", "smart-turn", "silence 500 ms")
    for variant in (*variants, "Pipecat smart-turn v3.2", "fixed 500 ms (LiveKit)"):
        assert re.search(rf"^\s+{re.escape(variant)}\s+\d+\.\d\s+\d+\.\d\s+\d+\s+\d+$", turns, re.M), (
            variant,
            turns,
        )
    assert re.search(r"speculative turns: (\d+) started, .* \(the reasoning owner: \1 started", turns), turns
    assert "target: premature answers" in turns and "target: end of speech → first agent audio" in turns
    # the speech-to-text bench's report, whole (it has no other smoke test)
    stt = "\n".join(outcomes["stt"]["output"])
    assert re.search(r"word error rate \d+\.\d% on the corpus, \d+\.\d% on the demo.s call", stt), stt
    assert re.search(r"words after the end of speech: p50 \d+ ms, p95 \d+ ms", stt), stt
    assert re.search(r"engine's own time per call: p50 \d+ ms", stt), stt
    assert re.search(r"real-time sessions one speech process serves here:( at least)? \d+", stt), stt
