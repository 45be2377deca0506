"""``bargein bench vad``: how many real-time sessions one speech process's VAD sustains per core.

A real-time session produces 31.25 windows of 512 samples a second (16 kHz). The bench feeds N
sessions the same audio two ways and measures the CPU time each way takes (``time.process_time``,
so a busy, shared machine slows the wall clock but not the figure much):

* **batched**, as the speech service runs: a tick every ``tick_ms``; the sessions' windows arrive
  staggered (each session has its own phase within the 32 ms window period), and each tick runs ONE
  inference call for every session with a window ready (up to ``max_batch``), with the state
  gathered into and scattered from the batch (:func:`bargein.speech.vad.infer_batch`);
* **per session**: one inference call per session and window
  (:meth:`bargein.speech.vad.VadStream.probability`).

Both include the PCM16 → float conversion; neither includes the transport (decoding frames off
RabbitMQ costs CPU too: this is the VAD's share). The targets: batched, at least 300 real-time
sessions per core; and at least 3.5 times the per-session figure. Missing one is a result, not an
error: the bench reports it and exits 0. The audio is synthetic (voiced harmonics with pitch glides,
pauses and noise) and deterministic; the model's cost does not depend on what it hears.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, TextIO

import numpy as np

from bargein.agent.events import SAMPLE_RATE
from bargein.settings import SpeechSettings
from bargein.speech.vad import (
    PCM16_SCALE,
    WINDOW_MS,
    WINDOW_SAMPLES,
    Floats,
    VadStream,
    infer_batch,
    shared_model,
)

WINDOWS_PER_SECOND = 1000 / WINDOW_MS  # 31.25: what one real-time session needs
TARGET_SESSIONS_PER_CORE = 300
TARGET_RATIO = 3.5
DEFAULT_SESSIONS = [64, 128, 256]
DEFAULT_SECONDS = 3.0
SEED = 1234


def synthetic_audio(seconds: float, seed: int = SEED) -> bytes:
    """PCM16: alternating 'voiced' stretches (harmonics with a gliding pitch) and quiet, with noise."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    pitch = 120 + 40 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, 6.28))
    phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    gate = (np.sin(2 * np.pi * 0.4 * t + rng.uniform(0, 6.28)) > -0.2).astype(np.float64)
    signal = 0.3 * voiced * gate + 0.01 * rng.standard_normal(n)
    return np.asarray(np.clip(signal, -1, 1) * 32767, dtype="<i2").tobytes()


def _windows(audio: bytes, count: int, offset: int) -> list[bytes]:
    """``count`` windows of ``audio`` starting ``offset`` samples in (wrapping around)."""
    step = WINDOW_SAMPLES * 2
    doubled = audio + audio
    start = (offset * 2) % len(audio)
    start -= start % 2
    return [doubled[(start + i * step) % len(audio) :][:step] for i in range(count)]


def _to_float(window: bytes) -> Floats:
    return np.frombuffer(window, dtype="<i2").astype(np.float32) / np.float32(PCM16_SCALE)


def _per_session(feeds: list[list[bytes]]) -> tuple[float, int, int]:
    """One call per session and window, in arrival order. Returns (CPU s, windows, calls)."""
    model = shared_model()
    streams = [VadStream() for _ in feeds]
    count = len(feeds[0])
    started = time.process_time()
    for k in range(count):
        for stream, feed in zip(streams, feeds, strict=True):
            stream.probability(_to_float(feed[k]), model)
    return time.process_time() - started, count * len(feeds), count * len(feeds)


def _batched(feeds: list[list[bytes]], tick_ms: float, max_batch: int) -> tuple[float, int, int]:
    """The service's schedule: session ``i``'s window ``k`` is ready at ``k * 32 ms + phase_i``; each
    tick runs one call for every ready session (up to ``max_batch``). Returns (CPU s, windows, calls)."""
    model = shared_model()
    sessions = len(feeds)
    count = len(feeds[0])
    streams = [VadStream() for _ in feeds]
    phases = [(i * WINDOW_MS / sessions) for i in range(sessions)]  # spread over the window period
    ticks = int(np.ceil((count * WINDOW_MS + WINDOW_MS) / tick_ms)) + 1
    # precompute the schedule so only the service's own work is timed
    ready_at: list[list[int]] = [[] for _ in range(ticks + 1)]
    for i in range(sessions):
        for k in range(count):
            ready_at[int((k * WINDOW_MS + phases[i]) // tick_ms) + 1].append(i)
    next_window = [0] * sessions
    calls = done = 0
    started = time.process_time()
    waiting: list[int] = []
    for tick in range(ticks + 1):
        waiting.extend(ready_at[tick])
        while waiting:
            batch: list[int] = []
            rest: list[int] = []
            seen: set[int] = set()
            for i in waiting:  # one window per session per call: its next one needs this state
                if i in seen or len(batch) >= max_batch:
                    rest.append(i)
                else:
                    seen.add(i)
                    batch.append(i)
            waiting = rest
            raw = b"".join(feeds[i][next_window[i]] for i in batch)
            audio = np.frombuffer(raw, dtype="<i2").reshape(len(batch), WINDOW_SAMPLES)
            infer_batch(
                [streams[i] for i in batch], audio.astype(np.float32) / np.float32(PCM16_SCALE), model
            )
            for i in batch:
                next_window[i] += 1
            calls += 1
            done += len(batch)
    return time.process_time() - started, done, calls


def _row(cpu_s: float, windows: int, calls: int, sessions: int) -> dict[str, float]:
    rate = windows / cpu_s if cpu_s > 0 else float("inf")
    return {
        "cpu_s": cpu_s,
        "windows": windows,
        "calls": calls,
        "mean_batch": windows / calls if calls else 0.0,
        "windows_per_cpu_s": rate,
        "realtime_sessions_per_core": rate / WINDOWS_PER_SECOND,
        "cpu_share": sessions * WINDOWS_PER_SECOND / rate,  # of one core, for these N in real time
    }


def run_vad_bench(
    sessions: list[int] | None = None,
    seconds: float = DEFAULT_SECONDS,
    out: TextIO = sys.stdout,
    *,
    tick_ms: float | None = None,
    max_batch: int | None = None,
) -> dict[str, Any]:
    """Run the bench for each session count, print progress and the table, return the numbers."""
    defaults = SpeechSettings()
    tick_ms = tick_ms if tick_ms is not None else defaults.vad_tick_ms
    max_batch = max_batch if max_batch is not None else defaults.vad_max_batch
    counts = sorted(sessions or DEFAULT_SESSIONS)
    per_session_windows = max(1, int(seconds * WINDOWS_PER_SECOND))
    audio = synthetic_audio(max(seconds, 1.0) + 1.0)

    def say(text: str) -> None:
        print(text, file=out, flush=True)

    say(
        f"bench vad: Silero v5 via onnxruntime (1 thread), {seconds:g} s of audio per session "
        f"({per_session_windows} windows), tick {tick_ms:g} ms, max batch {max_batch}"
    )
    shared_model()
    warm = [_windows(audio, 8, 0) for _ in range(16)]  # warm the session's allocations up
    _batched(warm, tick_ms, max_batch)
    _per_session(warm[:2])
    rows: list[dict[str, Any]] = []
    for n in counts:
        feeds = [_windows(audio, per_session_windows, offset=997 * i) for i in range(n)]
        say(f"  {n} sessions: batched ...")
        batched = _row(*_batched(feeds, tick_ms, max_batch), n)
        say(f"  {n} sessions: one call per session ...")
        single = _row(*_per_session(feeds), n)
        ratio = batched["windows_per_cpu_s"] / single["windows_per_cpu_s"]
        rows.append({"sessions": n, "batched": batched, "per_session": single, "ratio": ratio})

    say("")
    header = (
        f"{'sessions':>8}  {'mode':<12} {'mean batch':>10} {'windows/CPU-s':>14} "
        f"{'RT sessions/core':>17} {'CPU share':>10}"
    )
    say(header)
    say("-" * len(header))
    for row in rows:
        for mode, key in (("batched", "batched"), ("per session", "per_session")):
            r = row[key]
            say(
                f"{row['sessions']:>8}  {mode:<12} {r['mean_batch']:>10.1f} {r['windows_per_cpu_s']:>14,.0f} "
                f"{r['realtime_sessions_per_core']:>17,.0f} {r['cpu_share']:>9.0%}"
            )
        say(f"{'':>8}  {'ratio':<12} {'':>10} {row['ratio']:>13.2f}x")
    judged = rows[-1]  # the most loaded run is the one that matters for capacity
    capacity = judged["batched"]["realtime_sessions_per_core"]
    ratio = judged["ratio"]
    capacity_met = capacity >= TARGET_SESSIONS_PER_CORE
    ratio_met = ratio >= TARGET_RATIO
    say("")
    say(
        f"target: batched >= {TARGET_SESSIONS_PER_CORE} real-time sessions per core: "
        f"{capacity:,.0f} at {judged['sessions']} sessions -> {'met' if capacity_met else 'NOT MET'}"
    )
    say(
        f"target: batched >= {TARGET_RATIO}x one call per session: {ratio:.2f}x at {judged['sessions']} "
        f"sessions -> {'met' if ratio_met else 'NOT MET'}"
    )
    say("(CPU share: of one core, for that many sessions in real time; over 100% needs more cores)")
    return {
        "seconds": seconds,
        "tick_ms": tick_ms,
        "max_batch": max_batch,
        "rows": rows,
        "realtime_sessions_per_core": capacity,
        "ratio": ratio,
        "capacity_met": capacity_met,
        "ratio_met": ratio_met,
    }


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The options of ``bargein bench vad`` (the ``bargein`` command adds them to its subparser)."""
    parser = parser or argparse.ArgumentParser(
        prog="bargein bench vad",
        description="Real-time VAD sessions per core, batched vs one call per session.",
    )
    parser.add_argument(
        "--sessions",
        default=",".join(str(n) for n in DEFAULT_SESSIONS),
        help="comma-separated session counts (default %(default)s)",
    )
    parser.add_argument(
        "--seconds", type=float, default=DEFAULT_SECONDS, help="audio per session (default %(default)s)"
    )
    return parser


def main(argv: list[str] | None = None, args: argparse.Namespace | None = None) -> int:
    """``bargein bench vad``: parse (unless the caller already did), run, report; always 0."""
    if args is None:
        args = build_parser().parse_args(argv)
    try:
        sessions = [int(n) for n in str(args.sessions).split(",") if n.strip()]
    except ValueError:
        print(f"bargein bench vad: --sessions must be numbers, got {args.sessions!r}", file=sys.stderr)
        return 2
    if not sessions or min(sessions) < 1 or args.seconds <= 0:
        print("bargein bench vad: --sessions must be positive and --seconds above 0", file=sys.stderr)
        return 2
    run_vad_bench(sessions, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
