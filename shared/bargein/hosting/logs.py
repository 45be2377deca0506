"""Logging set-up for the services and commands: one line per record, at the configured level.

``BARGEIN_LOG_FORMAT``: ``json`` (one JSON object a line, through python-json-logger, for log
collectors), ``text`` (for people), or ``auto``, the default: text on a terminal, JSON elsewhere
(a container, a file). Every record carries the session and the turn it concerns and the current
trace id, when there are any (:data:`bargein.tracing.SESSION`, :data:`~bargein.tracing.TURN`).
"""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

from bargein import tracing

TEXT_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s"
JSON_FIELDS = "{asctime}{levelname}{name}{message}"
JSON_NAMES = {"asctime": "time", "levelname": "level", "name": "logger"}


class _Context(logging.Filter):
    """Adds ``session``, ``turn`` and ``trace_id`` to every record (None when there is none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.session = getattr(record, "session", None) or tracing.SESSION.get()
        record.turn = getattr(record, "turn", None) or tracing.TURN.get()
        record.trace_id = tracing.trace_id()
        return True


def configure_logging(level: str = "INFO", fmt: str = "auto") -> None:
    """Log at ``level``, as ``fmt`` says (``auto``: JSON unless stderr is a terminal)."""
    handler = logging.StreamHandler()
    handler.addFilter(_Context())
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    if as_json:
        handler.setFormatter(
            JsonFormatter(
                JSON_FIELDS,
                style="{",
                rename_fields=JSON_NAMES,
                datefmt="%Y-%m-%dT%H:%M:%S%z",
                defaults={"session": None, "turn": None, "trace_id": None},
            )
        )
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT, datefmt="%H:%M:%S"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    logging.getLogger("aiormq").setLevel(logging.WARNING)
    logging.getLogger("aio_pika").setLevel(logging.WARNING)
