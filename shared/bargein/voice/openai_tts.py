"""Speech on an OpenAI-compatible server (``BARGEIN_TTS=openai``): OpenAI itself, or Kokoro or
Piper behind speaches, vLLM, anything that serves ``POST /v1/audio/speech``.

Each phrase is asked for as raw PCM (``response_format="pcm"``: 16-bit mono at
``BARGEIN_TTS_SAMPLE_RATE``, 24 kHz for OpenAI and speaches) through the ``openai`` package, read
as it streams, and resampled to 16 kHz. These servers give no word timings, so they are estimated
from the audio's length (:func:`~bargein.voice.speech.estimate_words`): "heard to the word" is then
right to within about a word. At most ``BARGEIN_TTS_WORKERS`` requests run at once (the rest wait
their turn: unlike a late transcript, late speech is still wanted); one that takes longer than
``BARGEIN_TTS_TIMEOUT_S`` is given up, and the caller still has the text.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import openai

from bargein.voice.speech import Speech, estimate_words, to_pcm16

log = logging.getLogger("bargein.voice.openai")


class OpenAISynthesizer:
    name = "openai"

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str = "not-needed",
        model: str = "tts-1",
        voice: str = "alloy",
        sample_rate: int = 24_000,
        workers: int = 4,
        timeout_s: float = 10.0,
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.voice = voice
        self.sample_rate = sample_rate
        self.timeout_s = timeout_s
        self._slots = asyncio.Semaphore(workers)
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0
        )
        log.info(
            "speech synthesis: %s (voice %s) at %s, %d requests at once", model, voice, base_url, workers
        )

    async def synthesize(self, text: str, *, voice: str | None = None) -> Speech:
        async with self._slots:
            try:
                async with self._client.audio.speech.with_streaming_response.create(
                    model=self.model, voice=voice or self.voice, input=text, response_format="pcm"
                ) as response:
                    body = bytearray()
                    async for piece in response.iter_bytes():
                        body.extend(piece)
            except openai.APITimeoutError:
                raise TimeoutError(f"{self.base_url} did not answer in {self.timeout_s} s") from None
        samples = np.frombuffer(bytes(body[: len(body) // 2 * 2]), dtype="<i2")
        pcm = to_pcm16(samples, self.sample_rate)
        return Speech(pcm, estimate_words(text, len(pcm) // 2), estimated=True)

    async def aclose(self) -> None:
        await self._client.close()
