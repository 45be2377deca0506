"""Playing the agent's audio to the caller at real time: pacing, marks, pause, clear, and "heard".

:class:`Player` is a pure state machine, like the turn policy: no I/O and no clock of its own. The
edge calls :meth:`Player.tick` every frame with the time, and sends what it returns. The audio of
every turn lies on one timeline of samples: ``sent`` is how much went out, ``played`` how much
the caller has played by now (estimated by the clock: audio plays at real time once sent, and
stops when it runs out). The player sends only ``lead_ms`` ahead of ``played``, so a ``clear`` or
a ``pause`` silences the caller within that lead, whatever the network buffers.

Each word's end, and each phrase's end, is a *boundary* on that timeline, tied to the text it
completes as (seq, chars) of the turn (:meth:`~bargein.voice.phrases.TurnText.position`):

* when the clock's ``played`` passes a boundary, the caller has heard that text
  (:class:`Heard`; what the edge reports when its clients do not report playback themselves);
* when the audio up to a boundary has been sent, a :class:`Mark` follows it, which a client echoes
  (``played`` with the mark) once it has played that far: the exact report, as a phone carrier's
  ``mark`` events are.

When a turn's text is complete and all its audio has played, :class:`Done` says so (the agent has
stopped reaching the caller). A soft barge-in :meth:`pause`\\ s the timeline (``played`` stops with
the caller's playback) and :meth:`resume`\\ s it where it stopped: nothing lost, nothing repeated.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from bargein.agent.events import SAMPLE_RATE, SAMPLE_WIDTH
from bargein.voice.phrases import Phrase, TurnText
from bargein.voice.speech import Speech

FRAME_MS = 20
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000
RECENT_TURNS = 8  # turns whose marks are kept for late `played` reports


@dataclass(frozen=True)
class Audio:
    """Send these samples (PCM16, 16 kHz) of ``turn`` now."""

    turn: int
    pcm: bytes


@dataclass(frozen=True)
class Mark:
    """Send mark ``mark`` of ``turn`` now: the audio before it ends ``word``."""

    turn: int
    mark: int
    seq: int
    chars: int
    word: str


@dataclass(frozen=True)
class Heard:
    """By the clock, the caller has heard ``turn`` up to chunk ``seq``'s first ``chars`` characters."""

    turn: int
    seq: int
    chars: int


@dataclass(frozen=True)
class Done:
    """All of ``turn`` has been played."""

    turn: int


Output = Audio | Mark | Heard | Done


@dataclass
class _Boundary:
    at: int  # timeline sample
    turn: int
    seq: int
    chars: int
    word: str
    mark: int = -1


@dataclass
class _Clip:
    turn: int
    pcm: bytes
    start: int  # timeline sample of its first sample

    @property
    def end(self) -> int:
        return self.start + len(self.pcm) // SAMPLE_WIDTH


@dataclass
class Player:
    lead_ms: float = 200.0
    sent: int = 0
    played: float = 0.0
    paused: bool = False
    _clips: collections.deque[_Clip] = field(default_factory=collections.deque)
    _sent_clips: collections.deque[_Clip] = field(default_factory=collections.deque)  # not yet all played
    _boundaries: collections.deque[_Boundary] = field(default_factory=collections.deque)  # not yet heard
    _unmarked: collections.deque[_Boundary] = field(default_factory=collections.deque)  # not yet sent
    _end: int = 0  # timeline sample where the audio queued so far ends
    _last_tick: float | None = None
    _marks: dict[int, dict[int, tuple[int, int]]] = field(default_factory=dict)
    _next_mark: dict[int, int] = field(default_factory=dict)
    _cleared: int = 0  # turns up to this were cleared: their audio is never queued again
    _turn_end: dict[int, int] = field(default_factory=dict)  # where each turn's audio so far ends
    _finishing: collections.deque[tuple[int, int]] = field(default_factory=collections.deque)

    @property
    def lead(self) -> int:
        return int(self.lead_ms * SAMPLE_RATE / 1000)

    @property
    def cleared_upto(self) -> int:
        """Turns up to this one were cleared: nothing more of them is played."""
        return self._cleared

    @property
    def playing(self) -> bool:
        """Audio sent is still playing, or more is queued."""
        return bool(self._clips) or self.played < self.sent

    def add(self, text: TurnText, phrase: Phrase, speech: Speech) -> None:
        """``speech`` is the audio of ``phrase`` of ``text``'s turn. Clips play in the order added."""
        turn = text.turn
        if turn <= self._cleared:
            return
        start = max(self._end, self.sent)
        clip = _Clip(turn, speech.pcm, start)
        self._clips.append(clip)
        self._end = self._turn_end[turn] = clip.end
        for old in [t for t in self._turn_end if t <= turn - RECENT_TURNS]:  # forget old turns
            self._turn_end.pop(old, None)
            self._marks.pop(old, None)
            self._next_mark.pop(old, None)
        ends = [w.sample for w in speech.words[1:]] + [speech.samples] * bool(speech.words)
        for word, end in zip(speech.words, ends, strict=True):
            seq, chars = text.position(phrase.start + word.end)
            self._boundary(
                turn, start + min(end, speech.samples), seq, chars, phrase.text[word.start : word.end]
            )
        seq, chars = text.position(phrase.end)
        self._boundary(turn, clip.end, seq, chars, "")

    def finish(self, turn: int) -> list[Output]:
        """``turn`` is complete and every phrase of it was added: :class:`Done` once the caller has
        played all of it (now, if it had no audio or has played it already)."""
        if turn <= self._cleared:
            return []
        end = self._turn_end.get(turn)
        if end is None or end <= self.played:
            return [Done(turn)]
        self._finishing.append((turn, end))
        return []

    def _boundary(self, turn: int, at: int, seq: int, chars: int, word: str) -> None:
        boundary = _Boundary(at, turn, seq, chars, word)
        mark = self._next_mark.get(turn, 0)
        self._next_mark[turn] = mark + 1
        boundary.mark = mark
        self._marks.setdefault(turn, {})[mark] = (seq, chars)
        self._boundaries.append(boundary)
        self._unmarked.append(boundary)

    def mark_position(self, turn: int, mark: int) -> tuple[int, int] | None:
        """What mark ``mark`` of ``turn`` stands for, as (seq, chars); None if unknown."""
        return self._marks.get(turn, {}).get(mark)

    def pause(self, now: float) -> list[Output]:
        """Stop the clock and the sending now; what the clock says was heard until now."""
        out = self._advance(now)
        self.paused = True
        return out

    def resume(self, now: float) -> None:
        self.paused = False
        self._last_tick = now

    def rewind(self, now: float) -> list[Output]:
        """The client threw away what it had buffered and not yet played: a phone carrier's
        ``clear``, its only way to silence the caller at once. From what it played on, the audio
        (and its marks) is sent again, so a pause that had to clear loses nothing either."""
        out = self._advance(now)
        back = int(self.played)
        while self._sent_clips:  # the clips not yet wholly played go back to be sent
            clip = self._sent_clips.pop()
            if clip.end > back:
                self._clips.appendleft(clip)
        self.sent = back
        self._unmarked = collections.deque(self._boundaries)  # none of them has been sent now
        return out

    def clear(self, turn: int, now: float) -> list[Output]:
        """Drop ``turn`` and everything before it: what the caller has not played of it is gone.
        Returns what the clock says was heard until now (and sends nothing more of it)."""
        out = self._advance(now)
        self._cleared = max(self._cleared, turn)
        self._clips = collections.deque(c for c in self._clips if c.turn > turn)
        self._sent_clips.clear()  # the client drops what it buffered: nothing sent is replayed
        self._boundaries = collections.deque(b for b in self._boundaries if b.turn > turn)
        self._unmarked = collections.deque(b for b in self._unmarked if b.turn > turn)
        self._finishing = collections.deque(f for f in self._finishing if f[0] > turn)
        self.sent = int(self.played)  # the client drops what it had buffered
        self.played = float(self.sent)
        if self._clips:  # a later turn's audio, queued behind the cleared one, moves up
            self._shift(self.sent - self._clips[0].start)
        self._end = self._clips[-1].end if self._clips else self.sent
        self.paused = False
        return out

    def _shift(self, by: int) -> None:
        for clip in self._clips:
            clip.start += by
        for boundary in self._boundaries:
            boundary.at += by
        self._finishing = collections.deque((turn, at + by) for turn, at in self._finishing)
        self._turn_end = {turn: at + by for turn, at in self._turn_end.items()}

    def tick(self, now: float) -> list[Output]:
        """Advance the clock to ``now`` (seconds, monotonic): what was heard, and what to send."""
        out = self._advance(now)
        if self.paused:
            return out
        while self._clips and self.sent - self.played < self.lead:
            out.extend(self._send_frame())
        done = self._done()
        if done is not None:
            out.append(done)
        return out

    def _advance(self, now: float) -> list[Output]:
        """The clock to ``now``: what the caller has heard by then (nothing is sent)."""
        out: list[Output] = []
        if self._last_tick is not None and not self.paused:
            self.played = min(float(self.sent), self.played + (now - self._last_tick) * SAMPLE_RATE)
        self._last_tick = now
        heard: _Boundary | None = None
        while self._boundaries and self._boundaries[0].at <= self.played:
            heard = self._boundaries.popleft()
        if heard is not None:
            out.append(Heard(heard.turn, heard.seq, heard.chars))
        while self._sent_clips and self._sent_clips[0].end <= self.played:
            self._sent_clips.popleft()
        return out

    def _send_frame(self) -> list[Output]:
        clip = self._clips[0]
        if self.sent < clip.start:  # a gap (a turn cleared while its successor was queued)
            self.sent = clip.start
        offset = (self.sent - clip.start) * SAMPLE_WIDTH
        pcm = clip.pcm[offset : offset + FRAME_SAMPLES * SAMPLE_WIDTH]
        self.sent += len(pcm) // SAMPLE_WIDTH
        out: list[Output] = [Audio(clip.turn, pcm)] if pcm else []
        while self._unmarked and self._unmarked[0].at <= self.sent:
            b = self._unmarked.popleft()
            out.append(Mark(b.turn, b.mark, b.seq, b.chars, b.word))
        if self.sent >= clip.end:
            self._sent_clips.append(self._clips.popleft())
        return out

    def _done(self) -> Done | None:
        if self._finishing and self._finishing[0][1] <= self.played:
            turn, _ = self._finishing.popleft()
            if turn > self._cleared:
                return Done(turn)
        return None
