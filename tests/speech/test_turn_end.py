"""The end of the caller's turn: the text judge's reading of transcripts, the judges, and the
turn-taking policy with a judge on synthetic probability sequences (see test_turns.py)."""

from __future__ import annotations

import pytest

from bargein.errors import TurnTakingError
from bargein.settings import SpeechSettings, check_turn_taking, load
from bargein.speech.turn_end import (
    Completion,
    Heard,
    SilenceJudge,
    TextJudge,
    completion,
    resolve_detector,
)
from bargein.speech.turns import PAUSE_WORDS_AFTER_MS, TurnConfig, TurnPolicy

W = 32.0
HI, LO = 0.9, 0.05


@pytest.mark.parametrize(
    "text",
    [
        "I want a refund.",
        "What time does the store open?",
        "No, thank you.",
        "Can you help me?",
        "Sorry, can you repeat that?",
        "Yes, it is.",
        "Yes I do.",
        "I am 45.",
        "I think so.",
        "Okay then, bye.",
        "That's all for today!",
        "My name is Anna.",
    ],
)
def test_finished_sentences(text: str) -> None:
    assert completion(text) is Completion.FINISHED


@pytest.mark.parametrize(
    "text",
    [
        "My account number is...",  # Whisper's mark of a sentence cut short
        "So nothing is…",
        "My account number is.",  # punctuated, but no sentence ends on "is" after a noun
        "I would like to book a table for the",
        "It's for the",
        "I called yesterday and",
        "I was, um",
        "Uh.",
        "Can you tell me",
        "I'd like",
        "The problem was",
        "My number is four five six",  # a number being read out
        "It's 4567,",
        "It's 4 5 6.",
        "Well, I think that",
        "So I-",
        "We went to the shop and then",
    ],
)
def test_unfinished_sentences(text: str) -> None:
    assert completion(text) is Completion.UNFINISHED


@pytest.mark.parametrize("text", [None, "", "   ", "[BLANK_AUDIO]", "(coughing)", "thanks", "okay then"])
def test_no_words_or_no_punctuation_is_unsure(text: str | None) -> None:
    assert completion(text) is Completion.UNSURE


def test_the_judges_waits() -> None:
    text = TextJudge(end_silence_ms=250, min_silence_ms=500, max_silence_ms=2000)
    assert text.needs_words and text.soonest_ms == 250
    assert text.judge(Heard("I want a refund.")).silence_ms == 250
    assert text.judge(Heard("and the")).silence_ms == 2000
    assert text.judge(Heard("thanks")).silence_ms == 500
    assert text.judge(Heard()).silence_ms == 500  # no words yet
    assert text.judge(Heard("I want a refund.", failed=True)).silence_ms == 500  # the engine failed
    # an unfinished sentence never waits less than an unsure one, whatever the settings say
    assert (
        TextJudge(end_silence_ms=100, min_silence_ms=800, max_silence_ms=300).judge(Heard("and")).silence_ms
        == 800
    )
    silence = SilenceJudge(500)
    assert not silence.needs_words and silence.judge(Heard("and the")).silence_ms == 500


def test_a_full_stop_the_engine_doubted_waits_as_long_as_an_unfinished_sentence() -> None:
    """Whisper tiny finishes half a sentence for the caller ("The problem is that" → "The problem is
    not.", with 0.59 on its full stop): the judge must not end the turn on it after 250 ms."""
    text = TextJudge(end_silence_ms=250, min_silence_ms=500, max_silence_ms=2000)
    doubted = text.judge(Heard("The problem is not.", ending=0.59))
    assert (doubted.completion, doubted.silence_ms) == (Completion.DOUBTED, 2000)
    assert text.judge(Heard("I want a refund.", ending=0.86)).silence_ms == 250  # sure of it
    assert text.judge(Heard("I want a refund.")).silence_ms == 250  # an engine that cannot say
    assert text.judge(Heard("and the", ending=0.95)).completion is Completion.UNFINISHED  # the words


def test_a_question_is_not_doubted() -> None:
    """Found in bench e2e on the phone line: "What is the weather like this weekend?" read with 0.64
    on its question mark, and the caller waited 2 s for the answer (3 of 20 questions). Whisper
    closes the halves it finishes with a full stop; the rules already read "Can you tell me?"."""
    text = TextJudge(end_silence_ms=250, min_silence_ms=500, max_silence_ms=2000)
    question = text.judge(Heard("What is the weather like this weekend?", ending=0.64))
    assert (question.completion, question.silence_ms) == (Completion.FINISHED, 250)
    assert text.judge(Heard("Can you tell me?", ending=0.64)).completion is Completion.UNFINISHED
    assert text.judge(Heard("The problem is not!", ending=0.5)).completion is Completion.DOUBTED


def test_auto_is_text_where_words_are_heard() -> None:
    assert resolve_detector("auto", words=True) == "text"
    assert resolve_detector("auto", words=False) == "silence"
    assert resolve_detector("text", words=False) == "silence"  # nothing to read
    assert resolve_detector("silence", words=True) == "silence"
    assert resolve_detector("smart-turn", words=True) == "smart-turn"
    assert resolve_detector("smart-turn", words=False) == "silence"


def test_the_detector_and_its_waits_are_settings_and_per_session_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BARGEIN_TURN_DETECTOR", "silence")
    monkeypatch.setenv("BARGEIN_END_SILENCE_MS", "200")
    settings = load(SpeechSettings)
    assert (settings.turn_detector, settings.end_silence_ms, settings.max_silence_ms) == (
        "silence",
        200,
        2000,
    )
    assert check_turn_taking({"turn_detector": "text", "max_silence_ms": 1500}) == {
        "turn_detector": "text",
        "max_silence_ms": 1500,
    }
    with pytest.raises(TurnTakingError, match="turn_detector"):
        check_turn_taking({"turn_detector": "smart"})
    assert check_turn_taking({"turn_detector": "smart-turn"}) == {"turn_detector": "smart-turn"}
    with pytest.raises(TurnTakingError, match="end_silence_ms"):
        check_turn_taking({"end_silence_ms": 10})


# --- the policy with the text judge ---------------------------------------------------------------


class Caller:
    """Feeds a TurnPolicy as the speech service does: asks for a pause's words when the policy wants
    them, and hands them over when the service would have them (``words`` per pause, in order)."""

    def __init__(self, words: list[str | None], **config: object) -> None:
        self.policy = TurnPolicy(TurnConfig(**config), judges=True)  # type: ignore[arg-type]
        self.words = list(words)
        self.asked: list[int] = []
        self.events: list[tuple[str, float]] = []  # (event, at_ms)

    def feed(self, probabilities: list[float]) -> None:
        policy = self.policy
        for p in probabilities:
            if policy.words_due and policy.would_end_burst(p):  # the service waits for them here
                words = self.words.pop(0)
                policy.pause_words(policy.pause, Heard(words))
                if words:
                    policy.note_transcript()  # a turn with words: never a false interruption
            for emission in policy.feed(p):
                self.events.append((emission.event.type_name(), emission.at_ms))
            pause = policy.pause_needing_words()
            if pause is not None:
                self.asked.append(pause)
                policy.expect_words(pause)

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


def windows(ms: float) -> int:
    return round(ms / W)


def test_a_finished_sentence_ends_the_turn_after_the_short_silence() -> None:
    caller = Caller(["I want a refund."])
    caller.feed([HI] * windows(1000) + [LO] * windows(1000))
    assert caller.kinds() == ["UserStartedSpeaking", "UserStoppedSpeaking"]
    stopped_at = caller.events[1][1]
    assert stopped_at - 1000 == pytest.approx(250, abs=W)  # not the 500 ms of the silence judge
    assert caller.asked == [1]  # asked once, as the pause began (after PAUSE_WORDS_AFTER_MS)
    assert PAUSE_WORDS_AFTER_MS < 250


def test_an_unfinished_sentence_waits_through_a_pause_and_is_one_turn() -> None:
    caller = Caller(["My account number is...", "My account number is 4567, and my card was declined."])
    caller.feed([HI] * windows(1200) + [LO] * windows(800) + [HI] * windows(1500) + [LO] * windows(1000))
    assert caller.kinds() == ["UserStartedSpeaking", "UserStoppedSpeaking"]
    assert caller.events[1][1] - 3500 == pytest.approx(250, abs=W)  # the whole sentence, then soon
    assert caller.asked == [1, 2]


def test_the_silence_judge_answers_in_the_pause() -> None:
    """The finding reproduced: today's fixed wait splits the sentence into two turns."""
    policy = TurnPolicy(TurnConfig(turn_detector="silence"), judges=True)
    kinds = []
    for p in [HI] * windows(1600) + [LO] * windows(800) + [HI] * windows(1600) + [LO] * windows(1000):
        kinds += [e.event.type_name() for e in policy.feed(p)]
        assert policy.pause_needing_words() is None  # it never asks for words
    assert kinds == ["UserStartedSpeaking", "UserStoppedSpeaking"] * 2


def test_an_unfinished_sentence_ends_after_max_silence() -> None:
    caller = Caller(["I would like to book a table for the"], max_silence_ms=1500)
    caller.feed([HI] * windows(1000) + [LO] * windows(2500))
    assert caller.kinds() == ["UserStartedSpeaking", "UserStoppedSpeaking"]
    assert caller.events[1][1] - 1000 == pytest.approx(1500, abs=W)


def test_words_that_say_neither_wait_min_silence() -> None:
    caller = Caller([None], min_silence_ms=600)  # the engine failed, or heard nothing
    caller.feed([HI] * windows(1000) + [LO] * windows(1000))
    assert caller.events[1][1] - 1000 == pytest.approx(600, abs=W)


def test_late_words_of_a_pause_the_caller_spoke_through_are_ignored() -> None:
    policy = TurnPolicy(TurnConfig(), judges=True)
    for p in [HI] * windows(1000) + [LO] * windows(100):
        policy.feed(p)
    pause = policy.pause_needing_words()
    assert pause is not None
    policy.expect_words(pause)
    policy.feed(HI)  # the caller goes on before the words come back
    assert policy.pause_words(pause, Heard("I want a refund.")) is None
    for p in [LO] * windows(100):
        policy.feed(p)
    assert policy.pause_needing_words() == pause + 1  # the new pause needs words of its own


def test_a_burst_that_is_no_turn_is_not_judged_by_words() -> None:
    """While the agent speaks a burst is held for its own words (test_judging.py), and a burst
    too short to be a barge-in is no turn: neither is asked about how long its pause may last."""
    policy = TurnPolicy(TurnConfig(), judges=True, agent_speaking=True)
    for p in [HI] * windows(400) + [LO] * windows(200):
        policy.feed(p)
        assert policy.pause_needing_words() is None
    short = TurnPolicy(TurnConfig(), judges=True)
    for p in [HI] * windows(100) + [LO] * windows(200):
        short.feed(p)
        assert short.pause_needing_words() is None
