"""``line.call_request``: what ``handle_new_call`` is told about the call, and what a pre-call handler
returns.

:class:`CallRequest` is bargein's, with Line's fields (``call_id``, ``from_``, ``to``,
``agent_call_id``, ``agent``: an :class:`AgentConfig`, ``metadata``) filled from the session start's
options; ``call_id`` (also ``session_id``) is the session id and ``options`` holds them all.
:class:`PreCallResult` keeps Line's shape for the ``pre_call_handler`` of
:class:`~bargein.line.voice_agent_app.VoiceAgentApp`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bargein.line.system import AgentConfig, CallRequest


@dataclass
class PreCallResult:
    """What a pre-call handler returns to accept a call: ``metadata`` is merged into the call
    request's metadata before ``handle_new_call`` runs. ``config`` was Line's per-call platform
    configuration (voice, transcription); bargein has no platform to hand it to and keeps it only
    so that handlers which fill it still run."""

    metadata: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)


__all__ = ["AgentConfig", "CallRequest", "PreCallResult"]
