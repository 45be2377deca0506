"""The peer tier: Line 0.1.12's own test suite, run against ``bargein.line``.

The README promises that a Cartesia Line 0.1 agent moves to bargein by rewriting its imports. Line's
own tests are the sharpest statement of what Line did, so this test fetches the
``cartesia-line==0.1.12`` source distribution from the package index (never vendored into this
repository; cached between runs by pytest's cache), takes its ``tests/``, rewrites ``line`` to
``bargein.line``, and runs it in a pytest of its own. ``line_expected.py`` lists what is expected to
fail, each with its reason, as strict expected failures.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.peers.line_expected import EXPECTED_FAILURES, NOT_RUN

LINE_VERSION = "0.1.12"
SDIST = f"cartesia_line-{LINE_VERSION}.tar.gz"
MIN_PASSED = 130  # the target, of Line's route-API tests
HERE = Path(__file__).resolve().parent

# Imports and dotted names in strings (mock.patch targets) both move under bargein.
_REWRITES = [
    (re.compile(r"^(\s*)from line(\.|\s)", re.M), r"\1from bargein.line\2"),
    (re.compile(r"^(\s*)import line\b", re.M), r"\1import bargein.line as line"),
    (re.compile(r"""(["'])line\."""), r"\1bargein.line."),
]

_CONFTEST = """
import json
from pathlib import Path

import pytest

EXPECTED = json.loads((Path(__file__).parent / "expected.json").read_text())


def pytest_collection_modifyitems(config, items):
    for item in items:
        reason = EXPECTED.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
"""


def rewrite(source: str) -> str:
    for pattern, replacement in _REWRITES:
        source = pattern.sub(replacement, source)
    return source


def fetch_sdist(cache: Path) -> Path:
    """The source distribution, from the package index (once; then from the cache)."""
    target = cache / SDIST
    if not target.exists():
        subprocess.run(
            [
                sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                "--no-binary", ":all:", f"cartesia-line=={LINE_VERSION}", "-d", str(cache),
            ],
            check=True,
            timeout=300,
        )  # fmt: skip
    return target


def prepare(sdist: Path, where: Path) -> Path:
    """Line's tests, imports rewritten, beside our ``helpers`` and the expected-failure plugin."""
    suite = where / "line_tests"
    shutil.rmtree(suite, ignore_errors=True)
    suite.mkdir(parents=True)
    prefix = f"cartesia_line-{LINE_VERSION}/tests/"
    with tarfile.open(sdist) as archive:
        for member in archive.getmembers():
            name = member.name
            if not (name.startswith(prefix) and name.endswith(".py") and member.isfile()):
                continue
            relative = name[len(prefix) :]
            if "/" in relative or relative in NOT_RUN:
                continue
            handle = archive.extractfile(member)
            assert handle is not None
            (suite / relative).write_text(rewrite(handle.read().decode()))
    shutil.copy(HERE / "line_helpers.py", suite / "helpers.py")
    (suite / "conftest.py").write_text(_CONFTEST)
    (suite / "expected.json").write_text(json.dumps(EXPECTED_FAILURES))
    (suite / "pytest.ini").write_text("[pytest]\nasyncio_mode = strict\n")
    return suite


def results(report: Path) -> dict[str, str]:
    """test id → outcome (passed, failed, error, skipped, xfailed, xpassed) from a JUnit report."""
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        if not case.get("classname"):  # a module that failed to import
            outcomes[f"{case.get('name', '')}.py"] = "error"
            continue
        path = case.get("classname", "").replace(".", "/")
        # classname is module[.Class]; the test id is file.py::[Class::]name
        parts = path.split("/")
        module, classes = parts[0], parts[1:]
        nodeid = "::".join([f"{module}.py", *classes, case.get("name", "")])
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
            elif child.tag == "skipped":
                outcome = "xfailed" if child.get("type") == "pytest.xfail" else "skipped"
        outcomes[nodeid] = outcome
    return outcomes


def test_lines_own_suite_runs_on_bargein_line(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    cache = Path(request.config.cache.mkdir("cartesia-line"))  # type: ignore[union-attr]
    suite = prepare(fetch_sdist(cache), tmp_path)
    report = tmp_path / "report.xml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(suite), str(HERE.parents[1])])}
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", str(suite), "-q", "-p", "no:cacheprovider",
            "--rootdir", str(suite), f"--junitxml={report}", "--continue-on-collection-errors",
            "-o", "junit_family=xunit1",
        ],
        capture_output=True, text=True, env=env, timeout=600, cwd=suite,
    )  # fmt: skip
    assert report.exists(), f"Line's suite did not run:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    outcomes = results(report)
    passed = sorted(t for t, o in outcomes.items() if o == "passed")
    broken = sorted(t for t, o in outcomes.items() if o in ("failed", "error"))
    skipped = sorted(t for t, o in outcomes.items() if o == "skipped")
    stale = sorted(set(EXPECTED_FAILURES) - set(outcomes))
    summary = (
        f"{len(passed)} passed, {len(broken)} failed, {len(skipped)} skipped, "
        f"{sum(o == 'xfailed' for o in outcomes.values())} expected failures, of {len(outcomes)}"
    )
    print(f"Line {LINE_VERSION}'s own tests on bargein.line: {summary}")
    assert not broken, (
        f"{summary}\nfailing (or passing though listed as expected failures):\n"
        + "\n".join(broken)
        + f"\n\n{run.stdout[-6000:]}"
    )
    assert not skipped, f"skipped (a skip hides a result): {skipped}"
    assert not stale, f"line_expected.py lists tests that no longer exist: {stale}"
    assert len(passed) >= MIN_PASSED, summary
