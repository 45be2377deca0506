"""Stopping a background task without swallowing the stopper's own cancellation.

The usual idiom, ``task.cancel()`` then ``with suppress(CancelledError): await task``, has a hole:
if the task *running* that idiom is itself cancelled while it waits, the ``CancelledError`` it
receives is suppressed too, and its cancellation is lost. Its caller, which awaits it after
cancelling it, then waits for ever. Measured here: a reasoning worker told to drain cancelled its
partition keeper while the keeper was closing sessions it was handing over; a session's close was
waiting for its dispatcher, swallowed the keeper's cancellation, and the keeper ran on, so the drain
never ended (the process logged "(draining)" until it was killed: the fault suite's hand-over test,
once in a few CI runs). :func:`cancel_and_wait` lets the stopped task's cancellation end quietly and
re-raises the stopper's.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel each of ``tasks`` (None is skipped) and wait until all have ended. Their cancellation
    is expected and not raised; an exception one of them ended with (one that had finished already
    too) is raised, as awaiting it would. If the caller is cancelled while it waits, it raises
    ``CancelledError`` as any await would (the rest are cancelled, and not waited for); one whose
    cancellation began before (this call in its ``finally`` block, say) goes on with its clean-up."""
    current = asyncio.current_task()
    # (counted, not just asked: cleanup that runs while the caller is being cancelled already,
    # a ``finally`` block, must still be able to stop its tasks and go on)
    cancels_before = current.cancelling() if current is not None else 0
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    for task in running:
        try:
            await task
        except asyncio.CancelledError:
            if current is not None and current.cancelling() > cancels_before:
                raise  # the caller was cancelled meanwhile: never ours to swallow
