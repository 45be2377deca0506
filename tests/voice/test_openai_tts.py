"""``BARGEIN_TTS=openai`` against a real HTTP server speaking OpenAI's ``/v1/audio/speech``
(tests/tts_server.py): the PCM it streams is read, resampled to 16 kHz and given estimated word
timings; a failing or slow server costs the caller the audio of that phrase, never the call."""

from __future__ import annotations

import asyncio

import pytest

from bargein.agent.events import SAMPLE_RATE
from bargein.settings import VoiceSettings
from bargein.voice.engines import synthesizer_from_settings
from bargein.voice.openai_tts import OpenAISynthesizer
from bargein.voice.player import Audio
from bargein.voice.speaker import Voice
from tests.tts_server import CHAR_S, SpeechServer, speech_for


async def test_the_servers_pcm_is_resampled_and_its_words_spread_over_it() -> None:
    with SpeechServer() as server:
        engine = synthesizer_from_settings(
            VoiceSettings(tts="openai", tts_base_url=server.url, tts_api_key="k-123", tts_voice="nova")
        )
        assert isinstance(engine, OpenAISynthesizer)
        speech = await engine.synthesize("Hello there, friend.")
        await engine.aclose()
    (request,) = server.requests
    said = "Hello there, friend."
    assert request == {"model": "tts-1", "voice": "nova", "input": said, "response_format": "pcm"}
    assert {k.lower(): v for k, v in server.headers[0].items()}["authorization"] == "Bearer k-123"
    assert speech.estimated
    assert abs(speech.duration_s - len("Hello there, friend.") * CHAR_S) < 0.01
    assert [w.start for w in speech.words] == [0, 6, 13]
    starts = [w.sample / SAMPLE_RATE for w in speech.words]
    assert starts[0] == 0 and 0.3 < starts[1] < 0.5 and 0.7 < starts[2] < 0.9  # by their length
    assert len(speech.pcm) == round(len(speech_for("Hello there, friend.")) * 16 / 24 / 2) * 2


async def test_a_failing_server_costs_the_phrase_its_audio_not_the_call() -> None:
    counted: list[str] = []
    with SpeechServer(status=500) as server:
        voice = Voice(OpenAISynthesizer(server.url), count=counted.append, name="s")
        voice.text(1, 0, "Hello there.")
        voice.complete(1)
        out = []
        for i in range(50):
            await asyncio.sleep(0.02)
            out += voice.tick(i * 0.02)
        await voice.aclose()
    assert counted == ["tts_failures"]
    assert not [o for o in out if isinstance(o, Audio)]
    assert any(type(o).__name__ == "Done" for o in out)  # the turn still ends for the caller


async def test_a_slow_server_is_given_up() -> None:
    with SpeechServer(delay_s=2.0) as server:
        engine = OpenAISynthesizer(server.url, timeout_s=0.3)
        with pytest.raises(TimeoutError):
            await engine.synthesize("Hello.")
        await engine.aclose()
