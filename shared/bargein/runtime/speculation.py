"""A turn started before the caller's turn is sure: what it holds back, and how it is undone.

The speech tier sends :class:`~bargein.agent.events.SpeculativeTurn` when the caller pauses and may
have finished; :class:`~bargein.runtime.session.SessionRuntime` then dispatches the turn's usual
events (the words, then :class:`~bargein.agent.events.UserStoppedSpeaking`) at once, under a
:class:`Speculation`:

* everything the session would send (its output, its notices, what its own bridges would hear of
  it) is *held* (:meth:`Speculation.hold`), in order, and nothing is checkpointed: the durable
  record stays what it was before, so an owner that dies meanwhile leaves nothing of it behind;
* the turn's usual end with the same words *confirms* it: the held actions run at once, in order,
  and the session is checkpointed (its state is now real);
* anything else *drops* it: the speculative work is discarded in every route (a running turn is
  cancelled without a handler or a notice), and the nodes are put back as they were, from the
  copy taken at the start (:func:`save_nodes` / :func:`restore_nodes`: the checkpoint's own codec,
  so exactly what a new owner would have restored, and what each node keeps besides,
  :meth:`~bargein.agent.nodes.Node.private_state`: a reasoning node's cut-off answers); the turn
  numbers it took are given back (all it sent was held, so nobody saw them), and the next turn has
  the number it would have had.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from bargein.agent.message import Message
from bargein.agent.nodes import Node
from bargein.runtime import snapshot

Action = Callable[[], Awaitable[None]]


@dataclass
class Speculation:
    transcript: str  # the words it started with: the confirmation must bring the same
    from_index: int  # the dispatch index of its first event: what is undone is from here on
    last_turn: int  # the session's turn counter before it: numbers it took go back (nobody saw them)
    saved: SavedNodes  # the nodes as they were
    told: dict[int, int]  # what the bridges had been told of each turn (DeliveryLedger.told)
    held: list[Action] = field(default_factory=list)  # what goes out if it is confirmed, in order
    reports: list[Message] = field(default_factory=list)  # delivery reports applied meanwhile
    words_confirmed: bool = False  # the same words came again: the stop that follows confirms it

    def hold(self, action: Action) -> None:
        self.held.append(action)


@dataclass(frozen=True)
class SavedNodes:
    """The nodes as they were: their checkpointed state, packed, and what each keeps besides."""

    packed: bytes
    private: dict[str, object]


def save_nodes(nodes: Sequence[Node]) -> SavedNodes:
    packed = snapshot.dumps({"nodes": {node.id: snapshot.capture(node) for node in nodes if node.id}})
    return SavedNodes(packed, {node.id: node.private_state() for node in nodes if node.id})


def restore_nodes(nodes: Sequence[Node], saved: SavedNodes) -> None:
    state = snapshot.loads(saved.packed)["nodes"]
    for node in nodes:
        if node.id in state:
            snapshot.restore(node, state[node.id])
        if node.id in saved.private:
            node.restore_private_state(saved.private[node.id])
