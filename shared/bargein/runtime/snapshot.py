"""Checkpoints of a session's nodes, as msgpack.

A node's state is its public plain-data attributes: numbers, strings, lists, dicts, events and
conversation contexts (the seed's ``StatefulInterruptNode`` keeps ``self.context.copy()`` in a dict).
Events and contexts travel as msgpack extension types resolved through the event registry, so
restoring a checkpoint builds only known, validated types. Attributes that are not plain data
(clients, sockets, callables) are left out: the agent recreates them when it builds the session.
"""

from __future__ import annotations

import logging
from typing import Any

import msgpack
from pydantic import BaseModel

from bargein.agent.context import ConversationContext
from bargein.agent.events import Event, event_type, is_registered, payload_of
from bargein.errors import BargeinError

log = logging.getLogger("bargein.runtime.snapshot")

_EXT_EVENT = 1
_EXT_CONTEXT = 2
SNAPSHOT_VERSION = 1


class SnapshotError(BargeinError):
    """A checkpoint could not be read back."""


def _default(obj: Any) -> Any:
    if isinstance(obj, Event) or (isinstance(obj, BaseModel) and is_registered(type(obj))):
        return msgpack.ExtType(_EXT_EVENT, _pack([type(obj).__name__, payload_of(obj)]))
    if isinstance(obj, ConversationContext):
        return msgpack.ExtType(_EXT_CONTEXT, _pack([obj.events, obj.system_prompt, obj.metadata]))
    if isinstance(obj, tuple | set | frozenset):
        return list(obj)
    raise TypeError(f"cannot checkpoint {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_EVENT:
        name, fields = _unpack(data)
        return event_type(name).model_validate(fields)
    if code == _EXT_CONTEXT:
        events, system_prompt, metadata = _unpack(data)
        return ConversationContext(events=list(events), system_prompt=system_prompt, metadata=dict(metadata))
    raise SnapshotError(f"unknown extension type {code} in checkpoint")


def _pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, default=_default, use_bin_type=True, strict_types=False)
    return data


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def capture(obj: object) -> dict[str, Any]:
    """The checkpointable public attributes of ``obj`` (a node)."""
    state: dict[str, Any] = {}
    for name, value in vars(obj).items():
        if name.startswith("_"):
            continue
        try:
            _pack(value)
        except (TypeError, ValueError, OverflowError):
            log.debug("not checkpointing %s.%s (%s)", type(obj).__name__, name, type(value).__name__)
            continue
        state[name] = value
    return state


def restore(obj: object, state: dict[str, Any]) -> None:
    for name, value in state.items():
        setattr(obj, name, value)


def dumps(snapshot: dict[str, Any]) -> bytes:
    return _pack({"v": SNAPSHOT_VERSION, **snapshot})


def loads(data: bytes) -> dict[str, Any]:
    try:
        snapshot = _unpack(data)
    except SnapshotError:
        raise
    except Exception as exc:
        raise SnapshotError(f"unreadable checkpoint: {type(exc).__name__}: {exc}") from None
    if not isinstance(snapshot, dict) or snapshot.get("v") != SNAPSHOT_VERSION:
        raise SnapshotError("checkpoint has an unknown layout")
    return snapshot
