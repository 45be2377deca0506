"""The lists a session's nodes keep (their conversation history above all), checkpointed as a log.

A node's history grows by a few events a turn and is otherwise left alone, yet a checkpoint that
serialises every attribute whole costs more with every turn of the call: at turn 1,000 each
checkpoint would write (and first serialise) a thousand turns. So the lists a node keeps at its top
level leave the checkpoint record and go to a *log* beside it (``LogChange``: per list, how many of
its items stay as they were and which come after them), written in the same atomic, epoch-fenced
store call as the record. A checkpoint then costs what changed since the last one: usually a turn's
new events; after a barge-in cut the answer's last events, rewritten.

What "changed" means. The journal keeps, per list, the items as last written (references, not
copies) and compares the list now with them item by item (identity first, in C): the first item
that differs, or was removed, and everything after it, is written again. An item replaced, inserted
or removed is seen; an item *changed in place* (``events[3].content = ...``) is not, and keeps its
old value in the log until the list changes before it. bargein's own nodes only ever replace items
(events are values); an agent that edits an item in place should replace it instead.

Restoring reads the record and the log, and puts each list back whole (:func:`rebuild`); the
journal then starts from what it restored, so the new owner's first checkpoint appends too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from bargein.agent.context import ConversationContext
from bargein.runtime import snapshot
from bargein.transport.abc import ListChange, LogChange, StateStore, parse_field
from bargein.wire.names import Tier

Pack = Callable[[Any], bytes]
Unpack = Callable[[bytes], Any]
Lists = dict[str, list[Any]]  # "node_id.attribute" → the list

MIN_ITEMS: Final = snapshot.LONG_LIST  # an empty list stays in the record: it has no items to log


@dataclass
class Journal:
    """One session's lists as last written: which are journaled, and their items then."""

    paths: list[str] = field(default_factory=list)  # "node_id.attribute", by log index
    _written: dict[str, list[Any]] = field(default_factory=dict)

    def take(
        self, nodes: dict[str, dict[str, Any]], pack: Any
    ) -> tuple[dict[str, int], LogChange, dict[str, list[Any]]]:
        """Move the long lists out of ``nodes`` (the captured node states, changed in place):
        their lengths by path for the record, what to write to the log, and the lists as they are
        now (:meth:`written` once the store took them). ``pack`` packs one item, raising
        ``TypeError`` or ``ValueError`` when it cannot: such a list stays in the record."""
        lengths: dict[str, int] = {}
        changes: list[ListChange] = []
        now: dict[str, list[Any]] = {}
        for node_id, attrs in nodes.items():
            for name, value in list(attrs.items()):
                if type(value) is not list or len(value) < MIN_ITEMS:
                    continue
                path = f"{node_id}.{name}"
                before = self._written.get(path, [])
                keep = _common_prefix(before, value)
                try:
                    items = tuple(pack(item) for item in value[keep:])
                except (TypeError, ValueError, OverflowError):
                    del attrs[name]  # as the record leaves out what it cannot hold
                    snapshot.skipped(node_id, name, "list of what cannot be checkpointed")
                    continue
                if path not in self.paths:
                    self.paths.append(path)
                if items or keep != len(before):
                    changes.append(ListChange(self.paths.index(path), keep, len(before), items))
                lengths[path] = len(value)
                now[path] = list(value)  # as written now: the node may change it while the store writes
                del attrs[name]
            for name, value in list(attrs.items()):
                if type(value) is ConversationContext:
                    attrs[name] = _context(
                        node_id, name, value, {p: now[p] for p in now if p.startswith(f"{node_id}.")}
                    )
        return lengths, LogChange(tuple(changes)), now

    def written(self, lists: dict[str, list[Any]]) -> None:
        """The store took the change: these are the lists as the log now holds them."""
        self._written.update(lists)

    def forget_written(self) -> None:
        """The log was lost: the next change writes every list from its first item (the paths keep
        their places: the record names them so)."""
        self._written.clear()

    def restored(self, paths: list[str], lists: Lists) -> None:
        self.paths = list(paths)
        self._written = {path: list(value) for path, value in lists.items()}

    def record(self, lengths: dict[str, int]) -> dict[str, Any]:
        """What the checkpoint record says of the log (read back by :func:`read`)."""
        return {"paths": list(self.paths), "lengths": lengths}


async def read(store: StateStore, tier: Tier, session: str) -> tuple[dict[str, Any], Journal] | None:
    """A session's checkpoint as it was taken, its journaled lists back in their nodes' states; and
    the journal to carry on from. None if there is none; :class:`SnapshotError` if unreadable."""
    data = await store.load_state(tier, session)
    if data is None:
        return None
    state = snapshot.loads(data)
    journal = Journal()
    record = state.pop("journal", None)
    if record is None:  # written before the log existed: every list is in the record
        return state, journal
    try:
        paths, lengths = list(record["paths"]), dict(record["lengths"])
        lists = rebuild(paths, lengths, await store.load_log(tier, session), snapshot.unpack_item)
    except (KeyError, TypeError, ValueError) as exc:
        raise snapshot.SnapshotError(f"unreadable checkpoint log: {exc}") from None
    nodes = state.setdefault("nodes", {})
    for path, items in lists.items():
        node_id, _, name = path.rpartition(".")
        nodes.setdefault(node_id, {})[name] = items
    for attrs in nodes.values():
        for name, value in list(attrs.items()):
            if isinstance(value, snapshot.ContextSlice):
                if value.path not in lists:
                    raise snapshot.SnapshotError(f"a context refers to {value.path}, which the log lacks")
                events = lists[value.path][value.start : value.end]
                attrs[name] = ConversationContext(
                    events=events, system_prompt=value.system_prompt, metadata=dict(value.metadata)
                )
    journal.restored(paths, lists)
    return state, journal


SLICE_SEARCH: Final = 256  # how far back from a list's end its stretch may start (then: whole)


def _context(node_id: str, name: str, context: ConversationContext, lists: Lists) -> Any:
    """A node's conversation context in the record: a reference to the stretch of one of the node's
    journaled lists its events are (a reasoning node's running context is the last turns of its
    history), else the context itself, packed, if it can be checkpointed at all (else it is left out)."""
    events = context.events
    for path, items in lists.items():
        if not events or len(events) > len(items):
            continue
        first = events[0]
        for start in range(len(items) - len(events), max(-1, len(items) - len(events) - SLICE_SEARCH), -1):
            if items[start] is first and items[start : start + len(events)] == events:
                return snapshot.context_slice(path, start, start + len(events), context)
    try:
        return snapshot.packed(context)
    except (TypeError, ValueError, OverflowError):
        snapshot.skipped(node_id, name, "ConversationContext that cannot be checkpointed")
        return None


def _common_prefix(before: list[Any], now: list[Any]) -> int:
    """How many leading items ``now`` shares with ``before`` (by identity, or equal)."""
    n = min(len(before), len(now))
    if now[:n] == before[:n]:  # the usual case, in C: the history only grew
        return n
    for i in range(n):
        if now[i] is not before[i] and now[i] != before[i]:
            return i
    return n


def rebuild(
    paths: list[str], lengths: dict[str, int], log: dict[bytes, bytes], unpack: Any
) -> dict[str, list[Any]]:
    """The journaled lists from the log, whole; ``ValueError`` if the log lacks an item of them."""
    slots: dict[int, dict[int, bytes]] = {}
    for field_name, data in log.items():
        index, position = parse_field(field_name)
        slots.setdefault(index, {})[position] = data
    lists: dict[str, list[Any]] = {}
    for name, length in lengths.items():
        items = slots.get(paths.index(name), {})
        try:
            lists[name] = [unpack(items[position]) for position in range(length)]
        except KeyError as missing:
            raise ValueError(f"the log lacks item {missing} of {name} ({length} recorded)") from None
    return lists
