"""The soft barge-in in the turn policy: while the agent speaks, the first ``soft_pause_ms`` of a
burst pause its voice (``UserSpeechOnset``); the burst then either cuts the agent off as before or
ends and lets it go on (``UserOnsetDismissed``, ``UserBackchannel``)."""

from __future__ import annotations

from bargein.agent.events import UserOnsetDismissed
from bargein.speech.turns import SOFT_RELEASE_MS, TurnConfig, TurnPolicy

HI, LO = 0.9, 0.05
W = 32.0


def policy_for(*, agent_speaking: bool = True, judges: bool = False, **config: object) -> TurnPolicy:
    policy = TurnPolicy(TurnConfig(**config), judges=judges)  # type: ignore[arg-type]
    policy.agent_speaking = agent_speaking
    return policy


def timeline(policy: TurnPolicy, probabilities: list[float]) -> list[tuple[str, float]]:
    return [(e.event.type_name(), e.at_ms) for p in probabilities for e in policy.feed(p)]


def n(ms: float) -> int:
    return round(ms / W)


def test_the_first_stretch_of_speech_pauses_the_agent_before_the_barge_in() -> None:
    policy = policy_for(soft_pause_ms=64, min_interruption_ms=250)
    events = timeline(policy, [LO] * 3 + [HI] * n(2000) + [LO] * n(600))
    assert [name for name, _ in events] == ["UserSpeechOnset", "UserStartedSpeaking", "UserStoppedSpeaking"]
    onset_at, barge_at = events[0][1], events[1][1]
    assert onset_at == 3 * W + 64  # two voiced windows after the burst began
    assert barge_at - onset_at >= 250 - 64 - W


def test_a_cough_pauses_and_is_dismissed_soon_after_it_ends() -> None:
    policy = policy_for(soft_pause_ms=64, min_interruption_ms=250, min_silence_ms=500)
    events = timeline(policy, [LO] * 3 + [HI] * n(128) + [LO] * n(600))
    assert [name for name, _ in events] == ["UserSpeechOnset", "UserOnsetDismissed"]
    dismissed = policy.emissions[-1].event
    assert isinstance(dismissed, UserOnsetDismissed) and dismissed.outcome == "short"
    cough_end = 3 * W + 128
    assert events[1][1] - cough_end == SOFT_RELEASE_MS  # not min_silence_ms (500) later


def test_voice_coming_back_pauses_the_agent_again_and_may_barge_in() -> None:
    policy = policy_for(soft_pause_ms=64, min_interruption_ms=250, min_silence_ms=500)
    events = timeline(policy, [HI] * n(96) + [LO] * n(224) + [HI] * n(2000) + [LO] * n(600))
    assert [name for name, _ in events] == [
        "UserSpeechOnset",  # the first syllable
        "UserOnsetDismissed",  # a gap: the agent goes on
        "UserSpeechOnset",  # the voice comes back in the same burst: paused again
        "UserStartedSpeaking",  # and it is a barge-in
        "UserStoppedSpeaking",
    ]


def test_a_held_burst_with_no_words_is_dismissed_and_one_with_a_backchannel_ends_as_one() -> None:
    noise = policy_for(judges=True, soft_pause_ms=64, min_interruption_ms=250)
    events = timeline(noise, [LO] * 3 + [HI] * n(400) + [LO] * n(600))
    assert [name for name, _ in events] == ["UserSpeechOnset", "UserOnsetDismissed"]
    assert noise.emissions[-1].event == UserOnsetDismissed(outcome="noise")

    uh_huh = policy_for(judges=True, soft_pause_ms=64, min_interruption_ms=250)
    events = timeline(uh_huh, [LO] * 3 + [HI] * n(400))
    assert uh_huh.judged("uh-huh", uh_huh.burst) == []  # a backchannel: still held
    events += timeline(uh_huh, [LO] * n(600))
    # its words reach its end: the agent goes on once it is quiet, before the burst is over
    assert [name for name, _ in events] == ["UserSpeechOnset", "UserOnsetDismissed", "UserBackchannel"]
    assert uh_huh.emissions[1].event == UserOnsetDismissed(outcome="backchannel")


def test_a_backchannel_heard_lets_the_agent_go_on_soon_after_it_ends_not_after_the_burst() -> None:
    # the finding: the voice stayed paused until the burst ended (min_silence_ms) and its
    # last transcription came: 1.3-1.9 s of dead air per "uh-huh"
    policy = policy_for(judges=True, soft_pause_ms=64, min_interruption_ms=250, min_silence_ms=500)
    events = timeline(policy, [LO] * 3 + [HI] * n(448))
    spoken_end = policy.at_ms
    events += timeline(policy, [LO] * n(96))
    assert policy.held_quiet  # quiet, and no words yet that reach the quiet: transcribe it now
    # words of its first 96 ms only: 352 ms came after them, room for another word
    assert policy.judged("Uh", policy.burst, upto_ms=spoken_end - 352) == []
    events += timeline(policy, [LO] * 2)
    assert [name for name, _ in events] == ["UserSpeechOnset"]  # still paused: its end not heard
    released = policy.judged("Uh-huh.", policy.burst)
    assert [e.event for e in released] == [UserOnsetDismissed(outcome="backchannel")]
    assert released[0].at_ms - spoken_end < 500  # before the burst would end (min_silence_ms)
    events += timeline(policy, [LO] * n(600))
    assert [name for name, _ in events][-1] == "UserBackchannel"


def test_a_backchannel_judged_to_near_its_end_lets_the_agent_go_on_without_another_transcription() -> None:
    """The judgement already under way covers the burst up to a little before its end (it began
    while the caller still spoke): its words are a backchannel and too little came after them for
    another word, so the agent goes on as soon as they come, not after a second transcription (~0.5 s
    here, which made the dead air's p95 ~1 s). The burst's words at its end may still cut it off."""
    policy = policy_for(judges=True, soft_pause_ms=64, min_interruption_ms=250, min_silence_ms=500)
    events = timeline(policy, [LO] * 3 + [HI] * n(448))
    spoken_end = policy.at_ms
    events += timeline(policy, [LO] * n(192))
    assert [name for name, _ in events] == ["UserSpeechOnset"]  # quiet, its words not known yet
    released = policy.judged("Okay.", policy.burst, upto_ms=spoken_end - 192)  # 192 ms came after
    assert [e.event for e in released] == [UserOnsetDismissed(outcome="backchannel")]
    # what came after them was more than a backchannel after all: cut off when the burst ends
    cut = policy.judged("Okay, no.", policy.burst, final=True)
    assert [e.event.type_name() for e in cut] == ["UserStartedSpeaking"]

    silent = policy_for(judges=True, soft_pause_ms=64, min_interruption_ms=250, min_silence_ms=500)
    timeline(silent, [LO] * 3 + [HI] * n(448))
    spoken_end = silent.at_ms
    timeline(silent, [LO] * n(192))
    # no words yet of what was judged: they speak for nothing, whatever came after them
    assert silent.judged("", silent.burst, upto_ms=spoken_end - 192) == []


def test_a_held_burst_whose_words_are_not_backchannels_keeps_the_agent_paused_through_its_gaps() -> None:
    # "wait, ... stop" with interrupt_words 2: "wait" alone does not cut, but must not resume either
    policy = policy_for(
        judges=True, soft_pause_ms=64, min_interruption_ms=250, min_silence_ms=500, interrupt_words=2
    )
    events = timeline(policy, [LO] * 3 + [HI] * n(320) + [LO] * n(64))
    assert policy.judged("Wait,", policy.burst) == []
    events += timeline(policy, [LO] * n(288))  # a gap of 352 ms, longer than SOFT_RELEASE_MS
    assert "UserOnsetDismissed" not in [name for name, _ in events]
    events += timeline(policy, [HI] * n(320))
    barge = policy.judged("Wait, stop.", policy.burst)
    assert [e.event.type_name() for e in barge] == ["UserStartedSpeaking"]
    assert [name for name, _ in events] == ["UserSpeechOnset"]  # one pause, never resumed


def test_no_pause_when_the_agent_is_silent_or_the_soft_barge_in_is_off() -> None:
    silent = policy_for(agent_speaking=False, soft_pause_ms=64)
    assert [name for name, _ in timeline(silent, [HI] * n(2000) + [LO] * n(600))] == [
        "UserStartedSpeaking",
        "UserStoppedSpeaking",
    ]
    off = policy_for(soft_pause_ms=0)
    assert "UserSpeechOnset" not in [name for name, _ in timeline(off, [HI] * n(400) + [LO] * n(600))]


def test_a_gap_between_syllables_keeps_the_pause() -> None:
    policy = policy_for(soft_pause_ms=64, min_silence_ms=500)
    events = timeline(policy, [HI] * n(100) + [LO] * n(96) + [HI] * n(100) + [LO] * n(600))
    assert [name for name, _ in events] == ["UserSpeechOnset", "UserOnsetDismissed"]
