"""The package's structure holds: layers a newcomer can name, no imports that dodge the contract,
services that only wire, a wheel with the SDK alone, and an architecture document whose barge-in
path names modules and functions that exist.

The layer contract itself is import-linter's (``[tool.importlinter]`` in pyproject.toml, run by
``make lint``); these are the rules it cannot express.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "shared" / "bargein"
SERVICES = REPO / "services"
ARCHITECTURE = REPO / "docs" / "architecture.md"
# The CLI imports each subcommand's module when that subcommand runs, so `bargein --help` does not
# load onnxruntime, the web server and the broker clients; nothing else may import inside a function.
LAZY_IMPORTS_ALLOWED = {PACKAGE / "tools" / "cli.py"}
MAX_ROOT_MODULES = 12
MAX_BARGE_IN_MODULES = 7


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "static" not in p.parts)


def _function_level_imports(path: Path) -> list[str]:
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for inner in ast.walk(node):
            names = []
            if isinstance(inner, ast.ImportFrom) and inner.module:
                names = [inner.module]
            elif isinstance(inner, ast.Import):
                names = [alias.name for alias in inner.names]
            found += [
                f"{path.relative_to(REPO)}:{inner.lineno} {n}" for n in names if n.split(".")[0] == "bargein"
            ]
    return found


def test_no_function_level_imports_of_bargein_outside_the_cli() -> None:
    offending = [
        hit
        for path in _modules(PACKAGE)
        if path not in LAZY_IMPORTS_ALLOWED
        for hit in _function_level_imports(path)
    ]
    assert offending == [], "import at module level (a circle is a layering bug, not a reason to hide)"


def test_the_package_root_holds_a_dozen_modules_or_fewer_and_every_subpackage_says_its_role() -> None:
    root_modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root_modules) <= MAX_ROOT_MODULES, root_modules
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(REPO)} has no docstring saying what the layer is for"


def test_each_services_main_only_wires() -> None:
    mains = sorted(SERVICES.glob("*/__main__.py"))
    assert {p.parent.name for p in mains} == {"speech", "reasoning", "broadcast"}
    for main in mains:
        tree = ast.parse(main.read_text())
        for node in tree.body:
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            if isinstance(node, ast.Import | ast.ImportFrom):
                continue
            assert isinstance(node, ast.If), f"{main.relative_to(REPO)}: only imports and the __main__ guard"
            assert len(node.body) == 1 and "sys.exit" in ast.unparse(node.body[0]), ast.unparse(node)
    assert sorted(p.name for p in SERVICES.rglob("*.py")) == sorted(
        ["__init__.py"] + ["__init__.py", "__main__.py"] * 3
    ), "the services' code belongs in the bargein package; services/ holds entry points only"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel built from what the Dockerfile copies (a fresh tree: no stale build/ of ours)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "shared", source / "shared", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(source)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    (built,) = out.glob("bargein-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_installs_the_sdk_alone_with_its_data(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"bargein"}, tops  # no top-level "services" (or "tests") package
    for needed in ("bargein/py.typed", "bargein/data/barge_in.wav", "bargein/edge/static/index.html"):
        assert needed in names, needed
    entry_points = wheel.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "bargein = bargein.tools.cli:main" in entry_points


def _barge_in_steps() -> list[tuple[str, str]]:
    """(module, name) of each step of the document's barge-in path, as the doc writes them:
    a numbered line starting with the module's path and the function or method in backticks."""
    text = ARCHITECTURE.read_text()
    section = text.split("## The data path of a barge-in", 1)[1].split("\n#", 1)[0]
    return re.findall(r"^\d+\. `([\w/]+\.py)` `([\w.]+)`", section, re.M)


def _defines(module: Path, dotted: str) -> bool:
    tree = ast.parse(module.read_text())
    scope: list[ast.stmt] = tree.body
    for part in dotted.split("."):
        match = next(
            (
                n
                for n in scope
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == part
            ),
            None,
        )
        if match is None:  # a function nested in another (a closure): look one level deeper
            nested = [
                n
                for outer in scope
                if isinstance(outer, ast.FunctionDef | ast.AsyncFunctionDef)
                for n in outer.body
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == part
            ]
            match = nested[0] if nested else None
        if match is None:
            return False
        scope = match.body
    return True


def test_the_architecture_documents_barge_in_path_names_what_the_code_has() -> None:
    steps = _barge_in_steps()
    assert len(steps) >= 5, "the barge-in path lost its numbered steps"
    for module, name in steps:
        path = PACKAGE / module
        assert path.exists(), f"docs/architecture.md names {module}, which does not exist"
        assert _defines(path, name), f"docs/architecture.md names {module} {name}, which it does not define"
    assert len({module for module, _ in steps}) <= MAX_BARGE_IN_MODULES


def test_what_users_import_still_imports() -> None:
    import bargein
    import bargein.events
    import bargein.llm
    from bargein.testing import LocalSession

    assert bargein.events.UserStartedSpeaking is bargein.UserStartedSpeaking
    assert bargein.llm.ScriptedLLM is bargein.ScriptedLLM
    assert callable(LocalSession)
    missing = [name for name in bargein.__all__ if not hasattr(bargein, name)]
    assert missing == []


def test_every_setting_is_in_the_readmes_table_and_the_table_names_only_real_ones() -> None:
    from bargein.settings import all_variables

    readme = (REPO / "README.md").read_text()
    table = set(re.findall(r"^\| `(BARGEIN_\w+)`", readme, re.M))
    table |= {f"BARGEIN_{name}" for name in re.findall(r"^\| `BARGEIN_\w+` / `BARGEIN_(\w+)`", readme, re.M)}
    assert all_variables() - table == set(), "settings missing from the README's table"
    assert table - all_variables() == set(), "the README documents settings that do not exist"
