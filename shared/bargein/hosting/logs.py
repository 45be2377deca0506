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


class _HandledBrokerLoss(logging.Filter):
    """Drops aiormq's and aio-pika's own reports of a lost broker connection and of the failed
    attempts to reconnect: a robust connection recovers from those by design, and the transport
    says so once, as a warning naming RabbitMQ, and again when it is back (an operator's alert on
    ERROR must not fire for an outage the services handle). Their other records pass unchanged.
    Any other callback that fails still shows as an error."""

    # the libraries' own message templates, from aiormq.connection and aio_pika.robust_connection
    TEMPLATES = (
        "Unexpected connection close from remote",
        "error when creating transport",
        "Cancelling cause reader exited abnormally",
        "Connection attempt to",
        "Reconnect attempt failed",
    )
    # what a channel callback raises when its connection is gone (aio_pika.tools)
    CLOSED = {"ChannelInvalidStateError", "AMQPConnectionError", "ConnectionClosed", "ChannelClosed"}

    def filter(self, record: logging.LogRecord) -> bool:
        template = str(record.msg)
        if template.startswith(self.TEMPLATES):
            return False
        if (
            template.startswith("Callback %r error")
            and isinstance(record.args, tuple)
            and len(record.args) > 1
        ):
            callback, error = record.args[0], record.args[1]
            # a robust channel's own close handler fails while its connection is down (it reopens
            # when the connection is back), and any callback fails with a closed connection's error
            return not ("RobustChannel._on_close" in repr(callback) or error in self.CLOSED)
        return True


# the loggers that report a broker connection's loss (a logger's filter sees only its own records)
BROKER_LOGGERS = ("aiormq.connection", "aio_pika.robust_connection", "aio_pika.tools")


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
    for name in BROKER_LOGGERS:
        library = logging.getLogger(name)
        if not any(isinstance(f, _HandledBrokerLoss) for f in library.filters):
            library.addFilter(_HandledBrokerLoss())
