"""The bus message handed to routes, filters, conditions and interrupt handlers.

It mirrors Cartesia Line 0.1's ``Message`` (``.event``, ``.source``, ``.id``, ``.timestamp``) so
Line-style handlers run unchanged, and adds where the event sits in the session (session, turn,
seq, epoch) so handlers can reason about turns without reaching for the envelope.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from bargein.envelope import Envelope, decode, encode
from bargein.events import Event


@dataclass(frozen=True)
class Message:
    event: Event
    source: str = "user"
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    timestamp: float = field(default_factory=time.time)
    session: str = ""
    turn: int = 0
    seq: int = 0
    epoch: int = 0
    trace: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_envelope(cls, envelope: Envelope, event: Event) -> Message:
        return cls(
            event=event,
            source=envelope.source or "user",
            id=envelope.id,
            timestamp=envelope.ts,
            session=envelope.session,
            turn=envelope.turn,
            seq=envelope.seq,
            epoch=envelope.epoch,
            trace=dict(envelope.trace),
        )

    def to_envelope(self) -> Envelope:
        return Envelope(
            type=self.event.type_name(),
            session=self.session,
            turn=self.turn,
            seq=self.seq,
            epoch=self.epoch,
            ts=self.timestamp,
            id=self.id,
            source=self.source,
            trace=dict(self.trace),
            payload=self.event.to_payload(),
        )

    def encode(self) -> bytes:
        return encode(self.to_envelope())

    @classmethod
    def decode(cls, raw: bytes) -> Message:
        return cls.from_envelope(*decode(raw, max_bytes=len(raw)))
