"""Stopping background tasks (:mod:`bargein.tasks`) without losing the stopper's own cancellation.

The bug these catch: ``task.cancel()`` then ``suppress(CancelledError): await task`` swallows a
cancellation of the task doing the stopping too, so whoever cancelled *it* waits for ever (a
draining worker's partition keeper ran on while its drain waited for it).
"""

from __future__ import annotations

import asyncio

import pytest

from bargein import Bridge, ReasoningNode, SessionInfo, UserStoppedSpeaking
from bargein.agent.llm import ScriptedLLM
from bargein.tasks import cancel_and_wait
from bargein.testing import LocalSession


async def _forever() -> None:
    await asyncio.Event().wait()


async def _stubborn(stopping: asyncio.Event, release: asyncio.Event) -> None:
    """Takes its time to stop: the window in which its stopper may be cancelled."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        stopping.set()
        await release.wait()
        raise


async def test_the_stopped_tasks_cancellation_is_not_raised() -> None:
    tasks = [asyncio.create_task(_forever()) for _ in range(3)]
    await asyncio.sleep(0)
    await cancel_and_wait(*tasks, None)
    assert all(task.cancelled() for task in tasks)


async def test_an_exception_the_task_ended_with_is_raised() -> None:
    async def failing() -> None:
        raise ValueError("boom")

    task = asyncio.create_task(failing())
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="boom"):
        await cancel_and_wait(task)


async def test_a_stopper_cancelled_while_it_waits_ends_cancelled() -> None:
    stopping, release = asyncio.Event(), asyncio.Event()
    inner = asyncio.create_task(_stubborn(stopping, release))
    await asyncio.sleep(0)
    went_on = False

    async def stopper() -> None:
        nonlocal went_on
        await cancel_and_wait(inner)
        went_on = True  # a lost cancellation: the stopper runs on
        await asyncio.Event().wait()

    outer = asyncio.create_task(stopper())
    await stopping.wait()
    outer.cancel()
    release.set()
    async with asyncio.timeout(2):
        with pytest.raises(asyncio.CancelledError):
            await outer
    assert not went_on


async def test_clean_up_that_runs_while_its_task_is_cancelled_goes_on() -> None:
    cleaned: list[str] = []
    started = asyncio.Event()

    async def owner() -> None:
        helper = asyncio.create_task(_forever())
        other = asyncio.create_task(_forever())
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            await cancel_and_wait(helper)
            cleaned.append("helper")
            await cancel_and_wait(other)
            cleaned.append("other")

    task = asyncio.create_task(owner())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["helper", "other"]


def _talker(session: SessionInfo) -> Bridge:
    node = ReasoningNode(llm_client=ScriptedLLM(["one two three"], first_token_delay=0.005))
    bridge = Bridge(node)
    bridge.on(UserStoppedSpeaking).stream(node.generate).broadcast()
    return bridge


async def test_a_session_close_that_is_cancelled_ends_cancelled() -> None:
    """A session's close stops its dispatcher first: cancelled right then, the close must end
    cancelled (it ran on to the end before, and its caller's cancellation was lost)."""
    async with LocalSession(_talker) as s:
        runtime = s.runtime
        closing = asyncio.create_task(runtime.close())
        await asyncio.sleep(0)  # the close now waits for its dispatcher to stop
        closing.cancel()
        async with asyncio.timeout(2):
            with pytest.raises(asyncio.CancelledError):
                await closing
        assert not runtime.closed  # it stopped where it was cancelled
        await runtime.close()
