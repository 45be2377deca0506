"""An acoustic end-of-turn model: Pipecat's smart-turn v3.2, run on the caller's last seconds.

The model reads how the caller sounds (the intonation and rhythm of the end of a phrase), not what
they said: one probability that the turn is complete. Its file is the ``smart-turn-v3.2-cpu.onnx``
that the ``pipecat-ai`` wheel ships (``pip install 'bargein[peers]'``: nothing is downloaded at run
time), loaded in place with onnxruntime as the VAD is; its input is Whisper's 80-band log-mel
spectrogram of the last 8 s of audio, which faster-whisper's own feature extractor computes
(``bargein[stt]``). :class:`~bargein.speech.turn_end.SmartTurnJudge` asks it, once a pause in the
caller's turn begins.

It runs on a thread of its own (onnxruntime releases the GIL), one call at a time a process, about
30 ms a call on one core here: the event loop, the VAD and other sessions never wait for it. Calls
are not batched across sessions: a turn's pause is rare next to the VAD's 31 windows a second, so
batches would hold one call nearly always.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.resources
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bargein.errors import SettingsError

log = logging.getLogger("bargein.speech.smart_turn")

MODEL_PACKAGE = "pipecat.audio.turn.smart_turn.data"
MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
SAMPLE_RATE = 16_000
SECONDS = 8  # the model hears the last 8 s of the turn (earlier audio is cut, a shorter turn padded)
MEL_BANDS = 80
NEEDED = "the smart-turn judge needs the pipecat-ai wheel's model (pip install 'bargein[peers]')"


def model_path() -> Path:
    """The model file in the installed ``pipecat-ai`` wheel; :class:`SettingsError` if there is none."""
    try:
        path = Path(str(importlib.resources.files(MODEL_PACKAGE).joinpath(MODEL_FILE)))
    except ModuleNotFoundError:
        raise SettingsError(f"BARGEIN_TURN_DETECTOR=smart-turn: {NEEDED}") from None
    if not path.is_file():
        raise SettingsError(f"BARGEIN_TURN_DETECTOR=smart-turn: {path} is missing ({NEEDED})")
    return path


class SmartTurnModel:
    """The model, loaded once per process, and the thread it runs on."""

    def __init__(self, path: Path | None = None) -> None:
        import onnxruntime as ort  # type: ignore[import-untyped]  # ships no type information

        try:
            from faster_whisper.feature_extractor import FeatureExtractor  # type: ignore[import-untyped]
        except ImportError:
            raise SettingsError(
                "BARGEIN_TURN_DETECTOR=smart-turn: computing its input needs faster-whisper "
                "(pip install 'bargein[stt]')"
            ) from None
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.path = path or model_path()
        self.session = ort.InferenceSession(str(self.path), sess_options=options)
        (features,) = self.session.get_inputs()
        if features.name != "input_features" or list(features.shape[1:]) != [MEL_BANDS, SECONDS * 100]:
            raise SettingsError(f"{self.path}: not a smart-turn v3 model (input {features.shape})")
        self.features = FeatureExtractor(feature_size=MEL_BANDS, chunk_length=SECONDS)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smart-turn")
        log.info("smart-turn model loaded from %s", self.path)

    def probability(self, pcm: bytes) -> float:
        """How likely the turn whose audio (16 kHz PCM16) ends here is complete, 0 to 1."""
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
        window = SECONDS * SAMPLE_RATE
        samples = samples[-window:]
        samples = np.pad(samples, (window - len(samples), 0))  # a short turn: silence before it
        normalized = (samples - samples.mean()) / np.sqrt(samples.var() + 1e-7)
        mel = self.features(normalized, padding=0)[:, : SECONDS * 100]
        outputs: list[Any] = self.session.run(None, {"input_features": mel[np.newaxis].astype(np.float32)})
        return float(np.asarray(outputs[0]).reshape(-1)[0])

    async def complete(self, pcm: bytes) -> float:
        """:meth:`probability`, on the model's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(self.probability, pcm))

    def close(self) -> None:
        self._thread.shutdown(wait=False)


@functools.cache
def shared_smart_turn() -> SmartTurnModel:
    """One model per process, loaded on first use (at start-up, by the speech service)."""
    return SmartTurnModel()
