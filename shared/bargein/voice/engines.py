"""The speech-synthesis seam, and the choice of engine (``BARGEIN_TTS``).

The client edge asks a :class:`Synthesizer` for each phrase of the agent's answer
(:mod:`bargein.voice.phrases`) and plays the result (:mod:`bargein.voice.player`). Engines:
``espeak`` (:mod:`bargein.voice.espeak`, embedded, the default: word timings from the engine),
``openai`` (:mod:`bargein.voice.openai_tts`, any OpenAI-compatible server: word timings estimated)
and ``none`` (text only: clients get captions, and "heard" is what they were sent).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from bargein.errors import SettingsError
from bargein.settings import VoiceSettings
from bargein.voice.espeak import EspeakSynthesizer
from bargein.voice.openai_tts import OpenAISynthesizer
from bargein.voice.speech import Speech

# voices a client may offer its user (any other name the engine knows works too)
SUGGESTED_VOICES: dict[str, tuple[str, ...]] = {
    "espeak": ("en-us", "en", "en-GB-scotland", "fr", "de", "es", "it"),
    "openai": ("alloy", "echo", "fable", "onyx", "nova", "shimmer"),
    "none": (),
}
DEFAULT_VOICE = {"espeak": "en-us", "openai": "alloy", "none": None}


@runtime_checkable
class Synthesizer(Protocol):
    name: str

    async def synthesize(self, text: str, *, voice: str | None = None) -> Speech:
        """``text``'s audio and word timings; ``voice`` is a session's choice (None: the engine's
        own). Raises when it cannot (an unknown voice is :class:`ValueError`)."""
        ...

    async def aclose(self) -> None: ...


def synthesizer_from_settings(settings: VoiceSettings) -> Synthesizer | None:
    """The engine ``BARGEIN_TTS`` names, or None for ``none`` (a bad voice or a missing URL fails
    here, at start-up)."""
    if settings.tts == "espeak":
        return EspeakSynthesizer(settings.tts_voice or DEFAULT_VOICE["espeak"] or "", settings.tts_rate)
    if settings.tts == "openai":
        if not settings.tts_base_url:
            raise SettingsError("BARGEIN_TTS=openai needs BARGEIN_TTS_BASE_URL (e.g. http://gpu-box:8000/v1)")
        return OpenAISynthesizer(
            settings.tts_base_url,
            api_key=settings.tts_api_key,
            model=settings.tts_openai_model,
            voice=settings.tts_voice or DEFAULT_VOICE["openai"] or "",
            sample_rate=settings.tts_sample_rate,
            workers=settings.tts_workers,
            timeout_s=settings.tts_timeout_s,
        )
    return None
