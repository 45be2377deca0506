"""The embedded engine: eSpeak NG from the espeakng-loader wheel speaks, and its word timings
say where each word falls in the audio (checked by cutting the audio there and transcribing it
with the bundled Whisper model)."""

from __future__ import annotations

import pytest

from bargein.agent.events import SAMPLE_RATE, SAMPLE_WIDTH
from bargein.errors import SettingsError
from bargein.settings import VoiceSettings
from bargein.speech.whisper import WhisperTranscriber
from bargein.voice.engines import synthesizer_from_settings
from bargein.voice.espeak import EspeakSynthesizer
from bargein.voice.phrases import TurnText
from bargein.voice.player import Mark, Player
from bargein.voice.speech import WordTiming, complete_words

PHRASE = "The weather today is sunny and warm in Zürich."


@pytest.fixture(scope="module")
def espeak() -> EspeakSynthesizer:
    return EspeakSynthesizer("en-us", 175)


async def test_it_speaks_with_a_timing_for_every_word(espeak: EspeakSynthesizer) -> None:
    speech = await espeak.synthesize(PHRASE)
    assert not speech.estimated
    assert 1.5 < speech.duration_s < 5, speech.duration_s
    assert [PHRASE[w.start : w.end] for w in speech.words] == [
        "The", "weather", "today", "is", "sunny", "and", "warm", "in", "Zürich",
    ]  # fmt: skip
    starts = [w.sample for w in speech.words]
    assert starts == sorted(starts) and starts[0] < SAMPLE_RATE // 10 and starts[-1] < speech.samples


# the finding: eSpeak NG gave no word event for 5 of this passage's words ("the", "a")
PASSAGE = (
    "The quick brown fox jumps over the lazy dog while a small bird sings in the old oak tree, "
    "and a farmer walks the long road to the market with a basket of apples for the people of the town."
)


async def test_every_word_of_a_long_passage_gets_a_timing_and_a_mark_of_its_own(
    espeak: EspeakSynthesizer,
) -> None:
    speech = await espeak.synthesize(PASSAGE)
    words = PASSAGE.split()
    assert [PASSAGE[w.start : w.end].rstrip(",.") for w in speech.words] == [w.rstrip(",.") for w in words]
    starts = [w.sample for w in speech.words]
    assert starts == sorted(starts) and starts[-1] < speech.samples
    text = TurnText(1)
    text.add(0, PASSAGE)
    text.complete = True
    player, marks = Player(lead_ms=200), []
    for phrase in text.phrases():
        player.add(text, phrase, await espeak.synthesize(phrase.text))
    t = 0.0
    while player.playing:
        marks += [o.word.rstrip(",.") for o in player.tick(t) if isinstance(o, Mark) and o.word]
        t += 0.02
    assert marks == [w.rstrip(",.") for w in words]


def test_a_word_the_engine_skipped_is_placed_between_its_neighbours_by_length() -> None:
    text = "send the invoice a day later"
    found = (WordTiming(0, 4, 0), WordTiming(9, 16, 1000), WordTiming(19, 22, 2000))  # no "the", "a"
    words = complete_words(text, found, 4000)
    assert [text[w.start : w.end] for w in words] == text.split()
    assert [w.sample for w in words][:4] == [0, 556, 1000, 1800]  # "the": 5 of 9 parts after "send"
    assert 2000 < words[-1].sample < 4000  # "later", after the last timed word: up to the audio's end
    assert complete_words("send it", (WordTiming(0, 4, 0), WordTiming(5, 7, 10)), 20) == (
        WordTiming(0, 4, 0), WordTiming(5, 7, 10),
    )  # fmt: skip


async def test_cutting_the_audio_at_a_word_boundary_keeps_exactly_the_words_before_it(
    espeak: EspeakSynthesizer,
) -> None:
    """What "heard to the word" rests on: the audio before word k's start holds words 0..k-1."""
    whisper = WhisperTranscriber(threads=1, workers=1)
    speech = await espeak.synthesize("Please send the invoice to the accounting department tomorrow morning.")
    cut = speech.words[4].sample  # "to" starts here: "Please send the invoice" was said
    heard = await whisper.transcribe(
        speech.pcm[: cut * SAMPLE_WIDTH], session_id="s", sample_rate=SAMPLE_RATE
    )
    assert heard is not None
    words = heard.lower().replace(".", "").replace(",", "").split()
    assert "invoice" in words, heard
    assert not {"accounting", "department", "tomorrow", "morning"} & set(words), heard
    rest = await whisper.transcribe(speech.pcm[cut * SAMPLE_WIDTH :], session_id="s", sample_rate=SAMPLE_RATE)
    assert rest is not None and "invoice" not in rest.lower() and "department" in rest.lower(), rest


async def test_a_voice_of_the_session_and_an_unknown_voice(espeak: EspeakSynthesizer) -> None:
    british = await espeak.synthesize("Good morning", voice="en")  # British English
    assert british.samples > 0
    with pytest.raises(ValueError, match="no voice"):
        await espeak.synthesize("Good morning", voice="klingon-xx")
    again = await espeak.synthesize("Good morning")  # the process's own voice still works
    assert again.samples > 0


def test_settings_choose_the_engine_and_refuse_what_cannot_work() -> None:
    assert synthesizer_from_settings(VoiceSettings(tts="none")) is None
    assert isinstance(synthesizer_from_settings(VoiceSettings()), EspeakSynthesizer)  # the default
    with pytest.raises(SettingsError, match="BARGEIN_TTS_VOICE"):
        synthesizer_from_settings(VoiceSettings(tts_voice="klingon-xx"))
    with pytest.raises(SettingsError, match="BARGEIN_TTS_BASE_URL"):
        synthesizer_from_settings(VoiceSettings(tts="openai"))
