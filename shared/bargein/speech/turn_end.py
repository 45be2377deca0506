"""How long a pause ends the caller's turn: the turn-end judges behind ``BARGEIN_TURN_DETECTOR``.

A fixed silence is wrong both ways. A caller who stops to think in the middle of a sentence ("My
account number is ... four five six seven") is answered in the pause, and the rest of the sentence
then barges in on the answer; a caller who has finished ("... and I want a refund.") waits the same
half second for nothing. What the caller has said so far tells the two apart far better than the
silence does, so the speech tier asks a judge, once a pause begins, how long this pause must last
to end the turn:

* :class:`SilenceJudge` (``silence``): ``min_silence_ms`` whatever was said (what every turn waited
  before; also what any judge falls back to without words);
* :class:`TextJudge` (``text``, the default where speech-to-text runs): the words of the turn so
  far, transcribed as the pause begins, read by :func:`completion`: a finished sentence ends the
  turn after ``end_silence_ms``; an unfinished one waits up to ``max_silence_ms``, and so does a
  finished one whose full stop the engine itself doubted (``Heard.ending`` under ``ENDING_DOUBT``:
  Whisper finishes many a half sentence, unsure; not a question mark); words that say neither wait
  ``min_silence_ms``;
* :class:`SmartTurnJudge` (``smart-turn``): an acoustic model's probability that the turn is
  complete (:mod:`bargein.speech.smart_turn`, Pipecat's smart-turn v3.2), on the turn's audio as
  the pause begins: complete ends it after ``end_silence_ms``, not complete waits ``max_silence_ms``.

:func:`completion` is rules, not a model: measured on the corpus of ``bargein bench turns``
(``docs/speech.md``, "The end of the caller's turn"). Speech-to-text engines punctuate what they
hear, and a Whisper transcript of a sentence cut short often ends in "..." or in a word no sentence
ends with ("is", "the", "and"), which is most of what the rules read.
"""

from __future__ import annotations

import enum
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Final, Literal

from bargein.agent.words import spoken_words

TurnDetector = Literal["auto", "silence", "text", "smart-turn"]
COMPLETE_THRESHOLD: Final = 0.5  # the smart-turn model's own: a probability above it is complete
# A reading that closes a sentence with less than this probability on its mark (Reading.ending) may
# be half a sentence the engine finished for the caller: Whisper tiny reads eSpeak NG's "The problem
# is that" as "The problem is not." (0.59 on the full stop, 0.18 on "..."), and a finished sentence
# with 0.7 or more on it in 117 of 120 readings of the turn corpus (docs/speech.md, "The end of a turn")
ENDING_DOUBT: Final = 0.7
# ... except a question: Whisper closes the halves it finishes with a full stop, and a question mark
# is what a caller's finished question ends in. On the turn corpus (16 voices and rates), 1 of 35
# doubted halves ended in "?" against 1 of 48 finished questions; on the simulated phone line 3 of 20
# of bench e2e's questions were doubted (0.64 on "?") and waited 2 s
UNDOUBTED_MARKS: Final = ("?",)


def _wordlist(text: str) -> frozenset[str]:
    return frozenset(text.split())


class Completion(enum.Enum):
    """What the words of a turn so far say of it."""

    FINISHED = "finished"  # a sentence that ends: "I want a refund."
    DOUBTED = "doubted"  # reads finished, but the engine was unsure of its full stop (ENDING_DOUBT)
    UNSURE = "unsure"  # no words, or nothing either way: "Thanks" (no punctuation)
    UNFINISHED = "unfinished"  # it goes on: "My account number is...", "... and the"


# Words a sentence does not end on: conjunctions, articles, possessives, some prepositions, and the
# fillers of someone who is thinking. Not "it", "that", "this", "you", "me", "up", "so", "then",
# which end many a sentence ("I want that.", "Thank you.", "Help me.", "I think so.").
CONTINUING_WORDS: Final = _wordlist(
    """
    and or but nor because since although though unless until while whereas if than which
    who whom whose where whether
    the a an my your our their his her its some any every each another
    of into onto between without against via per
    um uh er erm hmm mm ah
    i we they he she
    """
)
# Prepositions that are also particles end many a sentence ("I can't log in.", "What is it
# for?", "I'd love to.") as well as cut one short ("a table for"): they make a turn unsure.
PARTICLES: Final = _wordlist(
    "to in on at for with from by about over under through up down out off back around like as"
)
# Auxiliaries end a sentence after a pronoun ("Yes, it is.", "I do.", "We can.") or "not", and
# leave it open after anything else ("My account number is", "The problem was").
AUXILIARIES: Final = _wordlist(
    "is are was were am be been being do does did have has had will would shall should can could "
    "may might must"
)
AUXILIARY_MAY_END_AFTER: Final = _wordlist(
    "i you we they he she it that this there who what which not so too"
)
# Two words a sentence does not end on, though each alone may: "Can you tell me", "I would like".
CONTINUING_PAIRS: Final = frozenset(
    {
        ("tell", "me"),
        ("show", "me"),
        ("give", "me"),
        ("send", "me"),
        ("let", "me"),
        ("i", "want"),
        ("i", "need"),
        ("would", "like"),
        ("i'd", "like"),
        ("i", "think"),
        ("i", "mean"),
        ("i'm", "calling"),
        ("it's", "about"),
        ("there", "is"),
        ("and", "then"),
        ("think", "that"),
        ("know", "that"),
        ("said", "that"),
        ("so", "that"),
    }
)
NUMBER_WORDS: Final = _wordlist(
    """
    zero oh one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen
    sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred
    thousand double triple
    """
)
READ_OUT_DIGITS: Final = 3  # a trailing number of this many digits (or number words) may go on
# Fewer words than this are never sure to be all: "Yes." and "Wait, stop." are often followed by
# more ("Yes. I would like ...", "Wait, stop, I would rather ..."), after a pause a speaker makes
# anyway. They wait min_silence_ms, as every turn did before.
FINISHED_WORDS: Final = 3
_CUT_OFF = re.compile(r"(\.\.\.|…|[-,\u2013\u2014])\s*$")  # "is...", "six,", "I-"
_ENDS = re.compile(r"[.!?][\"')\]]*\s*$")


def completion(text: str | None) -> Completion:
    """Whether ``text``, the caller's turn so far, reads as a finished sentence."""
    words = spoken_words(text)
    if not words or text is None:
        return Completion.UNSURE
    if _CUT_OFF.search(text):
        return Completion.UNFINISHED
    if words[-1] in CONTINUING_WORDS or tuple(words[-2:]) in CONTINUING_PAIRS:
        return Completion.UNFINISHED
    if words[-1] in AUXILIARIES and (len(words) < 2 or words[-2] not in AUXILIARY_MAY_END_AFTER):
        return Completion.UNFINISHED
    if _reads_out_a_number(words):
        return Completion.UNFINISHED
    if words[-1] in PARTICLES or len(words) < FINISHED_WORDS:
        return Completion.UNSURE
    return Completion.FINISHED if _ENDS.search(text) else Completion.UNSURE


def _reads_out_a_number(words: list[str]) -> bool:
    """A trailing run of digits or number words at least ``READ_OUT_DIGITS`` long: someone reading
    out an account number, a phone number, a code, who pauses between its groups ("4567." may be
    the first group of "4567 8910"). A short number ("I am 45.") is an answer like any other."""
    digits = 0
    for word in reversed(words):
        if word.isdigit():
            digits += len(word)
        elif word in NUMBER_WORDS:
            digits += 1
        else:
            break
    return digits >= READ_OUT_DIGITS


@dataclass(frozen=True)
class Heard:
    """What the speech tier has of the caller's turn as a pause begins, for a judge to read."""

    words: str | None = None  # the transcript so far (None: none, or the engine failed)
    failed: bool = False  # the engine could not say (failed, timed out, behind)
    complete: float | None = None  # the acoustic model's probability (None: not asked, or failed)
    ending: float | None = None  # the engine's probability that the sentence ends there (Reading)


@dataclass(frozen=True)
class Verdict:
    """A judge's word on one pause: what the words so far read as, and the silence that ends it."""

    completion: Completion
    silence_ms: float


class TurnEndJudge(ABC):
    """How long a pause that began after the words so far must last to end the caller's turn."""

    name: str

    @property
    @abstractmethod
    def needs_words(self) -> bool:
        """Whether it reads the words (the speech tier then transcribes as each pause begins)."""

    @property
    def needs_audio(self) -> bool:
        """Whether it reads the turn's audio (the acoustic model is asked as each pause begins)."""
        return False

    @abstractmethod
    def judge(self, heard: Heard) -> Verdict:
        """The verdict on a pause after what was ``heard`` (``Heard()``: nothing known yet)."""

    @property
    @abstractmethod
    def soonest_ms(self) -> float:
        """The shortest silence it ever asks for: by then the words must be known."""


class SilenceJudge(TurnEndJudge):
    name = "silence"

    def __init__(self, min_silence_ms: float) -> None:
        self.min_silence_ms = min_silence_ms

    @property
    def needs_words(self) -> bool:
        return False

    def judge(self, heard: Heard) -> Verdict:
        return Verdict(Completion.UNSURE, self.min_silence_ms)

    @property
    def soonest_ms(self) -> float:
        return self.min_silence_ms


def doubted(heard: Heard) -> bool:
    """Whether the engine was unsure of the full stop it closed the words with."""
    words = (heard.words or "").rstrip()
    return heard.ending is not None and heard.ending < ENDING_DOUBT and not words.endswith(UNDOUBTED_MARKS)


class TextJudge(TurnEndJudge):
    name = "text"

    def __init__(self, *, end_silence_ms: float, min_silence_ms: float, max_silence_ms: float) -> None:
        self.waits = {
            Completion.FINISHED: end_silence_ms,
            Completion.UNSURE: min_silence_ms,
            # never shorter than an unsure turn's wait, whatever the settings say
            Completion.UNFINISHED: max(max_silence_ms, min_silence_ms),
            Completion.DOUBTED: max(max_silence_ms, min_silence_ms),
        }

    @property
    def needs_words(self) -> bool:
        return True

    def judge(self, heard: Heard) -> Verdict:
        read = completion(None if heard.failed else heard.words)
        if read is Completion.FINISHED and doubted(heard):
            read = Completion.DOUBTED  # waits as long as an unfinished one, but may be answered ahead
        return Verdict(read, self.waits[read])

    @property
    def soonest_ms(self) -> float:
        return min(self.waits.values())


class SmartTurnJudge(TextJudge):
    """The acoustic model's word on the pause: complete or not (its own threshold, 0.5)."""

    name = "smart-turn"

    @property
    def needs_words(self) -> bool:
        return False

    @property
    def needs_audio(self) -> bool:
        return True

    def judge(self, heard: Heard) -> Verdict:
        if heard.complete is None:  # the model failed: as unsure as having no words
            read = Completion.UNSURE
        else:
            read = Completion.FINISHED if heard.complete > COMPLETE_THRESHOLD else Completion.UNFINISHED
        return Verdict(read, self.waits[read])


def resolve_detector(detector: str, *, words: bool) -> Literal["silence", "text", "smart-turn"]:
    """``auto`` is ``text`` where speech-to-text runs (``words``), ``silence`` elsewhere; ``text``
    and ``smart-turn`` (which hears the audio the speech tier keeps for speech-to-text) without it
    can only be ``silence``."""
    if not words:
        return "silence"
    return "smart-turn" if detector == "smart-turn" else "silence" if detector == "silence" else "text"
