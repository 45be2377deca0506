"""A session survives its owner: crash or hand-over mid-turn, in process.

The same code runs distributed (tests/integration kill real processes); here ``LocalSession.crash``
drops the owner without a checkpoint or a lease release, and a fresh owner adopts the session from
the last checkpoint, exactly as another worker would.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest

from bargein import (
    AgentGenerationComplete,
    AgentResponse,
    Message,
    ReasoningNode,
    UserStartedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.message import Source
from bargein.errors import NotOwner
from bargein.testing import LocalSession
from bargein.transport.abc import Heartbeat
from bargein.wire.envelope import Envelope

from ..agents import interruptible_agent, scripted
from .helpers import ask, history, reply_text, take_chunks, wait_for

FIRST = " ".join(f"a{i}" for i in range(30))
SECOND = " ".join(f"b{i}" for i in range(30))
THIRD = " ".join(f"c{i}" for i in range(30))
handler_calls: list[str] = []


class Node(ReasoningNode):
    def __init__(self) -> None:
        super().__init__(llm_client=scripted(FIRST, SECOND))

    async def on_interrupt_generate(self, message: Message) -> None:
        handler_calls.append(f"start:{self.id}")
        await asyncio.sleep(0.5)
        handler_calls.append(f"end:{self.id}")


agent = interruptible_agent(Node)


async def _rest_of_turn(s: LocalSession) -> list[Any]:
    events = await s.collect_turn(timeout=10)
    assert isinstance(events[-1], AgentGenerationComplete)
    return events


async def test_crash_mid_turn_the_adopter_completes_the_answer_without_repeats_or_gaps() -> None:
    async with LocalSession(agent) as s:
        await ask(s, "q1")
        heard = await take_chunks(s, 5)
        await s.crash()
        rest = await _rest_of_turn(s)
        assert "".join(heard) + reply_text(rest) == FIRST  # nothing repeated, nothing missing
        assert s.runtime.counters["turns_resumed"] == 1
        assert s.runtime.epoch == 2
        assert {env.turn for env, _ in s.received} == {1}  # the same turn, continued
        # the adopter's history is whole, and the conversation goes on
        assert history(s) == [("user", "q1"), ("assistant", FIRST)]
        await ask(s, "q2")
        assert reply_text(await _rest_of_turn(s)) == SECOND


async def test_crash_between_two_turns_loses_nothing_and_continues_numbering() -> None:
    async with LocalSession(agent) as s:
        await ask(s, "q1")
        await _rest_of_turn(s)
        await s.crash()
        await ask(s, "q2")
        assert reply_text(await _rest_of_turn(s)) == SECOND
        assert s.received[-1][0].turn == 2
        assert history(s) == [("user", "q1"), ("assistant", FIRST), ("user", "q2"), ("assistant", SECOND)]


async def test_crash_before_the_turn_started_runs_it_in_the_adopter() -> None:
    async with LocalSession(agent) as s:
        # the events are acknowledged (checkpointed) but the owner dies before producing anything
        await ask(s, "q1")
        await s.crash()
        assert reply_text(await _rest_of_turn(s)) == FIRST
        assert history(s) == [("user", "q1"), ("assistant", FIRST)]


async def test_crash_during_the_interrupt_handler_runs_the_handler_in_the_adopter() -> None:
    handler_calls.clear()
    async with LocalSession(agent) as s:
        await ask(s, "q1")
        heard = "".join(await take_chunks(s, 3))
        await s.emit(UserStartedSpeaking())
        assert s.interrupted_turns == [1]
        await asyncio.sleep(0.1)  # the handler is running (it takes 0.5 s)
        assert handler_calls == ["start:Node"]
        await s.crash()
        await wait_for(lambda: "end:Node" in handler_calls)
        assert handler_calls == ["start:Node", "start:Node", "end:Node"]
        assert await s.quiet(0.2) == []  # the interrupted turn is not resumed
        assert history(s) == [("user", "q1"), ("assistant", heard)]
        await ask(s, "q2")
        assert reply_text(await _rest_of_turn(s)) == SECOND


async def test_graceful_hand_over_mid_turn_resumes_instead_of_interrupting() -> None:
    async with LocalSession(agent) as s:
        await ask(s, "q1")
        heard = await take_chunks(s, 4)
        await s.restart()
        rest = await _rest_of_turn(s)
        assert "".join(heard) + reply_text(rest) == FIRST
        assert s.interrupted_turns == []
        assert history(s) == [("user", "q1"), ("assistant", FIRST)]


async def test_stale_owner_output_is_dropped_at_the_edge() -> None:
    """Chunks stamped with the old owner's epoch that arrive after the new owner's are fenced."""
    async with LocalSession(agent) as s:
        await ask(s, "q1")
        await take_chunks(s, 2)
        await s.crash()
        await _rest_of_turn(s)
        from bargein.wire.envelope import Envelope
        from bargein.wire.names import OUT

        late = Envelope.wrap(s.session_id, AgentResponse(content="STALE"), turn=1, seq=99, epoch=1)
        await s.transport.publish(late, OUT)
        assert await s.quiet(0.1) == []
        assert s.fence.dropped["stale_epoch"] >= 1


async def test_a_barge_in_while_nobody_owns_the_session_keeps_exactly_what_was_heard() -> None:
    async with LocalSession(interruptible_agent(replies=(FIRST, SECOND, THIRD))) as s:
        await ask(s, "q1")
        heard = "".join(await take_chunks(s, 5))
        await s.crash(adopt=False)  # the owner is dead, and nobody has adopted the session yet
        await s.emit(UserStartedSpeaking())  # the caller talks over the answer meanwhile
        await ask(s, "q2")
        await s.adopt()  # the new owner has produced none of the chunks the caller heard
        rest = await _rest_of_turn(s)
        assert reply_text(rest) == SECOND  # the next answer, not the cut one again
        assert history(s) == [("user", "q1"), ("assistant", heard), ("user", "q2"), ("assistant", SECOND)]
        await ask(s, "q3")
        assert reply_text(await _rest_of_turn(s)) == THIRD


class _Thawed(Heartbeat):
    """A heartbeat beating again after a break that began now (a process paused, then thawed)."""

    def __init__(self) -> None:
        self.alive_until = math.inf
        self.alive_since = time.monotonic()

    def stop(self) -> None:
        pass


async def test_after_a_break_in_its_heartbeat_an_owner_acts_on_nothing_until_its_lease_is_confirmed() -> None:
    async with LocalSession(agent) as s:
        runtime = s.runtime
        runtime.liveness = _Thawed()  # the others may have taken the session during the break
        said = UserTranscriptionReceived(content="are you there?")
        envelope = Envelope.wrap(s.session_id, said, source=Source.USER)
        with pytest.raises(NotOwner):
            await runtime.handle(envelope, said)
        assert runtime.counters["not_owner"] == 1
        runtime.lease_confirmed_at = time.monotonic()  # the next renewal found the lease still ours
        await runtime.handle(envelope, said)
        assert runtime.counters["not_owner"] == 1
