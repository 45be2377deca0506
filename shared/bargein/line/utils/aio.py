"""``line.utils.aio``: waiting for and cancelling groups of asyncio tasks without losing errors.

Stopping a node's background tasks has two ways of going wrong: a cancellation is mistaken for a
failure (and the shutdown raises), or a real failure in one task is swallowed because another was
cancelled. These helpers wait for every task, treat cancellation as the expected outcome and raise
the real errors together as one :class:`ExceptionGroup`.

Tasks that are already done when they are passed in are skipped, as in Line: their outcome was
the business of whoever awaited them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any, TypeAlias

__all__ = ["await_tasks_safe", "cancel_tasks_safe"]

Tasks: TypeAlias = asyncio.Task[Any] | Collection[asyncio.Task[Any] | None]
"""One task or several (``None`` entries are ignored, as Line ignored falsy ones)."""


def _pending(tasks: Tasks) -> list[asyncio.Task[Any]]:
    group: Collection[asyncio.Task[Any] | None] = [tasks] if isinstance(tasks, asyncio.Task) else tasks
    return [task for task in group if task is not None and not task.done()]


async def _settle(tasks: list[asyncio.Task[Any]], doing: str) -> None:
    """Wait for all of ``tasks``; raise what they raised other than cancellation."""
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    # CancelledError is a BaseException, not an Exception: a cancelled task is not an error here.
    errors = [outcome for outcome in outcomes if isinstance(outcome, Exception)]
    if errors:
        raise ExceptionGroup(f"{len(errors)} of {len(tasks)} tasks failed while {doing}", errors)


async def cancel_tasks_safe(tasks: Tasks) -> None:
    """Cancel the tasks that are still running and wait until each has finished.

    Raises an :class:`ExceptionGroup` of the errors the tasks raised while unwinding (a task that
    catches the cancellation and then fails, say); cancellation itself is not an error.
    """
    pending = _pending(tasks)
    for task in pending:
        task.cancel()  # idempotent: a task cancelled twice is cancelled once
    await _settle(pending, "being cancelled")


async def await_tasks_safe(tasks: Tasks) -> None:
    """Wait for the tasks that are still running to finish, without cancelling them.

    A task that gets cancelled meanwhile counts as finished; an :class:`ExceptionGroup` of the errors
    the others raised is raised once all are done.
    """
    pending = _pending(tasks)
    await _settle(pending, "being awaited")
