"""The garbage collector of a process with many sessions (``hosting/load.py`` ``Collector``): what
survives a full collection is frozen, so that later ones do not walk it again (with 2,000 sessions
an edge paused half a second every few seconds, and refused new callers as overloaded), and it is
thawed and collected once most of the sessions have gone."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from bargein import metrics
from bargein.hosting.load import THAW_FROM, THAW_STEADY_S, Collector


class Node:
    """A session's state in miniature: objects that refer to each other (a cycle)."""

    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> tuple[Node, weakref.ref[Node]]:
    first, second = Node(), Node()
    first.other, second.other = second, first
    return first, weakref.ref(second)


@pytest.fixture
def held() -> Iterator[list[int]]:
    """How many sessions the process holds, as the test says; everything thawed afterwards."""
    sessions = [0]
    yield sessions
    gc.unfreeze()
    gc.collect()


def tracked(target: object) -> bool:
    """Whether a collection would walk ``target`` (frozen objects are in no generation)."""
    return any(obj is target for obj in gc.get_objects())


def test_what_survives_a_full_collection_is_frozen_out_of_the_next(held: list[int]) -> None:
    collector = Collector("test", lambda: held[0])
    collector.start()
    try:
        state, _ = cycle()  # a live session's state
        gc.collect()
        assert tracked(state)  # not yet: the freeze waits for the event loop
        collector.tend()
        assert not tracked(state) and gc.get_freeze_count() > 0
        young, _ = cycle()  # what came after is walked as before
        assert tracked(young)
    finally:
        collector.stop()
    assert tracked(state)  # handed back when the watch ends (a test suite keeps nothing frozen)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_frozen_cycles_are_collected_once_most_sessions_have_gone(held: list[int]) -> None:
    clock = Clock()
    collector = Collector("test", lambda: held[0], clock)
    collector.start()
    try:
        held[0] = THAW_FROM * 2  # busy
        state, alive = cycle()
        gc.collect()
        collector.tend()  # frozen
        del state  # the session ended, its cycle is garbage now
        gc.collect()
        collector.tend()
        assert alive() is not None  # kept, as the price of not walking it
        held[0] = THAW_FROM  # half the peak: still busy enough not to thaw
        clock.now += THAW_STEADY_S
        collector.tend()
        assert alive() is not None
        held[0] = THAW_FROM * 2 // 4  # a quarter of the busiest, and still falling
        collector.tend()
        assert alive() is not None
        clock.now += THAW_STEADY_S  # ... and so for a while: the callers have stopped leaving
        collector.tend()
        assert alive() is None  # thawed and collected
        assert collector.peak_since_thaw == THAW_FROM // 2  # counted afresh from here
    finally:
        collector.stop()


def test_no_thaw_while_callers_are_hanging_up_in_numbers(held: list[int]) -> None:
    """Issue 27's mass hang-up: at a quarter of its busiest, mid-way, a reasoning worker thawed
    and collected everything, and paused 1.4 s while it was ending the rest."""
    clock = Clock()
    collector = Collector("test", lambda: held[0], clock)
    collector.start()
    try:
        held[0] = THAW_FROM * 20
        state, alive = cycle()
        gc.collect()
        collector.tend()  # frozen
        del state
        while held[0] > 0:  # a hundred hang-ups a second, watched every 50 ms
            held[0] = max(0, held[0] - 5)
            clock.now += 0.05
            collector.tend()
            assert alive() is not None or held[0] == 0, held[0]
        for _ in range(int(THAW_STEADY_S / 0.05) + 1):  # all gone: now it is quiet
            clock.now += 0.05
            collector.tend()
        assert alive() is None
    finally:
        collector.stop()


def test_every_pass_of_the_collector_is_timed(held: list[int]) -> None:
    def passes(generation: int) -> float:
        value = metrics.REGISTRY.get_sample_value(
            "bargein_gc_pause_seconds_count", {"generation": str(generation)}
        )
        return value or 0.0

    collector = Collector("test")
    collector.start()
    try:
        before = passes(2)
        gc.collect()
        assert passes(2) == before + 1
        assert collector.longest_ms > 0
    finally:
        collector.stop()
    gc.collect()
    assert passes(2) == before + 1  # stopped: no longer observed
