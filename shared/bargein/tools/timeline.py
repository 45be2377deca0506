"""A live, human-readable timeline of a conversation, for ``bargein demo`` (and later ``bargein call``).

Each line is stamped with the seconds since the start; the agent's streamed text is printed as it
arrives on one line, and log records from the agent and the runtime are folded in between, so a
reader sees the barge-in, the cancellation and the handler in the order they happened.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO


class Timeline:
    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.t0 = time.monotonic()
        self._streaming = False

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _stamp(self) -> str:
        return f"[{self.elapsed():6.2f}s]"

    def line(self, who: str, text: str) -> None:
        self.end_stream()
        print(f"{self._stamp()} {who:<7} {text}", file=self.out, flush=True)

    def stream(self, text: str) -> None:
        if not self._streaming:
            print(f"{self._stamp()} {'agent':<7} ", end="", file=self.out)
            self._streaming = True
        print(text, end="", file=self.out, flush=True)

    def end_stream(self) -> None:
        if self._streaming:
            print(file=self.out, flush=True)
            self._streaming = False


class TimelineLogHandler(logging.Handler):
    """Shows log records as timeline lines (who = the logger's last name part)."""

    def __init__(self, timeline: Timeline) -> None:
        super().__init__()
        self.timeline = timeline

    def emit(self, record: logging.LogRecord) -> None:
        who = record.name.rsplit(".", 1)[-1]
        self.timeline.line(f"· {who}", record.getMessage())
