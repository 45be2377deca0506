"""``bargein demo`` on the real audio path: the two-utterance fixture WAV (a question, then a
barge-in over the answer) through speech detection, in one process (:mod:`bargein.tools.demo_audio`)
and as the three services in separate processes behind the edge (:mod:`bargein.tools.demo_distributed`).
Both print ``bargein call``'s timeline; the tests read its JSON-lines form."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import pytest

from bargein.tools.demo_audio import run_audio_demo
from bargein.tools.demo_distributed import run_distributed_demo
from tests.integration.cluster import reset_shared_queues


def _entries(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]


def _check_question_then_barge_in(records: list[dict[str, Any]]) -> None:
    events = [r["event"] for r in records]
    assert events.count("user_started_speaking") == 2, events
    assert events.count("user_stopped_speaking") == 2, events
    clears = [r for r in records if r["event"] == "clear"]
    assert len(clears) == 1, events
    clear = clears[0]
    cut = clear["turn"]
    # the answer to the question was streaming when the second utterance cut it off
    assert clear["chunks_before"] >= 1
    assert clear["measured_from"] == "barge_in_audio" and clear["ms"] > 0
    after = records[records.index(clear) + 1 :]
    assert not [r for r in after if r["event"] == "agent_chunk" and r["turn"] <= cut]
    completed = [r["turn"] for r in records if r["event"] == "turn_complete"]
    assert completed and completed[-1] > cut  # the second turn was answered in full
    # speech-to-text (the bundled Whisper, BARGEIN_STT=auto): the caller's words, before each turn's end
    heard = [r for r in records if r["event"] == "user_transcript"]
    assert [r["backchannel"] for r in heard] == [False, False], heard
    assert "weather" in heard[0]["text"].lower() and "stop" in heard[1]["text"].lower()
    for r in heard:
        stop = next(s for s in records[records.index(r) :] if s["event"] == "user_stopped_speaking")
        assert stop["t"] >= r["t"]


def _slow_scripted_llm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BARGEIN_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("BARGEIN_AGENT", raising=False)
    monkeypatch.setenv("BARGEIN_SCRIPTED_FIRST_TOKEN_MS", "250")
    monkeypatch.setenv("BARGEIN_SCRIPTED_TOKENS_PER_S", "10")


async def test_in_process_audio_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    _slow_scripted_llm(monkeypatch)
    out, err = io.StringIO(), io.StringIO()
    assert await run_audio_demo(out=out, err=err, json_lines=True) == 0, err.getvalue()
    records = _entries(out)
    _check_question_then_barge_in(records)
    # the history the model sees next: the interrupted answer only as far as it was delivered
    history = [r for r in records if r["event"] == "history"]
    assistant = [r["content"] for r in history if r["role"] == "assistant"]
    assert len(assistant) == 2
    delivered = "".join(r["text"] for r in records if r["event"] == "agent_chunk" and r["turn"] == 1)
    assert assistant[0] == delivered and "twenty-two degrees" not in delivered
    user = [r["content"] for r in history if r["role"] == "user"]  # the caller's words, not just turn events
    assert len(user) == 2 and "weather" in user[0].lower()


async def test_distributed_demo(rabbitmq_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    await asyncio.to_thread(reset_shared_queues, rabbitmq_url, redis_url)
    _slow_scripted_llm(monkeypatch)
    monkeypatch.setenv("BARGEIN_RABBITMQ_URL", rabbitmq_url)
    monkeypatch.setenv("BARGEIN_REDIS_URL", redis_url)
    out, err = io.StringIO(), io.StringIO()
    code = await run_distributed_demo(out=out, err=err, json_lines=True, listen_after_s=1.5)
    assert code == 0, err.getvalue()
    progress = err.getvalue()  # with --json the progress lines go to stderr
    assert "ready in" in progress and "stopping the services" in progress
    _check_question_then_barge_in(_entries(out))
