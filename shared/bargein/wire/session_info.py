"""The session record: what the edge says about a session when it creates it.

It travels as the session start on each tier's work queue and sits in that tier's session directory
(so an orphan can be adopted), and it is what an agent is told about the session it builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgpack

from bargein.errors import EnvelopeError, InvalidEnvelope
from bargein.wire.envelope import validate_session_id


@dataclass
class SessionInfo:
    """What an agent is told about the session it is building."""

    session_id: str
    options: dict[str, Any] = field(default_factory=dict)
    # True when a client edge reports delivery (SpeechDelivered); then only reported chunks count
    # as heard. Without an edge the record of what was published stands in.
    edge_reports_delivery: bool = False
    # Turns the caller has had already, when an edge gave the session back after Redis lost its
    # records together with its owner (edge/records.py): its turns are numbered after them, or the
    # edge would take the new answers for the old ones and drop them.
    turns_before: int = 0

    @property
    def id(self) -> str:
        return self.session_id

    def encode(self) -> bytes:
        record: dict[str, Any] = {
            "session_id": self.session_id,
            "options": self.options,
            "edge_reports_delivery": self.edge_reports_delivery,
        }
        if self.turns_before:
            record["turns_before"] = self.turns_before
        data: bytes = msgpack.packb(record, use_bin_type=True)
        return data

    @classmethod
    def decode(cls, raw: bytes) -> SessionInfo:
        """A session start from the work queue; :class:`InvalidEnvelope` if it is not one."""
        try:
            data = msgpack.unpackb(raw, raw=False)
            info = cls(
                session_id=validate_session_id(data["session_id"]),
                options=dict(data.get("options") or {}),
                edge_reports_delivery=bool(data.get("edge_reports_delivery", False)),
                turns_before=int(data.get("turns_before", 0)),
            )
        except EnvelopeError:
            raise
        except Exception as exc:
            raise InvalidEnvelope(f"not a session start: {type(exc).__name__}: {exc}") from None
        return info
