"""``bargein bench peers``: bargein beside Line 0.1.12 and Pipecat 1.14 on the same workload, in one
run (:mod:`bargein.tools.peer_workloads` says what the workload is and what is measured): bargein in
process and bargein distributed (one worker over RabbitMQ and Redis).

Each framework runs in a fresh process, and the runs are interleaved (bargein, Line, Pipecat, then
again), so a machine that gets busier mid-run burdens them alike. For each session count the bench
reports, per framework: interrupt → ``CancelledError`` p50 / p99, interrupt → the turn's last chunk
at the sink p50 / p99, chunks after the interrupt per 1,000 interrupts, interrupts whose handler
ran, next turns that went wrong, and CPU time per chunk. The target: bargein's CPU per chunk within
1.2 times the cheaper peer's, over all rounds. CPU time per chunk varies by a fifth from one run to
the next here, whatever the framework (the machine is shared), so the bench also prints the ratio of
each round, whose runs followed one another, and their median. ``--json`` writes every number;
``--plot`` draws the latency distributions (matplotlib, an optional extra). A framework that is not
installed is reported as such (the ``peers`` extra installs both peers).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, TextIO

from bargein.tools.benchkit import percentile, say, verdict
from bargein.tools.peer_workloads import FRAMEWORKS

PEERS = ("line", "pipecat")  # the others are bargein's own runtimes
TARGET_CPU_RATIO = 1.2
RUN_TIMEOUT_S = 600.0


def run_one(framework: str, sessions: int, seconds: float, chunk_ms: float, seed: int) -> dict[str, Any]:
    """One framework, one session count, in a process of its own."""
    settings = {"sessions": sessions, "seconds": seconds, "chunk_ms": chunk_ms, "seed": seed}
    done = subprocess.run(
        [sys.executable, "-m", "bargein.tools.peer_workloads", framework, json.dumps(settings)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S + seconds,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"framework": framework, "error": f"exit {done.returncode}: {done.stderr.strip()[-500:]}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The rounds of one framework at one session count, as one result."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {"error": runs[0].get("error", "no run")}
    cancel = sorted(ms for r in ok for ms in r["cancel_ms"])
    last = sorted(ms for r in ok for ms in r["last_chunk_ms"])
    interrupts = sum(r["interrupts"] for r in ok)
    chunks = sum(r["chunks"] for r in ok)
    return {
        "interrupts": interrupts,
        "chunks": chunks,
        "cancel_p50_ms": percentile(cancel, 50),
        "cancel_p99_ms": percentile(cancel, 99),
        "last_chunk_p50_ms": percentile(last, 50),
        "last_chunk_p99_ms": percentile(last, 99),
        "chunks_after_per_1000": 1000 * sum(sum(r["chunks_after"]) for r in ok) / max(1, interrupts),
        "handler_ran": sum(r["handler_ran"] for r in ok) if ok[0]["has_handler"] else None,
        "not_cancelled": sum(r["not_cancelled"] for r in ok),
        "next_turn_wrong": sum(r["next_turn_wrong"] for r in ok),
        "cpu_us_per_chunk": 1e6 * sum(r["cpu_s"] for r in ok) / max(1, chunks),
        "chunks_per_s": chunks / max(1e-9, sum(r["wall_s"] for r in ok)),
        "cancel_ms": cancel,
    }


def run_peers_bench(
    sessions: list[int],
    seconds: float,
    rounds: int,
    chunk_ms: float = 20.0,
    out: TextIO | None = None,
    frameworks: tuple[str, ...] = FRAMEWORKS,
) -> dict[str, Any]:
    out = out if out is not None else sys.stdout  # (looked up now: a test may have replaced it)
    report: dict[str, Any] = {"chunk_ms": chunk_ms, "seconds": seconds, "rounds": rounds, "results": {}}
    say(out, f"peers bench: {', '.join(frameworks)}; {rounds} interleaved rounds of {seconds:g} s each")
    for count in sessions:
        runs: dict[str, list[dict[str, Any]]] = {f: [] for f in frameworks}
        for round_number in range(rounds):
            for framework in frameworks:
                say(out, f"  S={count} round {round_number + 1}: {framework} ...")
                runs[framework].append(run_one(framework, count, seconds, chunk_ms, seed=round_number))
        results = {framework: merge(framework_runs) for framework, framework_runs in runs.items()}
        report["results"][str(count)] = results
        report.setdefault("round_ratios", {})[str(count)] = round_ratios(runs)
        _table(out, count, chunk_ms, results, report["round_ratios"][str(count)])
    return report


def _cpu_per_chunk(run: dict[str, Any]) -> float | None:
    return None if "error" in run or not run["chunks"] else run["cpu_s"] / run["chunks"]


def round_ratios(runs: dict[str, list[dict[str, Any]]]) -> list[float]:
    """bargein's CPU per chunk over the cheaper peer's, round by round (runs close in time)."""
    ratios = []
    for i, ours in enumerate(runs.get("bargein", [])):
        theirs = [cost for f in PEERS if f in runs for cost in [_cpu_per_chunk(runs[f][i])] if cost]
        cost = _cpu_per_chunk(ours)
        if cost and theirs:
            ratios.append(cost / min(theirs))
    return ratios


def _table(
    out: TextIO, count: int, chunk_ms: float, results: dict[str, dict[str, Any]], ratios: list[float]
) -> None:
    say(out, f"S={count} sessions, a chunk every {chunk_ms:g} ms each:")
    say(out, "  framework             cancel p50/p99 ms   last chunk p50/p99 ms   after/1000   handler   "
             "next wrong   CPU/chunk   chunks/s")  # fmt: skip
    for framework, r in results.items():
        if "error" in r:
            say(out, f"  {framework:<20}  {r['error']}")
            continue
        handler = "n/a" if r["handler_ran"] is None else f"{r['handler_ran']}/{r['interrupts']}"
        say(
            out,
            f"  {framework:<20}  {r['cancel_p50_ms']:6.2f} / {r['cancel_p99_ms']:7.2f}    "
            f"{r['last_chunk_p50_ms']:7.2f} / {r['last_chunk_p99_ms']:7.2f}      "
            f"{r['chunks_after_per_1000']:8.1f}   {handler:>9}   {r['next_turn_wrong']:>6}      "
            f"{r['cpu_us_per_chunk']:6.0f} µs   {r['chunks_per_s']:7.0f}",
        )
    peers = [r["cpu_us_per_chunk"] for f, r in results.items() if f in PEERS and "error" not in r]
    ours = results.get("bargein", {})
    if peers and "error" not in ours:
        ratio = ours["cpu_us_per_chunk"] / min(peers)
        met = verdict(ratio <= TARGET_CPU_RATIO)
        target = f"target <= {TARGET_CPU_RATIO}x: {met}"
        say(out, f"  bargein's CPU per chunk / the cheaper peer's: {ratio:.2f}x ({target})")
    if len(ratios) > 1:
        each = ", ".join(f"{r:.2f}x" for r in ratios)
        say(out, f"  round by round: {each}; median {statistics.median(ratios):.2f}x")


def plot(report: dict[str, Any], path: Path) -> None:
    """The interrupt → CancelledError distributions, one panel per session count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = list(report["results"])
    figure, axes = plt.subplots(1, len(counts), figsize=(6 * len(counts), 4), squeeze=False)
    for axis, count in zip(axes[0], counts, strict=True):
        for framework, r in report["results"][count].items():
            if "error" not in r and r["cancel_ms"]:
                values = r["cancel_ms"]
                axis.plot(values, [i / len(values) for i in range(len(values))], label=framework)
        axis.set_xscale("log")
        axis.set_xlabel("interrupt → CancelledError (ms)")
        axis.set_ylabel("fraction of interrupts")
        axis.set_title(f"S={count}, a chunk every {report['chunk_ms']:g} ms")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path)


def main(
    sessions: str = "50,200",
    seconds: float = 8.0,
    rounds: int = 3,
    chunk_ms: float = 20.0,
    json_path: str | None = None,
    plot_path: str | None = None,
) -> int:
    try:
        counts = [int(n) for n in sessions.split(",") if n.strip()]
    except ValueError:
        print(f"bargein bench peers: --sessions must be numbers, got {sessions!r}", file=sys.stderr)
        return 2
    if not counts or min(counts) < 1 or seconds <= 0 or rounds < 1 or chunk_ms <= 0:
        print(
            "bargein bench peers: sessions, seconds, rounds and --chunk-ms must be positive", file=sys.stderr
        )
        return 2
    report = run_peers_bench(counts, seconds, rounds, chunk_ms)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1))
        print(f"wrote {json_path}")
    if plot_path:
        try:
            plot(report, Path(plot_path))
        except ImportError:
            print(
                "bargein bench peers: --plot needs matplotlib (pip install 'bargein[plot]')", file=sys.stderr
            )
            return 1
        print(f"wrote {plot_path}")
    return 0
