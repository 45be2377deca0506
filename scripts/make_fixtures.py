"""Make the speech fixtures: small 16 kHz mono PCM16 WAV files and where speech is in each.

``python scripts/make_fixtures.py`` (``make fixtures``) writes ``tests/fixtures/audio/*.wav`` and
``tests/fixtures/audio/marks.json``. The tests compare what the speech tier detects against these
marks, so the marks must not come from a voice activity detector: each utterance is synthesised
with espeak-ng, converted to 16 kHz and trimmed of leading and trailing quiet with sox's ``silence``
effect, and then placed at a known offset in a quiet background. A mark is therefore exactly where
the script put the first and last sample above sox's threshold.

The output is deterministic (espeak-ng is, and the background noise uses a fixed seed), so running
the script again reproduces the committed files; the tests only read them.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bargein.tools import synth
from bargein.tools.synth import RATE, TRIM_ABOVE, TRIM_DURATION_S, noise_burst, to_pcm16, write_wav

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "audio"
BACKGROUND_DBFS = -60.0  # a faint noise floor: real line audio is never digital zero
SEED = 20240604


@dataclass
class Piece:
    """A stretch of a fixture: ``silence_ms`` of background, or an utterance of ``text``, or a noise
    burst of ``noise_ms`` (a cough-like thump, not speech)."""

    silence_ms: float = 0.0
    text: str | None = None
    noise_ms: float = 0.0


FIXTURES: dict[str, list[Piece]] = {
    # one sentence with quiet around it: speech start and end detection
    "one_utterance.wav": [
        Piece(silence_ms=1000),
        Piece(text="Hello, I would like to book a table for two tonight."),
        Piece(silence_ms=1200),
    ],
    # two sentences 1.5 s apart: two turns, and the second one barges in on the agent's answer
    "two_utterances.wav": [
        Piece(silence_ms=800),
        Piece(text="What is the weather like today?"),
        Piece(silence_ms=1500),
        Piece(text="Actually, never mind."),
        Piece(silence_ms=1200),
    ],
    # a short voiced syllable: long enough to barge in, too short to be a turn (false interruption)
    "short_burst.wav": [
        Piece(silence_ms=1000),
        Piece(text="Hmm."),
        Piece(silence_ms=1200),
    ],
    # a 200 ms noise thump (a cough, a knock): not speech at all
    "noise_burst.wav": [
        Piece(silence_ms=1000),
        Piece(noise_ms=200),
        Piece(silence_ms=1000),
    ],
    # the demo's call: a question, then, while the agent answers, a barge-in long enough to be a turn
    # of its own whatever the false-interruption timeout (also shipped with the package, for demos);
    # 3 s apart, so that the agent's voice has been heard for a while when the caller cuts in
    "barge_in.wav": [
        Piece(silence_ms=800),
        Piece(text="Can you tell me what the weather will be like this weekend?"),
        Piece(silence_ms=3000),
        Piece(text="Wait, stop, I would rather hear a short story about a curious robot instead."),
        Piece(silence_ms=1500),
    ],
}
PACKAGED = {
    "barge_in.wav": Path(__file__).resolve().parents[1] / "shared" / "bargein" / "data" / "barge_in.wav"
}


def synthesize(text: str, workdir: Path, name: str) -> np.ndarray:
    try:
        return synth.synthesize(text, workdir, name)
    except synth.MissingTool as exc:
        sys.exit(f"make_fixtures: {exc}")


def assemble(
    pieces: list[Piece], workdir: Path, stem: str, rng: np.random.Generator
) -> tuple[np.ndarray, dict[str, object]]:
    parts: list[np.ndarray] = []
    speech: list[list[float]] = []
    noise: list[list[float]] = []
    texts: list[str] = []
    at = 0  # samples so far
    for i, piece in enumerate(pieces):
        if piece.text is not None:
            clip = synthesize(piece.text, workdir, f"{stem}-{i}").astype(np.float64)
            speech.append([at * 1000 / RATE, (at + len(clip)) * 1000 / RATE])
            texts.append(piece.text)
        elif piece.noise_ms:
            clip = noise_burst(piece.noise_ms, rng)
            noise.append([at * 1000 / RATE, (at + len(clip)) * 1000 / RATE])
        else:
            clip = np.zeros(int(RATE * piece.silence_ms / 1000))
        parts.append(clip)
        at += len(clip)
    signal = np.concatenate(parts)
    floor = 32767 * 10 ** (BACKGROUND_DBFS / 20)
    signal = signal + rng.standard_normal(len(signal)) * floor
    samples = to_pcm16(signal)
    marks = {
        "duration_ms": round(len(samples) * 1000 / RATE, 3),
        "speech": [[round(a, 3), round(b, 3)] for a, b in speech],
        "noise": [[round(a, 3), round(b, 3)] for a, b in noise],
        "text": texts,
    }
    return samples, marks


def main(only: list[str]) -> int:
    """Make every fixture, or with names only those (the others, and their marks, stay as they are)."""
    unknown = set(only) - set(FIXTURES)
    if unknown:
        sys.exit(f"make_fixtures: no fixture {', '.join(sorted(unknown))} (there are {', '.join(FIXTURES)})")
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    all_marks: dict[str, object] = {
        "about": (
            "Where speech starts and stops in each fixture, in ms from the start of the file, computed "
            "by scripts/make_fixtures.py from where it placed each espeak-ng utterance after trimming "
            f"it with sox 'silence 1 {TRIM_DURATION_S} {TRIM_ABOVE}' at both ends (never from a VAD). "
            "'noise' lists non-speech bursts."
        ),
        "sample_rate": RATE,
        "files": {},
    }
    files: dict[str, object] = {}
    if only:  # keep the others' marks
        files = dict(json.loads((OUT / "marks.json").read_text())["files"])
    with tempfile.TemporaryDirectory() as tmp:
        for name, pieces in FIXTURES.items():
            samples, marks = assemble(pieces, Path(tmp), Path(name).stem, rng)
            if only and name not in only:
                continue  # made all the same, so the random noise of the others is what it always was
            write_wav(OUT / name, samples)
            if name in PACKAGED:  # with its marks and words beside it (bargein bench stt reads them)
                PACKAGED[name].parent.mkdir(parents=True, exist_ok=True)
                write_wav(PACKAGED[name], samples)
                PACKAGED[name].with_suffix(".json").write_text(json.dumps(marks, indent=2) + "\n")
            files[name] = marks
            seconds = float(str(marks["duration_ms"])) / 1000
            print(f"{name}: {seconds:.2f} s, speech {marks['speech']}, noise {marks['noise']}")
    all_marks["files"] = files
    (OUT / "marks.json").write_text(json.dumps(all_marks, indent=2) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {len(only) or len(FIXTURES)} fixtures and marks.json to {OUT} ({total / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
