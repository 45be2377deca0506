"""Checkpoints of a session's nodes, as msgpack.

A node's state is its public plain-data attributes: numbers, strings, lists, dicts, events and
conversation contexts (the seed's ``StatefulInterruptNode`` keeps ``self.context.copy()`` in a dict).
Events and contexts travel as msgpack extension types resolved through the event registry, so
restoring a checkpoint builds only known, validated types.

Agents also keep state in objects of their own (Line's form-filling example keeps a form manager,
personal banking an ``Enum`` state and a pydantic context). Those are checkpointed *by example*: an
enum by its value, a pydantic model by its fields, any other object by its own checkpointable
attributes; restoring rebuilds them from the attribute the freshly built node has there (its type
is the one the agent's code created), so nothing is ever imported by name. Whatever is none of these
(clients, sockets, callables) is left out: the agent recreates it when it builds the session.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import operator
import os
import sys
import sysconfig
from dataclasses import dataclass
from typing import Any

import msgpack
from pydantic import BaseModel

from bargein.agent.context import ConversationContext
from bargein.agent.events import Event, event_type, is_registered, payload_of
from bargein.errors import BargeinError

log = logging.getLogger("bargein.runtime.snapshot")

_EXT_EVENT = 1
_EXT_CONTEXT = 2
_EXT_BY_EXAMPLE = 3  # (kind, data): rebuilt from the fresh node's attribute of the same name
_EXT_CONTEXT_SLICE = 4  # a context whose events are a stretch of a journaled list (journal.py)
_EXT_PACKED = 5  # a value packed already (to learn that it can be): the record holds its bytes
SNAPSHOT_VERSION = 3  # 2: long lists in the log beside the record (runtime/journal.py); 3: packed once
READABLE_VERSIONS = (1, 2, 3)
LONG_LIST = 1  # lists this long or longer are the journal's (journal.MIN_ITEMS): every one with items


class SnapshotError(BargeinError):
    """A checkpoint could not be read back."""


@dataclass(frozen=True)
class _ByExample:
    """State read back that needs the fresh attribute's type to become an object again."""

    kind: str  # "enum", "model" or "object"
    data: Any


@dataclass(frozen=True)
class ContextSlice:
    """A conversation context read back as a reference: its events are ``list[start:end]`` of the
    journaled list ``path``, which :func:`bargein.runtime.journal.read` puts back."""

    path: str
    start: int
    end: int
    system_prompt: str
    metadata: dict[str, Any]


def context_slice(path: str, start: int, end: int, context: ConversationContext) -> msgpack.ExtType:
    data = _pack([path, start, end, context.system_prompt, context.metadata])
    return msgpack.ExtType(_EXT_CONTEXT_SLICE, data)


def packed(value: Any) -> msgpack.ExtType:
    """``value`` for the record, packed now: ``TypeError``, ``ValueError`` or ``OverflowError`` if
    it cannot be. Whether a value can be packed is only known by packing it, so the bytes are kept
    rather than packed a second time with the record."""
    return msgpack.ExtType(_EXT_PACKED, _pack(value))


# Events packed by recent checkpoints, by identity: a session checkpoints several times a turn, and
# each time packed its whole history again (most of a checkpoint's cost). An event is packed again
# unless it is the very object packed before and every field still holds the very (immutable)
# value it held then, which an event changed in place does not.
_PACKED_EVENTS: dict[int, tuple[BaseModel, tuple[Any, ...], msgpack.ExtType]] = {}
PACKED_EVENTS_KEPT = 8192  # strong references: an id stays unique while its event is kept here
_IMMUTABLE = frozenset({str, int, float, bool, bytes, type(None)})
_SCALARS = frozenset({float, bool, bytes, type(None)})


def _event_ext(obj: BaseModel) -> msgpack.ExtType:
    values = tuple(obj.__dict__.values())
    known = _PACKED_EVENTS.get(id(obj))
    if (
        known is not None
        and known[0] is obj
        and len(known[1]) == len(values)
        and all(map(operator.is_, known[1], values))  # (the very values, compared in C)
    ):
        return known[2]
    ext = msgpack.ExtType(_EXT_EVENT, _pack([type(obj).__name__, payload_of(obj)]))
    if all(type(value) in _IMMUTABLE or isinstance(value, enum.Enum) for value in values):
        if len(_PACKED_EVENTS) >= PACKED_EVENTS_KEPT:
            with contextlib.suppress(RuntimeError, KeyError, StopIteration):  # another thread's loop
                del _PACKED_EVENTS[next(iter(_PACKED_EVENTS))]  # the oldest
        _PACKED_EVENTS[id(obj)] = (obj, values, ext)
    return ext


def _default(obj: Any) -> Any:
    if isinstance(obj, Event) or (isinstance(obj, BaseModel) and is_registered(type(obj))):
        return _event_ext(obj)
    if isinstance(obj, ConversationContext):
        return msgpack.ExtType(_EXT_CONTEXT, _pack([obj.events, obj.system_prompt, obj.metadata]))
    if isinstance(obj, tuple | set | frozenset):
        return list(obj)
    raise TypeError(f"cannot checkpoint {type(obj).__name__}")


MAX_OBJECT_DEPTH = 3  # objects inside objects inside a node, at most (and no cycles)


@functools.cache
def _agent_module(name: str) -> bool:
    """Whether module ``name`` is the agent's own code, not an installed library or the standard
    library (a client's innards are not the agent's state)."""
    module = sys.modules.get(name)
    where = getattr(module, "__file__", None)
    if where is None:
        return False
    path = os.path.realpath(where)
    libraries = {sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    return not any(root and path.startswith(os.path.realpath(root) + os.sep) for root in libraries)


def _by_example(value: Any, depth: int) -> _ByExample | None:
    """A value checkpointable only by example (see the module docstring), or None."""
    if isinstance(value, enum.Enum):
        kind, data = "enum", value.value
    elif isinstance(value, BaseModel):
        kind, data = "model", value.model_dump(mode="json")
    elif (
        depth < MAX_OBJECT_DEPTH
        and hasattr(value, "__dict__")
        and not callable(value)
        and not isinstance(value, type)
        and _agent_module(type(value).__module__)
    ):
        kind, data = "object", capture(value, depth + 1)
    else:
        return None
    try:
        _pack(data)
    except (TypeError, ValueError, OverflowError):
        return None
    return _ByExample(kind, data)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == _EXT_EVENT:
        name, fields = _unpack(data)
        return event_type(name).model_validate(fields)
    if code == _EXT_CONTEXT:
        events, system_prompt, metadata = _unpack(data)
        return ConversationContext(events=list(events), system_prompt=system_prompt, metadata=dict(metadata))
    if code == _EXT_BY_EXAMPLE:
        kind, state = _unpack(data)
        return _ByExample(kind, state)
    if code == _EXT_CONTEXT_SLICE:
        path, start, end, system_prompt, metadata = _unpack(data)
        return ContextSlice(str(path), int(start), int(end), str(system_prompt), dict(metadata))
    if code == _EXT_PACKED:
        return _unpack(data)
    raise SnapshotError(f"unknown extension type {code} in checkpoint")


def pack_item(obj: Any) -> bytes:
    """One value as the checkpoint holds it (a journaled list's item)."""
    return _pack(obj)


def unpack_item(data: bytes) -> Any:
    return _unpack(data)


def _pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, default=_default, use_bin_type=True, strict_types=False)
    return data


def _pack_by_example(value: _ByExample) -> msgpack.ExtType:
    return msgpack.ExtType(_EXT_BY_EXAMPLE, _pack([value.kind, value.data]))


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def capture(obj: object, depth: int = 0, *, long_lists: bool = True) -> dict[str, Any]:
    """The checkpointable public attributes of ``obj`` (a node, or an object a node keeps).
    ``long_lists=False``: lists of :data:`LONG_LIST` items or more, and conversation contexts, are
    passed through unchecked, for the journal to write item by item or as a stretch of such a list
    (a whole check would cost the whole history at every checkpoint)."""
    state: dict[str, Any] = {}
    for name, value in vars(obj).items():
        if name.startswith("_"):
            continue
        if (
            type(value) in _SCALARS
            or (type(value) is int and -(2**63) <= value < 2**64)
            or (type(value) is str and value.isascii())
        ):
            state[name] = value  # packs, always (another string may not: a lone surrogate)
            continue
        if not long_lists and (
            (type(value) is list and len(value) >= LONG_LIST) or type(value) is ConversationContext
        ):
            state[name] = value  # the journal's to write (or to check and leave in the record)
            continue
        try:
            state[name] = packed(value)
        except (TypeError, ValueError, OverflowError):
            example = _by_example(value, depth)
            if example is None:
                skipped(type(obj).__name__, name, type(value).__name__)
                continue
            state[name] = _pack_by_example(example)
    return state


@functools.cache
def skipped(owner: str, name: str, kind: str) -> None:
    log.info("not checkpointing %s.%s (a %s): a new owner gets the one the agent builds", owner, name, kind)


def restore(obj: object, state: dict[str, Any]) -> None:
    for name, value in state.items():
        if isinstance(value, _ByExample):
            rebuilt = _rebuild(getattr(obj, name, None), value)
            if rebuilt is _MISSING:
                log.warning(
                    "cannot restore %s.%s: the freshly built one is not a %s",
                    type(obj).__name__,
                    name,
                    value.kind,
                )
                continue
            value = rebuilt
        setattr(obj, name, value)


_MISSING = object()


def _rebuild(fresh: Any, saved: _ByExample) -> Any:
    """``saved`` as an object of the fresh attribute's type (``_MISSING`` if that cannot be)."""
    try:
        if saved.kind == "enum" and isinstance(fresh, enum.Enum):
            return type(fresh)(saved.data)
        if saved.kind == "model" and isinstance(fresh, BaseModel):
            return type(fresh).model_validate(saved.data)
        if saved.kind == "object" and hasattr(fresh, "__dict__") and isinstance(saved.data, dict):
            restore(fresh, saved.data)
            return fresh
    except (ValueError, TypeError) as exc:
        log.warning("cannot restore a %s from its checkpoint: %s", type(fresh).__name__, exc)
    return _MISSING


def dumps(snapshot: dict[str, Any]) -> bytes:
    return _pack({"v": SNAPSHOT_VERSION, **snapshot})


def loads(data: bytes) -> dict[str, Any]:
    try:
        snapshot = _unpack(data)
    except SnapshotError:
        raise
    except Exception as exc:
        raise SnapshotError(f"unreadable checkpoint: {type(exc).__name__}: {exc}") from None
    if not isinstance(snapshot, dict) or snapshot.get("v") not in READABLE_VERSIONS:
        raise SnapshotError("checkpoint has an unknown layout")
    return snapshot
