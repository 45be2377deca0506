"""The agent's voice over real services: the edge speaks each answer (eSpeak NG), paces it to
callers that joined with ``audio=pcm16``, clears it on a barge-in, pauses and resumes it on a soft
barge-in, and the agent's history keeps exactly the words the caller heard.

One stack per module: a reasoning process (the probe agent, which says the words it is given), a
speech process (Silero VAD and the bundled Whisper) and the edge, on the local RabbitMQ and Redis.
The callers are :class:`~bargein.tools.audio_caller.AudioCaller`: real WebSocket clients that
stream a microphone at real time and play what they hear.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from bargein.agent.events import SAMPLE_RATE, SAMPLE_WIDTH, AgentResponse
from bargein.runtime import journal
from bargein.tools.audio_caller import AudioCaller
from bargein.tools.call import read_wav, run_call
from bargein.transport.redis_store import RedisStateStore
from bargein.wire.names import TIER_REASONING
from tests.client import connect, create_session, recv
from tests.integration.cluster import Cluster, cluster_env, reset_shared_queues

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "audio"
ALPHABET = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar "
    "papa quebec romeo sierra tango uniform victor whiskey yankee zulu"
)
LEAD_S = 0.2  # BARGEIN_AUDIO_LEAD_MS's default


@pytest.fixture(scope="module")
def cluster(
    rabbitmq_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Cluster]]:
    reset_shared_queues(rabbitmq_url, redis_url)
    env = cluster_env(
        rabbitmq_url,
        redis_url,
        BARGEIN_PORT="0",
        BARGEIN_REPORT_INTERVAL_MS="20",
    )
    with Cluster(env, Path(tmp_path_factory.mktemp("voice"))) as cluster:
        cluster.start()
        cluster.start("services.speech")
        yield cluster.start_edge(), cluster


@pytest.fixture(scope="module")
def stack(cluster: tuple[str, Cluster]) -> str:
    return cluster[0]


async def speaking_session(base: str, words: str = ALPHABET, **body: Any) -> dict[str, Any]:
    """A session whose agent answers with ``words``, written fast: its voice lasts far longer."""
    options = {"agent": "tests.integration.agents:probe", "say": words, "word_delay": 0.005}
    return await create_session(base, agent_options=options, **body)


async def history(redis_url: str, session_id: str) -> list[str]:
    """The assistant messages in the agent's checkpointed history."""
    store = RedisStateStore.from_url(redis_url)
    try:
        state = (await journal.read(store, TIER_REASONING, session_id) or ({}, None))[0]
    finally:
        await store.close()
    events = state["nodes"]["ProbeNode"]["conversation_events"]
    return [e.content for e in events if isinstance(e, AgentResponse)]


def speech_of(fixture: str) -> bytes:
    """A fixture's audio from just before its first speech (its leading silence left out)."""
    marks = json.loads((FIXTURES / "marks.json").read_text())["files"][fixture]
    start_ms = marks["speech"][0][0] - 60
    return read_wav(FIXTURES / fixture)[int(start_ms * SAMPLE_RATE / 1000) * SAMPLE_WIDTH :]


def word_marks(caller: AudioCaller, before: float) -> int:
    return sum(1 for r in caller.frames("audio_mark") if r.at < before and r.frame and r.frame["word"])


# --- the voice ------------------------------------------------------------------------------------


async def test_the_answer_is_spoken_paced_at_real_time_with_marks_after_its_words(stack: str) -> None:
    session = await speaking_session(stack, "alpha bravo charlie delta echo foxtrot")
    async with AudioCaller.joined(session["ws_url"], session["token"]) as caller:
        await caller.text("go")
        await caller.wait_for("turn_complete")
        first = await caller.wait_audio(0.02)
        await caller.wait_for("audio_mark")
        while caller.silent_since() is None or time.monotonic() - first < 1.0:  # noqa: ASYNC110
            await asyncio.sleep(0.1)  # the earpiece plays by the clock
        await asyncio.sleep(0.5)
    assert caller.frames("audio_format")[0].frame == {
        "type": "audio_format", "encoding": "pcm16", "sample_rate": 16000, "frame_ms": 20,
    }  # fmt: skip
    audio = [r for r in caller.received if r.frame is None]
    seconds = sum(len(r.audio) for r in audio) / SAMPLE_WIDTH / SAMPLE_RATE
    assert 1.5 < seconds < 8, seconds  # "go alpha ... foxtrot", spoken
    spread = audio[-1].at - audio[0].at
    assert spread > seconds - LEAD_S - 0.5, (spread, seconds)  # paced, not sent at once
    words = [r.frame["word"] for r in caller.frames("audio_mark") if r.frame and r.frame["word"]]
    assert words == ["go", "alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]


async def test_an_edge_asked_for_an_unknown_audio_format_refuses_the_connection(stack: str) -> None:
    session = await speaking_session(stack)
    async with connect(session, audio="opus48") as ws:
        frame = await recv(ws)
        assert frame["type"] == "error" and frame["code"] == "bad_audio_format"


# --- barge-in: the audio stops, the history keeps what was heard -----------------------------------


async def test_a_barge_in_while_the_voice_plays_stops_it_and_the_history_keeps_the_words_heard(
    stack: str, redis_url: str
) -> None:
    """The text is long complete when the caller cuts in: only the voice is still going. Heard by
    the edge's clock (the client reports nothing)."""
    session = await speaking_session(stack)
    async with AudioCaller.joined(session["ws_url"], session["token"], reports=False) as caller:
        await caller.text("go")
        await caller.wait_for("turn_complete")
        await caller.wait_audio(2.5)
        stop_at = time.monotonic()
        await caller.interrupt()
        clear = await caller.wait_for("clear")
        await asyncio.sleep(1.5)  # no more of the turn; delivery reports flow back
        assert caller.audio_after(clear.at) == 0
        surely_heard = word_marks(caller, before=stop_at - LEAD_S - 0.3)
        at_most = word_marks(caller, before=clear.at)
    (answer,) = await history(redis_url, session["session_id"])
    said = ["go", *ALPHABET.split()]
    heard = answer.split()
    assert answer == " ".join(said[: len(heard)]), answer  # whole words, cut at a word's end
    assert surely_heard <= len(heard) <= at_most, (surely_heard, heard, at_most)
    assert len(heard) < len(said)


async def test_with_playback_reports_the_history_is_cut_at_the_last_mark_the_client_played(
    stack: str, redis_url: str
) -> None:
    session = await speaking_session(stack)
    async with AudioCaller.joined(session["ws_url"], session["token"], echo=False) as caller:
        await caller.text("go")
        await caller.wait_audio(2.0)
        marks = [r.frame for r in caller.frames("audio_mark") if r.frame and r.frame["word"]]
        assert len(marks) >= 4
        await caller.played(marks[3]["turn"], marks[3]["mark"])  # "go alpha bravo charlie" played
        await asyncio.sleep(0.2)
        await caller.interrupt()
        await caller.wait_for("clear")
        await asyncio.sleep(1.0)
    assert await history(redis_url, session["session_id"]) == ["go alpha bravo charlie"]


# --- soft barge-in --------------------------------------------------------------------------------


async def a_call(base: str, clip: bytes | None, after_s: float) -> tuple[AudioCaller, dict[str, Any]]:
    """One answer listened to, with ``clip`` said ``after_s`` into its voice; the caller's record."""
    session = await speaking_session(base, "alpha bravo charlie delta echo foxtrot golf hotel india")
    async with AudioCaller.joined(session["ws_url"], session["token"]) as caller:
        await asyncio.sleep(0.5)  # the speech tier owns the session and hears silence first
        await caller.text("go")
        await caller.wait_audio(after_s)
        said = caller.say(clip) if clip is not None else None
        await caller.wait_for("turn_complete")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            quiet = caller.silent_since()
            if quiet is not None and time.monotonic() - quiet > 1.0 and (said is None or said.ended):
                break
            await asyncio.sleep(0.1)
    return caller, {"said": said}


async def test_a_cough_pauses_the_voice_and_it_resumes_with_nothing_lost_or_repeated(stack: str) -> None:
    control, _ = await a_call(stack, None, 1.0)
    cough = speech_of("short_burst.wav")[: int(0.2 * SAMPLE_RATE) * SAMPLE_WIDTH]  # 140 ms of a "Hmm."
    caller, said = await a_call(stack, cough, 1.0)
    pause = caller.frames("pause")
    assert pause, "the cough did not pause the agent"
    resume = caller.frames("resume", after=pause[0].at)
    assert resume, "the agent's voice never resumed"
    assert not caller.frames("clear")
    assert pause[0].at - said["said"].started < 1.5  # the pause came while the cough went on
    # every frame of the answer, once: as long as the same answer heard without a cough (eSpeak NG's
    # output varies by a few samples a phrase; a frame lost or repeated is 320 samples)
    ours = sum(len(r.audio) for r in caller.received if r.frame is None) // SAMPLE_WIDTH
    theirs = sum(len(r.audio) for r in control.received if r.frame is None) // SAMPLE_WIDTH
    assert abs(ours - theirs) < 160, (ours, theirs)
    assert [r.frame["word"] for r in caller.frames("audio_mark") if r.frame] == [
        r.frame["word"] for r in control.frames("audio_mark") if r.frame
    ]  # every word, once, in order
    assert caller.ear.played >= ours - 320  # and it was all played (the earpiece resumed too)


async def test_a_real_interruption_pauses_the_voice_then_clears_it(stack: str) -> None:
    clip = speech_of("barge_in.wav")  # "Can you tell me what the weather will be like this weekend?"
    caller, said = await a_call(stack, clip[: 3 * SAMPLE_RATE * SAMPLE_WIDTH], 1.0)
    (pause,) = caller.frames("pause")
    (clear,) = caller.frames("clear")
    started = said["said"].started
    assert started < pause.at < clear.at
    assert pause.at - started < 1.0, pause.at - started  # silence long before the barge-in is decided
    assert not caller.frames("resume")
    assert caller.audio_after(clear.at) == 0 or caller.frames("turn_complete", after=clear.at)


# --- bargein call --save-audio --------------------------------------------------------------------


async def test_bargein_call_hears_the_agent_and_saves_the_call(stack: str, tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    wav = tmp_path / "call.wav"
    words = "alpha bravo charlie delta echo"
    options = {"agent": "tests.integration.agents:probe", "say": words, "word_delay": 0.005}
    code = await run_call(
        stack, None, "go", json_lines=True, out=out, err=err, listen_after_s=1.0, agent_options=options,
        save_audio=wav,
    )  # fmt: skip
    assert code == 0, err.getvalue()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    session_id = next(r["session_id"] for r in records if r["event"] == "session")
    with wave.open(str(wav)) as saved:
        assert (saved.getnchannels(), saved.getframerate()) == (2, SAMPLE_RATE)
        both = np.frombuffer(saved.readframes(saved.getnframes()), dtype="<i2").reshape(-1, 2)
    agent = np.abs(both[:, 1].astype(int))
    frames = agent[: len(agent) // 320 * 320].reshape(-1, 320)  # 20 ms each
    voiced = frames.max(axis=1) > 500
    assert 1.0 < voiced.sum() / 50 < 6.0  # the answer's voice, as played, at real time
    assert session_id and not [r for r in records if r["event"] == "error"]


# --- operations: every service's metrics and probes ----------------------------------------------


def probe_url(service: Any) -> str:
    match = re.search(r"health and metrics on (http://[^\s\"']+)", service.log())
    assert match, service.log()[-2000:]
    return match.group(1)


def sample(text: str, name: str) -> float:
    """The value of one metric sample in Prometheus' text format (0 if absent)."""
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


async def test_every_service_serves_probes_and_metrics_and_a_barge_in_fills_the_interrupt_histograms(
    cluster: tuple[str, Cluster],
) -> None:
    url, services = cluster
    reasoning, speech = (p for p in services.processes if not p.name.startswith("broadcast"))
    session = await create_session(
        url, agent_options={"agent": "tests.integration.agents:probe", "tail": 40, "word_delay": 0.2}
    )
    async with AudioCaller.joined(session["ws_url"], session["token"], reports=False) as caller:
        await caller.text("go")
        await caller.wait_for("agent_chunk")
        await asyncio.sleep(0.5)  # the answer streams: its generation is running
        await caller.interrupt()
        await caller.wait_for("clear")
        await asyncio.sleep(0.5)
    async with httpx.AsyncClient(timeout=10) as http:
        for service in (reasoning, speech):
            base = probe_url(service)
            assert (await http.get(f"{base}/healthz")).json() == {"status": "ok"}
            assert (await http.get(f"{base}/readyz")).json() == {"status": "ready"}
        agent = (await http.get(f"{probe_url(reasoning)}/metrics")).text
        vad = (await http.get(f"{probe_url(speech)}/metrics")).text
        edge = (await http.get(f"{url}/metrics")).text
    assert sample(agent, "bargein_interrupt_to_cancel_seconds_count") >= 1, agent
    assert sample(agent, "bargein_turn_to_first_chunk_seconds_count") >= 1
    assert sample(edge, "bargein_interrupt_to_clear_seconds_count") >= 1, edge
    assert 'bargein_events_total{event="clears",service="edge"}' in edge
    assert sample(vad, "bargein_vad_batch_sessions_count") > 0  # the caller's microphone went through it
    assert 'bargein_sessions{tier="speech"}' in vad and 'bargein_sessions{tier="reasoning"}' in agent
