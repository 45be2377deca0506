"""What the running turn tells the code it runs.

A node that is cut off mid-answer must record only what the caller received, and only the runtime
knows that (the edge reports delivery by turn and seq). Rather than have nodes reach into the
runtime, the runtime sets the current turn here, in the turn's own task, and nodes ask
:func:`current_run`. Outside a runtime (a node driven by hand in a unit test) there is none.
"""

from __future__ import annotations

import contextvars
from typing import Protocol


class RunningTurn(Protocol):
    """The view of a route run that agent code gets."""

    @property
    def turn(self) -> int | None:
        """The turn number, once the run has one (streaming routes get it when they start)."""

    def delivered_text(self) -> str:
        """The text of this turn the caller has received so far."""


_CURRENT: contextvars.ContextVar[RunningTurn | None] = contextvars.ContextVar("bargein_run", default=None)


def current_run() -> RunningTurn | None:
    """The route run the calling code belongs to (None outside a runtime)."""
    return _CURRENT.get()


def set_current_run(run: RunningTurn | None) -> contextvars.Token[RunningTurn | None]:
    """Called by the runtime as a run starts; :func:`reset_current_run` undoes it."""
    return _CURRENT.set(run)


def reset_current_run(token: contextvars.Token[RunningTurn | None]) -> None:
    _CURRENT.reset(token)
