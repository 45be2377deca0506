"""Shared fixtures for the SDK tests (in-process runtime; no broker needed)."""

from __future__ import annotations

import pytest


@pytest.fixture
def scripted_llm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Agents that build their LLM client from settings get a quick scripted one: replies of
    30-40 words at 100 words/s, slow enough to interrupt after a couple of chunks."""
    monkeypatch.delenv("BARGEIN_LLM_BASE_URL", raising=False)
    monkeypatch.setenv("BARGEIN_SCRIPTED_FIRST_TOKEN_MS", "5")
    monkeypatch.setenv("BARGEIN_SCRIPTED_TOKENS_PER_S", "100")
