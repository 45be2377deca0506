"""Speech-to-text for the speech tier: the seam, and the default that has no STT.

The speech service calls a :class:`Transcriber` once per user turn, when the turn's burst of
speech has just ended (``min_silence_ms`` of silence) and before it decides what the burst was,
with the burst's audio (16 kHz mono PCM16, a little pre-roll included). Text it returns is
published as :class:`~bargein.agent.events.UserTranscriptionReceived` ahead of
:class:`~bargein.agent.events.UserStoppedSpeaking`, so the reasoning side has the words in its history
when the turn starts; and a burst with a transcript is a turn, never a false interruption.

Engines, chosen with ``BARGEIN_STT`` (:func:`transcriber_from_settings`): ``whisper``
(:mod:`bargein.speech.whisper`, on the CPU) and ``none``. The default :class:`NullTranscriber`
returns None: the service then publishes turn events only
(and skips keeping turn audio at all). Text-mode clients need nothing from this service: the
client edge forwards their text as ``UserTranscriptionReceived`` followed by
``UserStoppedSpeaking``, straight to the reasoning tier.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from bargein.settings import TranscriptionSettings
from bargein.speech.whisper import WhisperTranscriber


@runtime_checkable
class Transcriber(Protocol):
    async def transcribe(self, audio: bytes, *, session_id: str, sample_rate: int) -> str | None:
        """The words in ``audio`` (one user turn), or None if there are none or no STT is wired.
        Raising is treated as None (logged and counted): a failed STT must not lose the turn;
        :class:`TranscriberBehind` and :class:`TimeoutError` say it is behind."""
        ...


class NullTranscriber:
    """No speech-to-text: every turn is reported by its timing alone."""

    async def transcribe(self, audio: bytes, *, session_id: str, sample_rate: int) -> str | None:
        return None


def transcriber_from_settings(settings: TranscriptionSettings) -> Transcriber:
    """The engine ``BARGEIN_STT`` names (a missing model or package fails here, at start-up)."""
    if settings.stt == "whisper":
        return WhisperTranscriber.from_settings(settings)
    return NullTranscriber()
