"""``bargein bench all``: every bench, one after the other, and one table of what they found.

Each scenario runs as ``bargein bench <name> ...`` in a process of its own (as a user would run it,
so one that fails or hangs does not take the others with it), its output shown as it comes, each
line prefixed with the scenario's name. From each it keeps the lines that state a result: those
naming a target (the benches print ``target ... met`` / ``NOT met``), and, for the benches that
measure without a target, the lines the scenario names. The table (``--markdown PATH``) is what the
README's "Performance" section shows; ``--json PATH`` keeps every line and time; ``--plots DIR``
has the benches that draw (``peers``) draw there.

``--quick`` runs every scenario for a second or two with the smallest settings that still
measure: the smoke test's run, so that no bench can rot unnoticed. Its numbers mean nothing.

A scenario that cannot run here (speech-to-text without an engine, the peers extra missing) is
reported as such in its row, not silently left out. The exit status is 0 if every scenario ran
(targets met or not: a missed target is a result), 1 otherwise.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from bargein.tools.benchkit import say


@dataclass(frozen=True)
class Scenario:
    name: str  # the row's name
    command: tuple[str, ...]  # after ``bargein bench``
    quick: tuple[str, ...]  # the same, for a second or two
    what: str  # what it measures, in a few words
    results: str = r"target"  # a line that states a result matches this (case-insensitive)
    plots: bool = False  # takes ``--plot PATH``

    def answers_to(self, name: str) -> bool:
        """``--only`` names a scenario by its row or by its bench (``interrupt``: both of those)."""
        return name in (self.name, self.command[0])


SPEECH_CORPUS_QUICK = ("--voices", "en-us", "--rates", "170", "--phrases", "2")

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "interrupt",
        ("interrupt",),
        ("interrupt", "--sessions", "4", "--samples", "5"),
        "interrupt → CancelledError beside a raw broker hop and a busy raw baseline; 200 sessions, 100 ms"
        " chunks, one worker",
        r"target|count\s+p50|CancelledError|raw publish|busy raw",
    ),
    Scenario(
        "interrupt-20ms",
        ("interrupt", "--chunk-ms", "20"),
        ("interrupt", "--sessions", "4", "--samples", "5", "--chunk-ms", "20"),
        "the same under load: 200 sessions streaming a chunk every 20 ms through one worker",
        r"target|count\s+p50|CancelledError|raw publish|busy raw|streaming sessions, \d+ worker|of a core",
    ),
    Scenario(
        "throughput",
        ("throughput",),
        ("throughput", "--sessions", "2", "--chunks", "1000", "--window", "200"),
        "chunks/s through one edge process beside a raw aio-pika hop",
        r"target|raw publish|interrupt → clear",
    ),
    Scenario(
        "failover",
        ("failover",),
        ("failover", "--kills", "1"),
        "SIGKILL the owner mid-answer: time to the resumed chunk, repeats and gaps",
    ),
    Scenario(
        "sessions",
        ("sessions",),
        ("sessions", "--sessions", "5", "--concurrency", "2"),
        "sessions created per second; memory per idle session in each service",
        r"per second|^\s+(reasoning|speech|broadcast|rabbitmq|redis)\s",
    ),
    Scenario(
        "scale",
        ("scale",),
        (
            "scale",
            "--idle",
            "5",
            "--active",
            "2",
            "--active-s",
            "2",
            "--design-sessions",
            "20",
            "--samples",
            "5",
        ),
        "session starts and memory per idle session at 1k and 10k sessions, 200 active; mailbox designs",
        r"target|^\s+(per-session|partitioned)\s|text → first chunk",
    ),
    Scenario(
        "checkpoint",
        ("checkpoint",),
        ("checkpoint", "--turns", "120"),
        "a turn's checkpoint at turn 1, 100 and 1,000 of a call; restoring it",
        r"target|^\s+turn\s+\d",
    ),
    Scenario(
        "peers",
        ("peers",),
        ("peers", "--sessions", "2", "--seconds", "1", "--rounds", "1"),
        "bargein in process and distributed beside Line 0.1.12 and Pipecat 1.14: interrupts, CPU a chunk",
        r"target|^\s+(framework|bargein|line|pipecat)\S*\s|^S=|round by round",
        plots=True,
    ),
    Scenario(
        "vad",
        ("vad",),
        ("vad", "--sessions", "4", "--seconds", "0.5"),
        "voice activity detection: real-time sessions per core, batched and not",
    ),
    Scenario(
        "e2e",
        ("e2e",),
        ("e2e", "--callers", "1", "--rounds", "1"),
        "callers talking over the agent's voice: time to silence, false cuts, turn latency",
        r"target|first agent audio",
    ),
    Scenario(
        "turns",
        ("turns",),
        (
            "turns",
            "--voices",
            "en-us",
            "--rates",
            "170",
            "--sentences",
            "1",
            "--pauses",
            "800",
            "--callers",
            "1",
        ),
        "callers who pause mid-sentence or finish: premature answers, time to the answer, beside Pipecat",
        r"target|^\s+(turn end|judge|text|silence|pipecat|fixed)|speculative turns",
    ),
    Scenario(
        "stt",
        ("stt",),
        ("stt", *SPEECH_CORPUS_QUICK, "--clips", "2", "--sessions", "1"),
        "speech-to-text: word error rate, words after speech, real-time sessions per process",
        r"word error rate|words after the end|real-time sessions one",
    ),
    Scenario(
        "barge-in decisions",
        ("bargein-decisions",),
        ("bargein-decisions", *SPEECH_CORPUS_QUICK),
        "real interruptions, backchannels and noises over the agent: is the cut right?",
        r"target|decision after",
    ),
)

SCENARIO_TIMEOUT_S = 3600.0


@dataclass
class Outcome:
    scenario: str
    command: str
    exit_code: int | None  # None: it timed out
    seconds: float
    what: str = ""  # what the scenario measures
    results: list[str] = field(default_factory=list)
    output: list[str] = field(default_factory=list)

    @property
    def ran(self) -> bool:
        return self.exit_code == 0


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "date": time.strftime("%Y-%m-%d"),
    }


def run_scenario(scenario: Scenario, quick: bool, out: TextIO, plots: Path | None = None) -> Outcome:
    arguments = scenario.quick if quick else scenario.command
    if plots is not None and scenario.plots:
        arguments = (*arguments, "--plot", str(plots / f"{scenario.command[0]}.png"))
    command = [sys.executable, "-m", "bargein.tools.cli", "bench", *arguments]
    shown = "bargein bench " + " ".join(arguments)
    say(out, f"== {scenario.name}: {shown}")
    pattern = re.compile(scenario.results, re.IGNORECASE)
    outcome = Outcome(scenario.name, shown, None, 0.0, scenario.what)
    started = time.monotonic()
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as child:
        assert child.stdout is not None
        timed_out = threading.Event()

        def give_up() -> None:  # a bench that hangs ends here
            timed_out.set()
            child.kill()

        watchdog = threading.Timer(SCENARIO_TIMEOUT_S, give_up)
        watchdog.start()
        try:
            for line in child.stdout:
                line = line.rstrip("\n")
                outcome.output.append(line)
                say(out, f"   {scenario.name} | {line}")
                if pattern.search(line):
                    outcome.results.append(line.strip())
            code = child.wait()
        finally:
            watchdog.cancel()
        outcome.exit_code = None if timed_out.is_set() else code
    outcome.seconds = time.monotonic() - started
    if not outcome.ran:
        why = "timed out" if outcome.exit_code is None else f"exit {outcome.exit_code}"
        last = [line for line in outcome.output if line.strip()][-1:] or ["(no output)"]
        outcome.results = [f"did not run ({why}): {last[0].strip()}"]
    say(out, f"== {scenario.name}: {'done' if outcome.ran else 'FAILED'} in {outcome.seconds:.0f} s")
    return outcome


def markdown(outcomes: list[Outcome], quick: bool, command: str) -> str:
    """The table the README shows."""
    facts = machine()
    lines = [
        f"Measured with `{command}` on {facts['date']}: {facts['cpu']}, {facts['cores']} cores, "
        f"{facts['system']}, Python {facts['python']}; RabbitMQ and Redis on the same machine."
        + (" A `--quick` run: its numbers mean nothing." if quick else ""),
        "",
        "| scenario | what it measures | result | took |",
        "|---|---|---|---|",
    ]
    for outcome in outcomes:
        cell = "<br>".join(_cell(line) for line in outcome.results) or "(no result line)"
        lines.append(f"| {outcome.scenario} | {_cell(outcome.what)} | {cell} | {outcome.seconds:.0f} s |")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def run_all(
    *,
    quick: bool = False,
    only: list[str] | None = None,
    plots: Path | None = None,
    out: TextIO = sys.stdout,
) -> list[Outcome]:
    chosen = [s for s in SCENARIOS if not only or any(s.answers_to(name) for name in only)]
    say(out, f"bench all: {len(chosen)} scenarios{' (quick)' if quick else ''}")
    outcomes = []
    for number, scenario in enumerate(chosen, 1):
        say(out, f"[{number}/{len(chosen)}]")
        outcomes.append(run_scenario(scenario, quick, out, plots))
    return outcomes


def main(
    quick: bool = False,
    only: str | None = None,
    markdown_path: str | None = None,
    json_path: str | None = None,
    plots_dir: str | None = None,
) -> int:
    names = [n.strip() for n in only.split(",") if n.strip()] if only else None
    unknown = [name for name in names or [] if not any(s.answers_to(name) for s in SCENARIOS)]
    if unknown:
        known = sorted({s.name for s in SCENARIOS} | {s.command[0] for s in SCENARIOS})
        print(
            f"bargein bench all: unknown scenario(s) {unknown}; known: {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    command = "bargein bench all" + (" --quick" if quick else "") + (f" --only {only}" if only else "")
    plots = Path(plots_dir) if plots_dir else None
    if plots is not None:
        plots.mkdir(parents=True, exist_ok=True)
    outcomes = run_all(quick=quick, only=names, plots=plots)
    table = markdown(outcomes, quick, command)
    print()
    print(table)
    if markdown_path:
        Path(markdown_path).write_text(table)
        print(f"wrote {markdown_path}")
    if json_path:
        report = {"command": command, "machine": machine(), "outcomes": [asdict(o) for o in outcomes]}
        Path(json_path).write_text(json.dumps(report, indent=1))
        print(f"wrote {json_path}")
    failed = [o.scenario for o in outcomes if not o.ran]
    if failed:
        print(
            f"bargein bench all: {len(failed)} scenario(s) did not run: {', '.join(failed)}", file=sys.stderr
        )
        return 1
    return 0
