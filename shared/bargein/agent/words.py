"""Judging a barge-in by what the caller said: backchannels, non-speech, and ``words_at_least``.

A caller who says "uh-huh" or "okay" while the agent talks is listening, not taking the floor; a
cough is not speech at all. The speech tier holds such a burst back while the agent speaks and asks
:func:`content_words` whether it said anything else (``BARGEIN_INTERRUPT_WORDS``). Agents can apply
the same test to their own routes with :func:`words_at_least`, on the transcript the speech tier
puts on :class:`~bargein.agent.events.UserStartedSpeaking`.

Speech-to-text engines mark what is not speech in brackets ("[BLANK_AUDIO]", "(coughing)",
"*sigh*"); that never counts as words.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from bargein.agent.events import (
    FalseInterruption,
    UserBackchannel,
    UserStartedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.message import Message
from bargein.settings import DEFAULT_BACKCHANNELS

__all__ = ["DEFAULT_BACKCHANNELS", "content_words", "spoken_words", "whole_words", "words_at_least"]

_NON_SPEECH = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*|♪+")
_WORD = re.compile(r"[a-z0-9]+(?:['\u2019-][a-z0-9]+)*")
_CUT_OFF_WORD = re.compile(r"\S*\w-\s*$")  # "Bo-la-", "st-": a word the audio ended in the middle of


def spoken_words(text: str | None) -> list[str]:
    """The words of a transcript, lower case, without punctuation or marked non-speech."""
    if not text:
        return []
    return _WORD.findall(_NON_SPEECH.sub(" ", text.lower()))


def whole_words(text: str | None) -> str | None:
    """``text`` without a last word the engine heard only the start of: Whisper ends a reading
    whose audio stops mid-word with that word's start and a hyphen ("Alright." read on its first
    quarter-second as "Bo-la-"). What the word will be is not known yet; a later reading has it."""
    if not text:
        return text
    return _CUT_OFF_WORD.sub("", text)


def content_words(text: str | None, backchannels: Iterable[str] = DEFAULT_BACKCHANNELS) -> list[str]:
    """The words of ``text`` that are not backchannels: ``"Okay, uh-huh."`` → ``[]``;
    ``"Okay, but wait"`` → ``["but", "wait"]``. Phrases ("got it") match as a whole."""
    words = spoken_words(text)
    phrases = sorted({tuple(spoken_words(p)) for p in backchannels} - {()}, key=len, reverse=True)
    out: list[str] = []
    i = 0
    while i < len(words):
        for phrase in phrases:
            if tuple(words[i : i + len(phrase)]) == phrase:
                i += len(phrase)
                break
        else:
            out.append(words[i])
            i += 1
    return out


def words_at_least(
    n: int, *, backchannels: Iterable[str] = DEFAULT_BACKCHANNELS, unknown: bool = True
) -> Callable[[Message], bool]:
    """A condition for ``interrupt_on``: the caller said at least ``n`` words besides backchannels.

    ``interrupt_on(UserStartedSpeaking, condition=bargein.words_at_least(2))``. It reads the
    ``transcript`` the speech tier judged the barge-in by (or the words of a
    :class:`UserTranscriptionReceived`); an event with none (no speech-to-text is running, the
    engine fell behind, the stop button) passes when ``unknown`` is true, so a deployment without
    words keeps interrupting on timing rather than never.
    """
    if n < 0:
        raise ValueError(f"words_at_least needs n >= 0, got {n}")
    phrases = tuple(backchannels)

    def condition(message: Message) -> bool:
        event = message.event
        transcript: str | None = None
        if isinstance(event, UserStartedSpeaking | FalseInterruption):
            transcript = event.transcript
        elif isinstance(event, UserTranscriptionReceived | UserBackchannel):
            transcript = event.content
        if transcript is None:
            return unknown
        return len(content_words(transcript, phrases)) >= n

    condition.__name__ = f"words_at_least({n})"
    return condition
