"""``bargein demo`` on the real audio path: the two-utterance fixture WAV (a question, then a
barge-in over the answer) through speech detection, in one process (:mod:`bargein.tools.demo_audio`)
and as the three services in separate processes behind the edge (:mod:`bargein.tools.demo_distributed`).
Both print ``bargein call``'s timeline; the tests read its JSON-lines form."""

from __future__ import annotations

import asyncio
import io
import json
import wave
from pathlib import Path
from typing import Any

import numpy as np
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


async def test_in_process_audio_demo(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What ``make demo`` runs: the agent heard (eSpeak NG), the call saved as a WAV."""
    _slow_scripted_llm(monkeypatch)
    out, err = io.StringIO(), io.StringIO()
    wav = tmp_path / "demo.wav"
    assert await run_audio_demo(out=out, err=err, json_lines=True, save_audio=wav) == 0, err.getvalue()
    records = _entries(out)
    _check_question_then_barge_in(records)
    # the history the model sees next: the interrupted answer only as far as it was heard, to the word
    history = [r for r in records if r["event"] == "history"]
    assistant = [r["content"] for r in history if r["role"] == "assistant"]
    assert len(assistant) == 2
    delivered = "".join(r["text"] for r in records if r["event"] == "agent_chunk" and r["turn"] == 1)
    # the answer's text runs ahead of its voice: the caller heard less than the text that was sent
    assert assistant[0] and delivered.startswith(assistant[0]) and len(assistant[0]) < len(delivered)
    cut_inside_a_word = assistant[0][-1:].isalnum() and delivered[len(assistant[0]) :][:1].isalnum()
    assert not cut_inside_a_word, (assistant[0], delivered)  # the cut falls at a word's end
    # the WAV: the caller on the left, the agent on the right; the agent falls silent at the barge-in
    with wave.open(str(wav)) as saved:
        assert (saved.getnchannels(), saved.getframerate()) == (2, 16_000)
        both = np.frombuffer(saved.readframes(saved.getnframes()), dtype="<i2").reshape(-1, 2)
    agent = both[:, 1].astype(float)
    assert np.abs(both[:, 0]).max() > 1000 and np.abs(agent).max() > 1000  # both are heard
    silenced = next(r["t"] for r in records if r["event"] in ("pause", "clear"))
    at = int(silenced * 16_000)
    after = agent[at + int(0.25 * 16_000) : at + int(0.75 * 16_000)]  # past the lead, while the caller talks
    assert np.sqrt((after**2).mean()) < 50, "the agent's voice went on after the barge-in"
    second = next(r["t"] for r in records if r["event"] == "agent_chunk" and r["turn"] > 1)
    assert np.abs(agent[int(second * 16_000) :]).max() > 1000  # the answer to the barge-in is heard
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
