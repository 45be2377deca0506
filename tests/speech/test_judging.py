"""Barge-ins judged by words while the agent speaks: the policy's held state, the word test it
applies, and ``words_at_least`` for agents' own routes.

The policy is driven with synthetic probabilities and told what the engine "heard" (the engine
itself is tested on real audio in test_corpus.py and test_whisper.py)."""

from __future__ import annotations

import pytest

from bargein import words_at_least
from bargein.agent.events import (
    AgentPlayback,
    FalseInterruption,
    UserBackchannel,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.message import Message
from bargein.agent.words import content_words, spoken_words
from bargein.errors import TurnTakingError
from bargein.speech.turns import State, TurnConfig, TurnPolicy
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN

from . import pcm
from .test_processor import FixedTranscriber, Rig

HI, LO = 0.9, 0.05
W = 32.0


def held(**config: object) -> TurnPolicy:
    """A policy that can judge words, with the agent speaking (no soft barge-in unless asked: here
    the words are tested; test_soft_pause.py tests the pause)."""
    config.setdefault("soft_pause_ms", 0)
    policy = TurnPolicy(TurnConfig(**config), judges=True)  # type: ignore[arg-type]
    policy.agent_speaking = True
    return policy


SOFT_PAUSE = {"UserSpeechOnset", "UserOnsetDismissed"}  # the pause is test_soft_pause.py's; here: words


def feed(policy: TurnPolicy, probabilities: list[float]) -> list[str]:
    names = [e.event.type_name() for p in probabilities for e in policy.feed(p)]
    return [name for name in names if name not in SOFT_PAUSE]


def kinds(policy: TurnPolicy) -> list[str]:
    return [e.event.type_name() for e in policy.emissions if e.event.type_name() not in SOFT_PAUSE]


def n(ms: float) -> int:
    return round(ms / W)


def test_while_the_agent_speaks_a_burst_waits_for_its_words_instead_of_cutting_it_off() -> None:
    policy = held()
    assert feed(policy, [LO] * 5 + [HI] * n(320)) == []  # past min_interruption_ms (250): held
    assert policy.state is State.HELD
    assert [e.event.type_name() for e in policy.judged("Uh-huh.", policy.burst)] == []  # listening
    (barge,) = policy.judged("Uh-huh, wait, stop.", policy.burst)  # ... then real words
    assert isinstance(barge.event, UserStartedSpeaking) and barge.event.transcript == "Uh-huh, wait, stop."
    assert feed(policy, [LO] * n(600)) == ["UserStoppedSpeaking"]


def test_a_backchannel_that_ends_cuts_nothing_off_and_is_reported_as_such() -> None:
    policy = held()
    feed(policy, [LO] * 5 + [HI] * n(400))
    policy.judged("Mm-hmm. Okay.", policy.burst)
    assert feed(policy, [LO] * n(600)) == ["UserBackchannel"]
    (emission,) = policy.emissions
    assert isinstance(emission.event, UserBackchannel) and emission.event.content == "Mm-hmm. Okay."
    assert [b.outcome for b in policy.bursts] == ["backchannel"]
    assert policy.state is State.SILENT


def test_a_held_burst_with_no_words_at_all_is_noise_and_emits_nothing() -> None:
    policy = held()
    feed(policy, [LO] * 5 + [HI] * n(400))
    policy.judged(None, policy.burst)
    policy.judged("(coughing)", policy.burst)  # engines mark non-speech in brackets
    assert feed(policy, [LO] * n(600)) == []
    assert [b.outcome for b in policy.bursts] == ["noise"]


def test_speech_too_long_to_be_a_backchannel_interrupts_whatever_it_said() -> None:
    policy = held(max_backchannel_ms=800)
    feed(policy, [HI] * n(500))
    policy.judged("Okay okay", policy.burst)
    assert feed(policy, [HI] * n(400)) == ["UserStartedSpeaking"]
    assert policy.emissions[0].event.transcript == "Okay okay"  # type: ignore[attr-defined]


def test_when_the_engine_cannot_say_the_burst_interrupts_by_timing() -> None:
    policy = held()
    feed(policy, [HI] * n(300))
    (barge,) = policy.judge_failed(policy.burst)
    assert isinstance(barge.event, UserStartedSpeaking) and barge.event.transcript is None
    assert feed(policy, [LO] * n(600)) == ["FalseInterruption"]  # short and wordless, as without STT


def test_a_late_judgement_about_an_earlier_burst_changes_nothing() -> None:
    policy = held()
    feed(policy, [HI] * n(300))
    first = policy.burst
    policy.judged(None, first)
    feed(policy, [LO] * n(600) + [HI] * n(300))  # the first burst ended (noise); a second is held
    assert policy.judged("stop right there", first) == []
    assert policy.state is State.HELD
    assert len(policy.judged("stop right there", policy.burst)) == 1


@pytest.mark.parametrize(
    ("judges", "speaking", "words"),
    [(False, True, 1), (True, False, 1), (True, True, 0)],
    ids=["no-engine", "agent-silent", "interrupt-words-0"],
)
def test_without_an_engine_an_agent_speaking_or_the_setting_bursts_interrupt_on_timing(
    judges: bool, speaking: bool, words: int
) -> None:
    policy = TurnPolicy(TurnConfig(interrupt_words=words), judges=judges)
    policy.agent_speaking = speaking
    assert feed(policy, [HI] * n(300)) == ["UserStartedSpeaking"]  # a "yeah" answering a question is a turn
    assert policy.state is State.SPEAKING


def test_interrupt_words_counts_only_words_that_are_not_backchannels() -> None:
    policy = held(interrupt_words=2)
    feed(policy, [HI] * n(300))
    assert policy.judged("Okay, wait.", policy.burst) == []  # one word besides "okay": not yet
    assert len(policy.judged("Okay, wait. Stop.", policy.burst)) == 1


def test_a_sessions_own_backchannels_replace_the_defaults() -> None:
    config = TurnConfig().with_overrides({"backchannels": ["ja", "genau"], "interrupt_words": 1})
    assert config.backchannels == ("ja", "genau")
    policy = TurnPolicy(config, judges=True)
    policy.agent_speaking = True
    feed(policy, [HI] * n(300))
    assert policy.judged("Ja genau", policy.burst) == []
    assert len(policy.judged("Okay", policy.burst)) == 1  # not a backchannel for this session
    with pytest.raises(TurnTakingError, match="backchannels"):
        TurnConfig().with_overrides({"backchannels": "ja"})
    with pytest.raises(TurnTakingError, match="interrupt_words"):
        TurnConfig().with_overrides({"interrupt_words": -1})


def test_the_word_test() -> None:
    assert spoken_words("Wait — STOP! [BLANK_AUDIO] (coughs) *sigh*") == ["wait", "stop"]
    assert content_words("Okay, uh-huh. Got it, I see.") == []
    assert content_words("Yeah, but that's wrong") == ["but", "that's", "wrong"]
    assert content_words("got") == ["got"]  # a phrase matches only whole


@pytest.mark.parametrize("no", ["Uh-uh.", "Mm-mm.", "Nope.", "No.", "Nah."])
def test_a_no_said_over_the_agent_is_never_a_backchannel(no: str) -> None:
    """ "Uh-uh" means no: said over the agent it must be able to cut it off (issue 28)."""
    assert content_words(no) != []
    policy = held(interrupt_words=1)
    feed(policy, [HI] * n(300))
    assert len(policy.judged(no, policy.burst)) == 1


def msg(event: object) -> Message:
    return Message(event=event)  # type: ignore[arg-type]


def test_words_at_least_is_a_condition_for_an_agents_own_routes() -> None:
    two = words_at_least(2)
    assert two(msg(UserStartedSpeaking(transcript="Wait, stop.")))
    assert not two(msg(UserStartedSpeaking(transcript="Okay, stop.")))
    assert not two(msg(FalseInterruption(transcript="uh-huh")))
    assert two(msg(UserStartedSpeaking()))  # no words known (no STT, the stop button): timing decides
    assert not words_at_least(1, unknown=False)(msg(UserStartedSpeaking()))
    assert two(msg(UserTranscriptionReceived(content="no, the other one")))  # a turn's words count too
    assert not two(msg(UserTranscriptionReceived(content="yes")))
    assert two(msg(UserStoppedSpeaking()))  # no words on it: unknown
    with pytest.raises(ValueError, match="n >= 0"):
        words_at_least(-1)


def test_a_backchannel_that_cut_the_agent_off_by_timing_is_a_false_interruption_with_its_words() -> None:
    """Judging off (interrupt_words 0): "uh-huh" cuts the agent off at 250 ms, as without words; its
    words then show it was only listening: a FalseInterruption carrying them (the agent resumes),
    not a turn."""
    policy = TurnPolicy(TurnConfig(interrupt_words=0), judges=True)
    policy.agent_speaking = True
    feed(policy, [HI] * n(400))
    feed(policy, [LO] * (n(500) - 1))  # the burst is about to end
    assert policy.only_listening("Uh-huh.")
    policy.note_listening("Uh-huh.")
    (false,) = [e for p in [LO] * 5 for e in policy.feed(p)]
    assert isinstance(false.event, FalseInterruption) and false.event.transcript == "Uh-huh."


def test_words_after_a_cut_are_a_turn_and_so_is_a_yeah_that_answers_the_agent() -> None:
    cut = TurnPolicy(TurnConfig(interrupt_words=0), judges=True)
    cut.agent_speaking = True
    feed(cut, [HI] * n(400) + [LO] * (n(500) - 1))
    assert not cut.only_listening("Wait, no.")  # real words: a turn
    answer = TurnPolicy(TurnConfig(), judges=True)  # the agent is silent: "yeah" answers it
    feed(answer, [HI] * n(400) + [LO] * (n(500) - 1))
    assert not answer.only_listening("Yeah.")
    long = TurnPolicy(TurnConfig(interrupt_words=0), judges=True)
    long.agent_speaking = True
    feed(long, [HI] * n(1800) + [LO] * (n(500) - 1))  # longer than false_interruption_timeout_ms
    assert not long.only_listening("Okay okay okay okay.")


async def test_in_a_session_a_timed_cut_that_only_said_uh_huh_lets_the_agent_resume() -> None:
    rig = Rig(transcriber=FixedTranscriber("Uh-huh."))
    await rig.worker.start()
    try:
        session = await rig.open({"turn_taking": {"interrupt_words": 0}})  # timing decides the cut
        playback = Envelope.wrap(session.sid, AgentPlayback(speaking=True), source="edge")
        await rig.transport.publish(playback, IN)  # the edge: the agent is speaking
        await session.stream(pcm("short_burst.wav"))
        # the agent's voice paused at once, then cut off by timing; no transcript, no turn
        await session.expect(["UserSpeechOnset", "UserStartedSpeaking", "FalseInterruption"])
        false = session.to_agent[2][1]
        assert isinstance(false, FalseInterruption) and false.transcript == "Uh-huh."
        assert session.runtime.counters["backchannels_after_cut"] == 1
    finally:
        await rig.close()


def test_a_yes_begun_over_the_agents_last_words_is_a_turn_once_the_agent_has_stopped() -> None:
    policy = held()
    feed(policy, [HI] * n(300))
    assert policy.judged("Yes.", policy.burst) == []  # the agent still speaks: only listening, so far
    policy.agent_speaking = False  # its question ended while the caller answered
    (barge,) = policy.judged("Yes.", policy.burst, final=True)
    assert isinstance(barge.event, UserStartedSpeaking) and barge.event.transcript == "Yes."
    policy2 = held()
    feed(policy2, [HI] * n(300))
    assert policy2.judged("Yes.", policy2.burst, final=True) == []  # the agent goes on: a backchannel


def test_a_word_the_engine_heard_only_the_start_of_is_judged_when_it_is_whole() -> None:
    """Whisper marks a word cut off at the end of the audio with a trailing hyphen ("Alright." read
    on its first quarter-second as "Bo-la-"): what that word will be is not known yet, so it cuts
    nothing off until a later reading has it whole (bench bargein-decisions' wrong cuts, 12-06)."""
    policy = held()
    feed(policy, [LO] * 5 + [HI] * n(320))
    assert policy.judged("Bo-la-", policy.burst) == []  # not yet a word
    assert policy.judged("Alright.", policy.burst) == []  # whole: a backchannel, still held
    assert feed(policy, [LO] * n(600)) == ["UserBackchannel"]
    cut = held()
    feed(cut, [LO] * 5 + [HI] * n(320))
    assert cut.judged("Wait, st-", cut.burst) != []  # the whole words before it still count
    ends = held()
    feed(ends, [LO] * 5 + [HI] * n(320))
    (barge,) = ends.judged("Bo-la-", ends.burst, final=True)  # the burst is over: all it will say
    assert isinstance(barge.event, UserStartedSpeaking)


def test_words_that_end_in_a_cut_off_word_do_not_let_the_agent_go_on() -> None:
    """ "Uh-huh, bu-" may be "uh-huh, but wait": the agent stays paused until the word is whole."""
    policy = held(soft_pause_ms=100)
    feed(policy, [LO] * 5 + [HI] * n(320) + [LO] * n(200))
    assert policy.held_quiet
    assert policy.judged("Uh-huh, bu-", policy.burst) == []  # no release: the words say too little
    assert policy.held_quiet  # asks for a reading that reaches the quiet
    (released,) = policy.judged("Uh-huh.", policy.burst)
    assert released.event.type_name() == "UserOnsetDismissed"
