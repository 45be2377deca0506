"""One session's voice: the agent's text in, audio paced to the caller out.

:class:`Voice` joins the parts: each chunk of the answer goes into its turn's
:class:`~bargein.voice.phrases.TurnText`; each phrase ready is synthesised, in order, by a task of
the session's own (the engine runs off the event loop, so a slow phrase holds up only this
session); the audio goes to the :class:`~bargein.voice.player.Player`, which the owner ticks at
frame rate. A phrase the engine fails on is played as silence of no length: the caller still has
its caption, and its text counts as heard once reached.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from bargein import metrics
from bargein.tasks import cancel_and_wait
from bargein.voice.engines import Synthesizer
from bargein.voice.phrases import Phrase, PhraseRules, TurnText
from bargein.voice.player import Output, Player
from bargein.voice.speech import Speech

log = logging.getLogger("bargein.voice")
RECENT_TURNS = 8

_FINISH = Phrase(-1, "")  # queued after a complete turn's last phrase


class Voice:
    def __init__(
        self,
        synthesizer: Synthesizer,
        *,
        voice: str | None = None,
        lead_ms: float = 200.0,
        count: Callable[[str], None] = lambda name: None,
        name: str = "",
        rules: PhraseRules | None = None,
    ) -> None:
        self.synthesizer = synthesizer
        self.rules = rules or PhraseRules()
        self.voice = voice
        self.player = Player(lead_ms=lead_ms)
        self.count = count
        self.name = name
        self.first_audio_s: dict[int, float] = {}  # per turn: first text → its first audio ready
        self._texts: dict[int, TurnText] = {}
        self._asked: dict[int, float] = {}
        self._queue: asyncio.Queue[tuple[TurnText, Phrase]] = asyncio.Queue()
        self._ready: list[Output] = []  # what the synthesis task produced for the next tick
        self._task: asyncio.Task[None] | None = None
        self._latest: TurnText | None = None  # the newest turn's text: the one a tick may flush

    def text(self, turn: int, seq: int, text: str) -> None:
        """Chunk ``seq`` of ``turn`` went out to the session's clients."""
        if turn <= self.player.cleared_upto:
            return
        turn_text = self._texts.get(turn)
        if turn_text is None:
            turn_text = self._new_text(turn)
            self._asked[turn] = time.monotonic()
            for old in [t for t in self._texts if t <= turn - RECENT_TURNS]:
                self._texts.pop(old, None)
                self._asked.pop(old, None)
        turn_text.add(seq, text, time.monotonic())
        self._queue_phrases(turn_text)

    def complete(self, turn: int) -> None:
        """The agent finished ``turn``: speak the rest, and say when it has all been played."""
        turn_text = self._texts.get(turn)
        if turn <= self.player.cleared_upto:
            return
        if turn_text is None:
            turn_text = self._new_text(turn)
        turn_text.complete = True
        self._queue_phrases(turn_text)
        self._put(turn_text, _FINISH)

    def clear(self, turn: int, now: float) -> list[Output]:
        """``turn`` and those before it were cut off: nothing more of them is said."""
        return self.player.clear(turn, now)

    def pause(self, now: float) -> list[Output]:
        return self.player.pause(now)

    def resume(self, now: float) -> None:
        self.player.resume(now)

    def tick(self, now: float) -> list[Output]:
        latest = self._latest
        if (
            latest is not None
            and not latest.complete
            and latest.turn > self.player.cleared_upto
            and self._silent()
        ):
            for phrase in latest.phrases(now):  # the caller would hear nothing: speak what waited
                self._put(latest, phrase)
        ready, self._ready = self._ready, []
        return ready + self.player.tick(now)

    def _silent(self) -> bool:
        """Nothing is left to play, to make or to hand over: the caller is about to hear silence."""
        return (
            not self.player.playing
            and not self._ready
            and self._queue.empty()
            and (self._task is None or self._task.done())
        )

    def _new_text(self, turn: int) -> TurnText:
        turn_text = self._texts[turn] = TurnText(turn, self.rules)
        if self._latest is None or turn > self._latest.turn:
            self._latest = turn_text
        return turn_text

    async def aclose(self) -> None:
        await cancel_and_wait(self._task)

    def _queue_phrases(self, turn_text: TurnText) -> None:
        for phrase in turn_text.phrases():
            self._put(turn_text, phrase)

    def _put(self, turn_text: TurnText, phrase: Phrase) -> None:
        self._queue.put_nowait((turn_text, phrase))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._speak(), name=f"voice:{self.name}")

    async def _speak(self) -> None:
        while not self._queue.empty():
            turn_text, phrase = self._queue.get_nowait()
            turn = turn_text.turn
            if turn <= self.player.cleared_upto:
                continue
            if phrase is _FINISH:
                self._ready.extend(self.player.finish(turn))
                continue
            speech = await self._synthesize(phrase.text)
            if turn <= self.player.cleared_upto:  # cut off while it was being made
                continue
            if turn not in self.first_audio_s and turn in self._asked:
                self.first_audio_s[turn] = time.monotonic() - self._asked[turn]
            self.player.add(turn_text, phrase, speech)

    async def _synthesize(self, text: str) -> Speech:
        try:
            started = time.monotonic()
            speech = await self.synthesizer.synthesize(text, voice=self.voice)
            metrics.TTS_SECONDS.labels(self.synthesizer.name).observe(time.monotonic() - started)
            return speech
        except ValueError as exc:  # the session's voice does not exist: the process's own then
            if self.voice is None:
                return self._failed(exc)
            log.warning("session %s: %s; speaking with the default voice", self.name, exc)
            self.count("tts_bad_voice")
            self.voice = None
            return await self._synthesize(text)
        except Exception as exc:
            return self._failed(exc)

    def _failed(self, exc: Exception) -> Speech:
        self.count("tts_failures")
        log.warning("session %s: speech synthesis failed (%s); the caller has the text only", self.name, exc)
        return Speech(b"")
