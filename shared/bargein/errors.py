"""Typed errors, so callers can tell a bad message from a bad route from a bad setting."""

from __future__ import annotations


class BargeinError(Exception):
    """Base of every error bargein raises on purpose."""


class SettingsError(BargeinError):
    """A ``BARGEIN_*`` variable has a value that cannot be used."""


class TurnTakingError(SettingsError):
    """A session's ``turn_taking`` options are not usable; the message names every problem."""


class RouteError(BargeinError, TypeError):
    """A route was declared wrongly; raised when the route is declared, not when it first runs."""


class EnvelopeError(BargeinError, ValueError):
    """A message from the bus could not be accepted. ``reason`` is a short stable code for counters
    and the dead-letter header."""

    reason = "invalid"


class UndecodableMessage(EnvelopeError):
    reason = "undecodable"


class MessageTooLarge(EnvelopeError):
    reason = "too_large"


class UnknownEventType(EnvelopeError):
    reason = "unknown_type"


class InvalidSessionId(EnvelopeError):
    reason = "bad_session"


class InvalidEnvelope(EnvelopeError):
    reason = "bad_envelope"


class BrokerUnavailable(BargeinError):
    """The broker could not take a message within the time a publisher waits: it was away (a
    restart), or a queue on the way stayed full (its consumer overloaded)."""


class QueueFull(BargeinError):
    """The broker refused a message because a queue it goes to is at its length limit."""


class UnroutableError(BargeinError):
    """A control message matched no queue: nobody would have received the interrupt."""


class NotOwner(BargeinError):
    """This process may no longer own the session (it was paused past its lease, say): the message it
    was handed is not handled here but goes back to the mailbox, for the owner."""


class StaleEpochError(BargeinError):
    """A write carried an owner epoch older than the session's current lease: the writer was fenced."""


class TranscriberBehind(BargeinError):
    """A speech-to-text engine has more work waiting than it can do in time: asked now, it says so
    at once rather than queue. The speech session goes on by timing alone and tells the client
    (``stt_behind``)."""


class SessionRejected(BargeinError):
    """The agent declined this session when it started (Line's ``pre_call_handler`` returned None).
    The session ends for every tier, the client is told (``ended``, reason ``rejected``), and no
    other process retries it."""

    end_reason = "rejected"


class AgentFailedToStart(SessionRejected):
    """Building the agent for this session raised (a bad option, a bug in ``handle_new_call``): the
    session ends like a rejected one, the client is told why (an ``agent_error`` frame), and no
    process retries it for ever."""

    end_reason = "agent failed to start"
