"""Whisper speech-to-text (``BARGEIN_STT=whisper``): the bundled English model transcribes the
speech fixtures, runs off the event loop in a bounded pool, gives up past its time-out, and in a
speech session puts the caller's words ahead of the end of their turn."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import time
from pathlib import Path

import pytest

from bargein.agent.events import SAMPLE_RATE, UserTranscriptionReceived
from bargein.agent.words import content_words
from bargein.errors import SettingsError
from bargein.settings import DEFAULT_BACKCHANNELS, TranscriptionSettings, load
from bargein.speech.transcriber import NullTranscriber, Transcriber, engine_name, transcriber_from_settings
from bargein.speech.whisper import WhisperTranscriber
from bargein.tools.bench_stt import word_errors
from bargein.tools.corpus import RATES, sized

from . import pcm
from .test_processor import Rig

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "audio"
MAX_WORD_ERROR_RATE = 0.2  # tiny.en on espeak-ng voices; the issue measured it near zero
# A turn cut out of a session's audio (its pre-roll, where the burst ended) is heard a little
# differently, and how differently depends on the CPU's arithmetic: on the Intel machines near
# zero errors; on one AMD EPYC the session's clip of the fixture was "to look at table 42 to hide"
# (5 errors in 11 words), on another (2026-12-06) "to look at aable far too too high" (7), though
# the whole fixture is "to moke a table for two tonight" on both. What every reading on every
# machine has heard is the turn's start, whole, and the rest of its length: these tests are about
# the words of the turn reaching the agent, whole, not about tiny.en's accuracy (the corpus tests
# below measure that).
TURN_START = ["hello", "i", "would", "like", "to"]


def heard_the_turn(heard: str) -> bool:
    """Whether ``heard`` is the fixture's whole turn (one_utterance.wav): its first five words as
    said, and about as many words after them (not the first pause's "Hello?", not nothing)."""
    words = re.findall(r"[a-z0-9']+", heard.lower())
    return words[: len(TURN_START)] == TURN_START and len(words) >= 9


@pytest.fixture(scope="module")
def whisper() -> WhisperTranscriber:
    return WhisperTranscriber(threads=1, workers=2)


def word_error_rate(said: str, heard: str) -> float:
    """Edit distance over words, divided by the words said (the bench's own measure)."""
    errors, words = word_errors(said, heard)
    return errors / max(words, 1)


@pytest.mark.parametrize("fixture", ["one_utterance.wav", "two_utterances.wav", "barge_in.wav"])
async def test_the_fixtures_are_transcribed_as_they_were_spoken(
    whisper: WhisperTranscriber, fixture: str
) -> None:
    said = " ".join(json.loads((FIXTURES / "marks.json").read_text())["files"][fixture]["text"])
    heard = await whisper.transcribe(pcm(fixture), session_id="s", sample_rate=SAMPLE_RATE)
    assert heard is not None
    assert word_error_rate(said, heard) <= MAX_WORD_ERROR_RATE, (said, heard)


async def test_silence_has_no_words(whisper: WhisperTranscriber) -> None:
    assert await whisper.transcribe(b"", session_id="s", sample_rate=SAMPLE_RATE) is None
    assert await whisper.transcribe(bytes(SAMPLE_RATE * 2), session_id="s", sample_rate=SAMPLE_RATE) in (
        None,
        "",
    )


async def test_transcription_runs_off_the_event_loop(whisper: WhisperTranscriber) -> None:
    # VAD and turn-taking of every other session tick on the same loop: it must never stall
    job = asyncio.create_task(
        whisper.transcribe(pcm("barge_in.wav"), session_id="s", sample_rate=SAMPLE_RATE)
    )
    worst, last = 0.0, time.perf_counter()
    while not job.done():
        await asyncio.sleep(0.01)
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    assert await job
    assert worst < 0.25, f"the loop stood still {worst * 1000:.0f} ms"


async def test_a_transcription_past_its_time_out_is_given_up() -> None:
    slow = WhisperTranscriber(timeout_s=0.001)
    with pytest.raises(TimeoutError):
        await slow.transcribe(pcm("barge_in.wav"), session_id="s", sample_rate=SAMPLE_RATE)
    slow.close()


def test_the_engine_is_chosen_by_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # auto, the default: the bundled Whisper where bargein[stt] is installed (it is, here) ...
    assert isinstance(transcriber_from_settings(load(TranscriptionSettings)), WhisperTranscriber)
    real_find_spec = importlib.util.find_spec
    with monkeypatch.context() as m:  # ... and timing only where it is not
        m.setattr(
            importlib.util,
            "find_spec",
            lambda name: None if name == "faster_whisper" else real_find_spec(name),
        )
        assert engine_name(load(TranscriptionSettings)) == "none"
        assert isinstance(transcriber_from_settings(load(TranscriptionSettings)), NullTranscriber)
    monkeypatch.setenv("BARGEIN_STT", "none")
    assert isinstance(transcriber_from_settings(load(TranscriptionSettings)), NullTranscriber)
    monkeypatch.setenv("BARGEIN_STT", "whisper")
    engine = transcriber_from_settings(load(TranscriptionSettings))
    assert isinstance(engine, WhisperTranscriber) and isinstance(engine, Transcriber)
    monkeypatch.setenv("BARGEIN_STT_MODEL", str(tmp_path))  # no model there
    with pytest.raises(SettingsError, match="BARGEIN_STT_MODEL"):
        transcriber_from_settings(load(TranscriptionSettings))
    monkeypatch.setenv("BARGEIN_STT", "pocketsphinx")
    with pytest.raises(SettingsError, match="BARGEIN_STT"):
        load(TranscriptionSettings)


async def test_in_a_speech_session_the_words_come_before_the_end_of_the_turn(
    whisper: WhisperTranscriber,
) -> None:
    rig = Rig(transcriber=whisper)
    await rig.worker.start()
    try:
        session = await rig.open()
        await session.stream(pcm("one_utterance.wav"))
        await session.expect(["UserStartedSpeaking", "UserTranscriptionReceived", "UserStoppedSpeaking"])
        transcript = session.to_agent[1][1]
        assert isinstance(transcript, UserTranscriptionReceived)
        assert heard_the_turn(transcript.content), transcript.content
    finally:
        await rig.close()


async def test_a_short_window_hears_the_corpus_as_well_as_whisper_s_own_in_a_fraction_of_the_time() -> None:
    """Whisper's encoder always read 30 s, mostly silence after a caller's second or two of speech
    (``BARGEIN_STT_WINDOW_S``, docs/speech.md "How fast words come"). The short window must hear
    the corpus's speech at least as well (word errors, backchannels read as backchannels, words
    heard in every interruption), and sooner."""
    clips = [clip for clip in sized(rates=[RATES[0]], phrases=4) if clip.kind != "noise"]
    short = WhisperTranscriber(threads=1, workers=1)
    whole = WhisperTranscriber(threads=1, workers=1, window_s=30, timeout_s=60)
    readings = {}
    for name, engine in (("short", short), ("whole", whole)):
        errors = words = backchannels = interruptions = 0
        started = time.perf_counter()
        for clip in clips:
            heard = await engine.transcribe(clip.audio, session_id="s", sample_rate=SAMPLE_RATE)
            wrong, said = word_errors(clip.text, heard)
            errors, words = errors + wrong, words + said
            content = content_words(heard, DEFAULT_BACKCHANNELS) if heard else []
            backchannels += clip.kind == "backchannel" and not content
            interruptions += clip.kind == "interruption" and bool(content)
        readings[name] = (errors / words, backchannels, interruptions, time.perf_counter() - started)
    (short_wer, short_bc, short_ir, short_s), (whole_wer, whole_bc, whole_ir, whole_s) = readings.values()
    assert short_wer <= whole_wer + 0.02, readings
    assert short_bc >= whole_bc - 1 and short_ir >= whole_ir, readings
    assert short_s < whole_s / 2, readings  # measured here: a fifth
    assert short.fell_back <= 2, short.fell_back


@pytest.mark.parametrize(
    ("reading", "kept"),
    [
        (" Sorry, can you repeat? Sorry, can you repeat? Sorry, can", "Sorry, can you repeat?"),
        (" Mm-hmm. Mm-hmm.", "Mm-hmm."),
        (" All right. All right. All right.", "All right."),
        (" No... No...", "No..."),  # a sentence cut short, said again
        (" Thank you. I see. Thank you.", None),  # another sentence between: not one said again
        (" Mm-h-h-h-h-h-h-", None),  # no sentence at all
        (" Okay.", None),  # one sentence, nothing after it
    ],
)
def test_a_reading_that_only_says_its_first_sentence_again_keeps_that_sentence(
    whisper: WhisperTranscriber, reading: str, kept: str | None
) -> None:
    """The short window's decoder goes on past the end of a clip cut short by saying it again; the
    first sentence is kept instead of reading the clip again whole (~0.6 s more)."""
    first = whisper._said_once(whisper.tokenizer.encode(reading))
    assert (whisper.tokenizer.decode(first).strip() if first is not None else None) == kept


async def test_bursts_cut_short_are_read_in_the_short_window_as_the_whole_one_reads_them() -> None:
    """Found in ``bench e2e``: a second of a caller's burst, judged while they still spoke, was
    read "Right. Right." or "Sorry, can you repeat? Sorry, can you repeat? ..." and read again in
    the whole window, 0.6 s more of the agent paused over a backchannel. These cuts of the corpus
    are read so by the short window on some machine (how a clip is misread depends on the CPU's
    float arithmetic: on a Zen 5 EPYC the first was "No... No..."): each must be read with the
    words the whole window reads (a cut may end in "..." where the whole window ends it with a full
    stop), without reading it again."""
    wanted = {
        ("No, that is not what I asked.", "en-gb"): 1.2,
        ("Right.", "en-gb"): 1.2,
        ("Alright.", "en-us+f3"): 1.0,
    }
    clips = sized(rates=[RATES[0]])  # the corpus built whole: its noise is drawn in turn
    short = WhisperTranscriber(threads=1, workers=1)
    whole = WhisperTranscriber(threads=1, workers=1, window_s=30, timeout_s=60)
    cuts = [
        (clip, clip.audio[: int(seconds * SAMPLE_RATE) * 2])
        for clip in clips
        if (seconds := wanted.get((clip.text, clip.voice))) is not None
    ]
    assert len(cuts) == len(wanted)
    for clip, audio in cuts:
        heard = await short.transcribe(audio, session_id="s", sample_rate=SAMPLE_RATE)
        read_whole = await whole.transcribe(audio, session_id="s", sample_rate=SAMPLE_RATE)
        assert _words(heard) == _words(read_whole), (clip.name, heard, read_whole)
    assert short.fell_back == 0


def _words(text: str | None) -> list[str]:
    return re.findall(r"[\w'-]+", (text or "").lower())
