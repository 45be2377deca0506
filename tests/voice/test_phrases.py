"""A turn's streamed text cut into phrases, and positions in it mapped back to (seq, chars)."""

from __future__ import annotations

from bargein.settings import VoiceSettings
from bargein.voice.phrases import PhraseRules, TurnText


def feed(text: TurnText, chunks: list[str]) -> list[str]:
    spoken: list[str] = []
    for seq, chunk in enumerate(chunks):
        text.add(seq, chunk)
        spoken += [p.text for p in text.phrases()]
    return spoken


def test_a_sentence_is_spoken_as_soon_as_it_ends_and_the_rest_when_the_turn_completes() -> None:
    text = TurnText(1)
    spoken = feed(text, ["Sure", ". The", " weather", " is", " fine", " today"])
    assert spoken == ["Sure. "]
    text.complete = True
    assert [p.text for p in text.phrases()] == ["The weather is fine today"]
    assert text.phrases() == []


def test_a_long_clause_does_not_wait_for_its_sentence() -> None:
    text = TurnText(1)
    spoken = feed(text, ["If you leave before eight in the morning", ", the roads", " are clear"])
    assert spoken == ["If you leave before eight in the morning, "]


def test_every_character_is_spoken_once_in_order() -> None:
    chunks = ["One", " two.", " Three, four", "! Five", "\nsix", " seven", "."]
    text = TurnText(3)
    spoken = feed(text, chunks)
    text.complete = True
    spoken += [p.text for p in text.phrases()]
    assert "".join(spoken) == "".join(chunks)


def test_positions_map_to_the_chunk_and_its_characters() -> None:
    text = TurnText(1)
    for seq, chunk in enumerate(["Hello", " there", ",", " friend"]):
        text.add(seq, chunk)
    assert text.position(0) == (0, 0)
    assert text.position(3) == (0, 3)
    assert text.position(5) == (0, 5)  # all of chunk 0, none of chunk 1
    assert text.position(8) == (1, 3)  # " th"
    assert text.position(11) == (1, 6)
    assert text.position(12) == (2, 1)
    assert text.position(99) == (3, 7)


ANSWER = (
    "so what we can do for you today is look at the order you placed last week and then check "
    "whether the parcel left the warehouse before the storm closed the roads in the north"
)
UNPUNCTUATED = ANSWER.split(" ")


def test_a_clause_boundary_ends_a_phrase_once_it_has_a_few_words() -> None:
    text = TurnText(1, PhraseRules(min_words=4))
    spoken = feed(text, ["Well, I think", " so, and", " then", " we go"])
    assert spoken == ["Well, I think so, "]  # "Well," is one word: too short to be said alone


def test_an_unpunctuated_answer_is_spoken_every_max_words_words() -> None:
    text = TurnText(1, PhraseRules(max_words=8))
    spoken = feed(text, [word + " " for word in UNPUNCTUATED])
    assert spoken, "an answer without punctuation must not wait for its end to be heard"
    assert all(len(p.split()) == 8 for p in spoken)
    assert " ".join(spoken).split() == UNPUNCTUATED[: 8 * len(spoken)]


def test_text_that_waited_is_spoken_when_nothing_is_left_to_play() -> None:
    text = TurnText(1, PhraseRules(max_wait_ms=300))
    text.add(0, "so what we", now=10.0)
    text.add(1, " can do", now=10.1)
    assert text.phrases() == []  # by its text alone, not ready
    assert text.phrases(now=10.2) == []  # has waited 200 ms only
    # whole words only: "do" may go on ("doesn't")
    assert [p.text for p in text.phrases(now=10.31)] == ["so what we can "]
    text.add(2, " for you", now=10.35)
    # what is left has been waiting since: spoken at once when the voice runs dry again
    assert [p.text for p in text.phrases(now=10.36)] == ["do for "]
    text.complete = True
    assert [p.text for p in text.phrases()] == ["you"]


def test_a_word_cut_between_chunks_is_never_split() -> None:
    text = TurnText(1, PhraseRules(max_wait_ms=0))
    text.add(0, "the concen", now=0.0)
    assert [p.text for p in text.phrases(now=1.0)] == ["the "]
    text.add(1, "tration", now=1.0)
    assert text.phrases(now=2.0) == []  # "concentration" may not be finished yet
    text.add(2, " camp", now=2.0)
    assert [p.text for p in text.phrases(now=3.0)] == ["concentration "]


def test_the_rules_come_from_the_voice_settings() -> None:
    settings = VoiceSettings(phrase_min_words=2, phrase_max_words=5, phrase_max_wait_ms=120)
    assert PhraseRules.from_settings(settings) == PhraseRules(2, 5, 120)
