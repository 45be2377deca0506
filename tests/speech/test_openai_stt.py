"""``BARGEIN_STT=openai``: the engine against an OpenAI-compatible server the test starts (real HTTP
on loopback, the real ``openai`` client), transcribing with the bundled Whisper model behind it, and
what happens when that server fails, is slow, or is asked too much at once."""

from __future__ import annotations

import asyncio
import io
import time
import wave

import numpy as np
import pytest

from bargein.agent.events import SAMPLE_RATE, SessionError, SessionErrorCode, UserTranscriptionReceived
from bargein.errors import SettingsError, TranscriberBehind
from bargein.settings import DEFAULT_STT_PROMPT, TranscriptionSettings, load
from bargein.speech.openai_stt import OpenAITranscriber
from bargein.speech.transcriber import transcriber_from_settings
from bargein.speech.whisper import WhisperTranscriber
from tests.stt_server import Answer, SttServer

from . import pcm
from .test_processor import Rig
from .test_whisper import word_error_rate


@pytest.fixture(scope="module")
def whisper() -> WhisperTranscriber:
    return WhisperTranscriber(threads=1, workers=1)


def samples_of(wav_file: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(wav_file)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, SAMPLE_RATE)
        return np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16).astype(np.float32) / 32768


async def test_turns_are_sent_as_wav_and_the_servers_words_come_back(whisper: WhisperTranscriber) -> None:
    def answer(data: bytes, fields: dict[str, str]) -> Answer:
        return Answer(text=whisper._words(samples_of(data)).text or "")

    with SttServer(answer) as server:
        engine = OpenAITranscriber(server.url, api_key="sk-test", model="whisper-large-v3")
        text = await engine.transcribe(pcm("one_utterance.wav"), session_id="s", sample_rate=SAMPLE_RATE)
        await engine.aclose()
    assert text is not None
    assert word_error_rate("Hello, I would like to book a table for two tonight.", text) <= 0.2
    (upload,) = server.uploads
    assert upload.path == "/v1/audio/transcriptions"
    assert upload.authorization == "Bearer sk-test"
    assert upload.fields["model"] == "whisper-large-v3" and upload.fields["language"] == "en"
    assert upload.fields["prompt"] == DEFAULT_STT_PROMPT  # how "uh-huh" is spelled (not "uh-uh")
    assert upload.filename.endswith(".wav")
    assert len(samples_of(upload.file)) == len(pcm("one_utterance.wav")) // 2


async def test_a_failing_server_is_an_error_and_a_slow_one_a_time_out() -> None:
    with SttServer(lambda data, fields: Answer(status=503)) as server:
        engine = OpenAITranscriber(server.url, timeout_s=5)
        with pytest.raises(Exception, match=r"503|failed"):
            await engine.transcribe(bytes(3200), session_id="s", sample_rate=SAMPLE_RATE)
        await engine.aclose()
    with SttServer(lambda data, fields: Answer(text="late", delay_s=3)) as server:
        engine = OpenAITranscriber(server.url, timeout_s=0.5)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await engine.transcribe(bytes(3200), session_id="s", sample_rate=SAMPLE_RATE)
        assert time.monotonic() - started < 2.5  # given up, not retried
        await engine.aclose()


async def test_asked_more_than_it_can_take_it_says_it_is_behind_at_once() -> None:
    with SttServer(lambda data, fields: Answer(text="ok", delay_s=1.0)) as server:
        engine = OpenAITranscriber(server.url, workers=1, timeout_s=5)  # 3 in flight at most
        calls = [
            asyncio.create_task(engine.transcribe(bytes(3200), session_id="s", sample_rate=SAMPLE_RATE))
            for _ in range(3)
        ]
        await asyncio.sleep(0.2)
        with pytest.raises(TranscriberBehind):
            await engine.transcribe(bytes(3200), session_id="s", sample_rate=SAMPLE_RATE)
        assert await asyncio.gather(*calls) == ["ok"] * 3
        assert await engine.transcribe(bytes(3200), session_id="s", sample_rate=SAMPLE_RATE) == "ok"
        await engine.aclose()


async def test_in_a_speech_session_a_slow_server_costs_the_words_not_the_turn() -> None:
    """The engine times out: the turn still happens (by timing), and the client is told why."""
    with SttServer(lambda data, fields: Answer(text="too late", delay_s=3)) as server:
        engine = OpenAITranscriber(server.url, timeout_s=0.3)
        rig = Rig(transcriber=engine)
        await rig.worker.start()
        try:
            session = await rig.open()
            await session.stream(pcm("one_utterance.wav"))
            await session.expect(["UserStartedSpeaking", "UserStoppedSpeaking"])
            assert not any(isinstance(e, UserTranscriptionReceived) for _, e in session.to_agent)
            errors = [e for _, e in session.to_edge if isinstance(e, SessionError)]
            assert [e.code for e in errors] == [SessionErrorCode.STT_BEHIND]
            counters = session.runtime.counters  # every transcription asked (the turn-end judge's at
            assert counters["stt_behind"] == counters["transcriptions"] >= 1  # its pauses too) timed out
        finally:
            await rig.close()
            await engine.aclose()


def test_the_engine_is_chosen_and_configured_by_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BARGEIN_STT", "openai")
    with pytest.raises(SettingsError, match="BARGEIN_STT_BASE_URL"):
        transcriber_from_settings(load(TranscriptionSettings))
    monkeypatch.setenv("BARGEIN_STT_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("BARGEIN_STT_OPENAI_MODEL", "distil-large-v3")
    monkeypatch.setenv("BARGEIN_STT_LANGUAGE", "")
    engine = transcriber_from_settings(load(TranscriptionSettings))
    assert isinstance(engine, OpenAITranscriber)
    assert (engine.base_url, engine.model) == ("http://127.0.0.1:9/v1", "distil-large-v3")
    assert engine.language is None
