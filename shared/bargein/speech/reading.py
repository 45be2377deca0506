"""What a speech-to-text engine made of a clip: its words, and what it knows beyond them.

The :class:`~bargein.speech.transcriber.Transcriber` seam returns words only; an engine that can
say more (the bundled Whisper) also offers ``read``, which returns a :class:`Reading`. Its own
module so that the engines and the seam that chooses among them can both import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reading:
    """One clip's words (None: no speech), and ``ending``: the probability the engine gave the
    sentence ending where its words end (the mark it closed them with, against words going on),
    None when it closed them with none or cannot say. The turn-end judge reads a finished-looking
    sentence the engine doubted as one that may go on (:mod:`bargein.speech.turn_end`)."""

    text: str | None
    ending: float | None = None
