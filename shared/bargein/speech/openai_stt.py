"""Speech-to-text on an OpenAI-compatible server (``BARGEIN_STT=openai``), behind the
:class:`~bargein.speech.transcriber.Transcriber` seam.

For deployments with a GPU box: OpenAI itself, a faster-whisper server, vLLM, anything that serves
``POST /v1/audio/transcriptions``. Each turn is sent as a 16 kHz mono WAV through the ``openai``
package (``BARGEIN_STT_BASE_URL``, ``BARGEIN_STT_API_KEY``, ``BARGEIN_STT_OPENAI_MODEL``). The server
does the batching across callers; this side bounds what it has in flight
(``BARGEIN_STT_WORKERS``, with the same backlog rule as the local engine) and gives up after
``BARGEIN_STT_TIMEOUT_S`` without retrying: by then the turn has gone on by timing alone.
"""

from __future__ import annotations

import io
import logging
import wave

import openai

from bargein.errors import SettingsError
from bargein.settings import DEFAULT_STT_PROMPT, TranscriptionSettings
from bargein.speech.inflight import InFlight

log = logging.getLogger("bargein.speech.openai")


def wav_bytes(audio: bytes, sample_rate: int) -> bytes:
    """PCM16 mono samples as a WAV file, the form every transcription server takes."""
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(sample_rate)
        wav.writeframes(audio[: len(audio) // 2 * 2])
    return out.getvalue()


class OpenAITranscriber:
    def __init__(
        self,
        base_url: str,
        *,
        api_key: str = "not-needed",
        model: str = "whisper-1",
        language: str | None = "en",
        workers: int = 2,
        timeout_s: float = 10.0,
        prompt: str = DEFAULT_STT_PROMPT,
    ) -> None:
        self.base_url = base_url
        self.prompt = prompt
        self.model = model
        self.language = language
        self.timeout_s = timeout_s
        self.in_flight = InFlight(workers)
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0
        )
        log.info("speech-to-text: %s at %s, up to %d requests at once", model, base_url, self.in_flight.limit)

    @classmethod
    def from_settings(cls, settings: TranscriptionSettings) -> OpenAITranscriber:
        if not settings.stt_base_url:
            raise SettingsError("BARGEIN_STT=openai needs BARGEIN_STT_BASE_URL (e.g. http://gpu-box:8000/v1)")
        return cls(
            settings.stt_base_url,
            api_key=settings.stt_api_key,
            model=settings.stt_openai_model,
            language=settings.stt_language or None,
            workers=settings.stt_workers,
            timeout_s=settings.stt_timeout_s,
            prompt=settings.stt_prompt,
        )

    async def transcribe(self, audio: bytes, *, session_id: str, sample_rate: int) -> str | None:
        if len(audio) < 2:
            return None
        self.in_flight.admit("transcription requests")
        try:
            result = await self._client.audio.transcriptions.create(
                file=("turn.wav", wav_bytes(audio, sample_rate), "audio/wav"),
                model=self.model,
                response_format="json",
                language=self.language or openai.omit,
                prompt=self.prompt or openai.omit,
            )
        except openai.APITimeoutError:
            raise TimeoutError(f"{self.base_url} did not answer in {self.timeout_s} s") from None
        finally:
            self.in_flight.done()
        text = (result.text or "").strip()
        return text or None

    async def aclose(self) -> None:
        await self._client.close()
