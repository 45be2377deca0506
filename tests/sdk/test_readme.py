"""The README's examples run as written (an agent and a test of it)."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.S)


async def test_the_readme_agent_and_its_test_run() -> None:
    blocks = [b for b in _python_blocks() if "def agent(" in b or "LocalSession" in b]
    assert len(blocks) == 2, "the README shows an agent and a test of it"
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # our own documentation, not input
    test = namespace["test_my_agent"]
    await test()  # type: ignore[operator]
