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
    assert [name for name, _ in events] == ["UserSpeechOnset", "UserBackchannel"]


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
