"""A turn's streamed text cut into phrases, and positions in it mapped back to (seq, chars)."""

from __future__ import annotations

from bargein.voice.phrases import TurnText


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
