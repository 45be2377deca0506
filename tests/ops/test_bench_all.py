"""``bargein bench all`` itself: a scenario that cannot run is a row that says so and a failed run,
never a silent gap; unknown scenarios are refused (the run of every scenario is the smoke test in
``tests/integration/test_benches.py``)."""

from __future__ import annotations

import io

from bargein.tools.bench_all import SCENARIOS, Outcome, Scenario, main, markdown, run_scenario


def test_a_scenario_that_cannot_run_says_why_in_its_row() -> None:
    broken = Scenario("broken", ("interrupt", "--sessions", "0"), ("interrupt", "--sessions", "0"), "refused")
    out = io.StringIO()
    outcome = run_scenario(broken, quick=False, out=out)
    assert outcome.exit_code == 2 and not outcome.ran
    assert outcome.results[0].startswith("did not run (exit 2)"), outcome.results
    assert "broken: FAILED" in out.getvalue() and "broken | " in out.getvalue()  # its output, shown live
    row = markdown([outcome], quick=False, command="bargein bench all").splitlines()[-1]
    assert row.startswith("| broken | refused | did not run (exit 2)"), row


def test_the_table_escapes_what_would_break_it() -> None:
    outcome = Outcome(
        "interrupt", "bargein bench interrupt", 0, 1.0, "a | pipe", ["a | b", "  spaced   out  "]
    )
    row = markdown([outcome], quick=True, command="bargein bench all --quick").splitlines()[-1]
    assert "a \\| b<br>spaced out" in row and "a \\| pipe" in row and row.count(" | ") == 3  # 4 cells


def test_unknown_scenarios_are_refused_and_every_bench_is_a_scenario() -> None:
    assert main(only="interrupt,nonsense") == 2
    names = {s.command[0] for s in SCENARIOS}
    assert names == {
        "interrupt", "throughput", "failover", "sessions", "checkpoint", "peers", "vad", "e2e", "stt",
        "bargein-decisions", "turns", "scale",
    }  # fmt: skip
