"""One session's voice, fed at the pace of a streaming LLM and ticked at frame rate as the edge
does: an answer without punctuation is heard while it streams, not once it is complete."""

from __future__ import annotations

import asyncio
import time

from bargein.voice.espeak import EspeakSynthesizer
from bargein.voice.phrases import PhraseRules
from bargein.voice.player import FRAME_MS, Audio
from bargein.voice.speaker import Voice

ANSWER = (
    "so what I would suggest that we do now is take a careful look at the order you placed with us "
    "last week and then check together whether the parcel left our warehouse before the storm closed "
    "the roads in the north of the country because if it did then it is most likely waiting at the "
    "depot near your town and I can ask them to deliver it tomorrow morning"
)
WORDS = ANSWER.split()
WORD_S = 0.05  # a scripted LLM's 20 words a second


async def first_audio_after(rules: PhraseRules) -> float:
    """Stream WORDS into a voice as one turn, ticking it every frame, and return when its first
    audio came out: seconds after the first word."""
    voice = Voice(EspeakSynthesizer("en-us", 175), rules=rules, name="test")
    started = time.monotonic()
    first: float | None = None

    async def tick_until_heard() -> None:
        nonlocal first
        while first is None:
            await asyncio.sleep(FRAME_MS / 1000)
            if any(isinstance(o, Audio) and o.pcm for o in voice.tick(time.monotonic())):
                first = time.monotonic() - started

    ticking = asyncio.create_task(tick_until_heard())
    for seq, word in enumerate(WORDS):
        voice.text(1, seq, ("" if seq == 0 else " ") + word)
        await asyncio.sleep(WORD_S)
    voice.complete(1)
    await asyncio.wait_for(ticking, 30)
    await voice.aclose()
    assert first is not None
    return first


async def test_an_answer_without_a_full_stop_is_heard_while_it_streams() -> None:
    streaming_s = len(WORDS) * WORD_S  # 3 s: spoken only after that, before the phrase rules
    first = await first_audio_after(PhraseRules())
    assert first < streaming_s / 3, f"first audio {first:.2f} s after the first word"


async def test_without_the_time_rule_the_words_rule_alone_speaks_it_early() -> None:
    first = await first_audio_after(PhraseRules(max_words=12, max_wait_ms=10_000))
    assert first < len(WORDS) * WORD_S / 2, f"first audio {first:.2f} s after the first word"


async def test_without_either_rule_it_waits_for_the_end_as_before() -> None:
    """The baseline the two above are measured against, the dead air of the finding: only the
    length limit (240 characters, some 45 words here) makes it speak before the end."""
    first = await first_audio_after(PhraseRules(max_words=200, max_wait_ms=10_000))
    assert first >= len(WORDS) * WORD_S * 0.6, f"first audio {first:.2f} s after the first word"
