"""``bargein demo --scripted`` (the demo without audio) tells the whole story and exits cleanly.
The audio demo (``bargein demo``, what ``make demo`` runs) is tested in tests/broadcast/test_demos.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def test_demo_runs_a_conversation_with_a_barge_in() -> None:
    env = dict(os.environ, BARGEIN_SCRIPTED_FIRST_TOKEN_MS="20", BARGEIN_SCRIPTED_TOKENS_PER_S="80")
    env.pop("BARGEIN_LLM_BASE_URL", None)
    env.pop("BARGEIN_AGENT", None)
    proc = subprocess.run(
        [sys.executable, "-m", "bargein.tools.cli", "demo", "--scripted"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "starts speaking over the agent (barge-in)" in out
    assert re.search(r"✂ turn 1 cut off [\d.]+ ms after the barge-in", out)
    assert "interrupted by UserStartedSpeaking" in out  # the agent's handler ran
    assert "▪ turn complete" in out
    history = [line.split(": ", 1)[1] for line in out.splitlines() if "assistant: " in line]
    assert len(history) == 2
    cut, full = history
    # the first answer is cut to what was streamed before the barge-in: 8 words, not the whole reply
    assert len(cut.split()) == 8, cut
    assert len(full.split()) > 20, full
