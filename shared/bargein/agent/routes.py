"""The route DSL: ``bridge.on(Event).interrupt_on(...).stream(fn).broadcast()``.

A :class:`Bridge` ties a node to the routes that feed it. A :class:`Route` is a little pipeline
(map / filter / stream / broadcast) started by matching events, plus the events that interrupt,
suspend or resume it. This module only records and validates what was declared, so a wrong route
fails where it is written; :mod:`bargein.runtime.executor` runs routes in a session.

Interrupt semantics (Line's, with its documented-but-broken forms made real): when an interrupt event
arrives while the route is running and its condition holds, the running turn is cancelled (the
generator sees ``CancelledError`` at its current await), nothing more of that turn is published,
triggers queued before the interrupt are dropped, the handler runs after the turn has unwound, and
the route's next turn starts only after the handler has returned.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bargein.agent.calling import call_flexible, check_callable, is_generator_function
from bargein.agent.events import Event
from bargein.agent.message import Message
from bargein.agent.nodes import Node
from bargein.errors import RouteError

EventSpec = type[Event] | Sequence[type[Event]]
# Keyword filters on these names test the bus message (as Line's did), not the event's fields.
MESSAGE_FILTERS = frozenset({"id", "source", "timestamp"})
Callback = Callable[..., Any]
StepKind = Literal["map", "filter", "stream", "broadcast"]


def event_types(spec: Any, what: str) -> tuple[type[Event], ...]:
    items = list(spec) if isinstance(spec, list | tuple | set | frozenset) else [spec]
    if not items:
        raise RouteError(f"{what} needs at least one event type")
    for item in items:
        if not (isinstance(item, type) and issubclass(item, Event)):
            raise RouteError(f"{what} takes Event subclasses (or a list of them), got {item!r}")
    return tuple(items)


@dataclass(frozen=True)
class Step:
    kind: StepKind
    fn: Any
    # bargein's .map() ends the run on None; Line's passed None on (a broadcast then skips it)
    stops_on_none: bool = True


@dataclass(frozen=True)
class Clause:
    """One interrupt_on / suspend_on / resume_on clause."""

    types: tuple[type[Event], ...]
    handler: Callback | None
    condition: Callback | None = None


class Matcher:
    """Which events start a route: types, an optional filter, and Line-style property filters."""

    def __init__(
        self, types: tuple[type[Event], ...], filter_fn: Callback | None, properties: dict[str, Any]
    ) -> None:
        for name in properties:
            if name in MESSAGE_FILTERS:
                continue
            missing = [t.__name__ for t in types if name not in t.model_fields]
            if missing:
                raise RouteError(f"field filter {name!r}: {', '.join(missing)} has no field {name!r}")
        self.types = types
        self.filter_fn = check_callable(filter_fn, "filter", allow_zero=False) if filter_fn else None
        self.properties = properties

    async def matches(self, message: Message) -> bool:
        if not isinstance(message.event, self.types):
            return False
        for name, expected in self.properties.items():
            value = getattr(message if name in MESSAGE_FILTERS else message.event, name, None)
            ok = expected(value) if callable(expected) else value == expected
            if not ok:
                return False
        if self.filter_fn is not None:
            return bool(await call_flexible(self.filter_fn, message))
        return True


class Bridge:
    """Connects one node to the session's events through routes."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.routes: list[Route] = []
        self.authorized: set[str] | None = None

    def on(
        self,
        event: EventSpec,
        filter: Callback | None = None,
        *,
        filter_fn: Callback | None = None,
        **property_filters: Any,
    ) -> Route:
        """Start a route on ``event`` (a type or a list of types).

        ``filter``/``filter_fn`` (the same thing; the second is Line's name) receives the message;
        keyword arguments compare event fields to a literal or pass them to a predicate.
        """
        if filter is not None and filter_fn is not None:
            raise RouteError("give filter= or filter_fn=, not both")
        matcher = Matcher(event_types(event, "Bridge.on"), filter or filter_fn, property_filters)
        route = Route(self, matcher)
        self.routes.append(route)
        return route

    def routes_to_run(self) -> list[Route]:
        """The routes a session runs for this bridge (a Line bridge keeps more, for Line's own
        in-process engine, than the runtime should run)."""
        return self.routes

    def authorize(self, *node_ids: str) -> Bridge:
        """Accept events broadcast by these nodes (Line's API). Until called, a bridge accepts all."""
        self.authorized = (self.authorized or set()) | set(node_ids)
        return self

    def accepts(self, message: Message) -> bool:
        """Whether this bridge hears ``message``: everything from the caller's side, and what the
        authorized nodes broadcast (all nodes, until :meth:`authorize` is called)."""
        return self.authorized is None or message.from_caller_side or message.source in self.authorized


class Route:
    """A pipeline started by matching events. Build it by chaining; every method returns the route."""

    def __init__(self, bridge: Bridge, matcher: Matcher) -> None:
        self.bridge = bridge
        self.matcher = matcher
        self.steps: list[Step] = []
        self.interrupts: list[Clause] = []
        self.suspends: list[Clause] = []
        self.resumes: list[Clause] = []
        # Line ran every message through a route as a task of its own, so a slow .map() (a debounce
        # that sleeps) never held up the next message; bargein's routes take them in order
        self.concurrent = False

    # --- the DSL ---------------------------------------------------------------------------------

    def on(self, event: EventSpec, filter: Callback | None = None, **kwargs: Any) -> Route:
        """Start another route on the same bridge (Line allowed chaining ``.on`` from a route)."""
        return self.bridge.on(event, filter, **kwargs)

    def map(self, fn: Callback) -> Route:
        """Transform the value (sync or async). Returning ``None`` ends this run of the route."""
        self.steps.append(Step("map", check_callable(fn, "map", allow_zero=False)))
        return self

    def filter(self, pred: Callback) -> Route:
        self.steps.append(Step("filter", check_callable(pred, "filter", allow_zero=False)))
        return self

    def stream(self, gen_fn: Callback) -> Route:
        """Run a generator function (async or sync); everything it yields flows on down the route."""
        if not is_generator_function(gen_fn):
            raise RouteError(
                f".stream() needs a generator function (async def ... yield, or def ... yield); "
                f"got {gen_fn!r}"
            )
        check_callable(gen_fn, "stream", allow_zero=False)
        self.steps.append(Step("stream", gen_fn))
        return self

    def broadcast(self, event_type: type[Event] | None = None) -> Route:
        """Publish each value as an event of this session. ``event_type`` wraps non-event values."""
        if event_type is not None and not (isinstance(event_type, type) and issubclass(event_type, Event)):
            raise RouteError(f"broadcast(event_type=...) takes one Event subclass, got {event_type!r}")
        self.steps.append(Step("broadcast", event_type))
        return self

    def interrupt_on(
        self,
        event: EventSpec,
        handler: Callback | None = None,
        condition: Callback | None = None,
        *,
        filter_fn: Callback | None = None,
    ) -> Route:
        """Cancel this route's running turn when ``event`` (or any in a list) arrives.

        ``condition`` (``filter_fn`` is Line's name for it) may be sync or async; ``handler`` may be
        sync or async and take the message or nothing. It may be called several times on one route.
        """
        if condition is not None and filter_fn is not None:
            raise RouteError("give condition= or filter_fn=, not both")
        cond = condition if condition is not None else filter_fn
        self.interrupts.append(
            Clause(
                event_types(event, "interrupt_on"),
                check_callable(handler, "interrupt handler", allow_zero=True) if handler else None,
                check_callable(cond, "interrupt condition", allow_zero=True) if cond else None,
            )
        )
        return self

    def suspend_on(self, event: EventSpec, handler: Callback | None = None) -> Route:
        """Stop starting new runs of this route when ``event`` arrives, until a ``resume_on`` event."""
        h = check_callable(handler, "suspend handler", allow_zero=True) if handler else None
        self.suspends.append(Clause(event_types(event, "suspend_on"), h))
        return self

    def resume_on(self, event: EventSpec, handler: Callback | None = None) -> Route:
        h = check_callable(handler, "resume handler", allow_zero=True) if handler else None
        self.resumes.append(Clause(event_types(event, "resume_on"), h))
        return self

    # --- what the runtime reads -----------------------------------------------------------------

    def listens_to(self, event_type: type[Event]) -> bool:
        """Whether an event of this type could start, interrupt, suspend or resume this route."""
        clauses = [*self.interrupts, *self.suspends, *self.resumes]
        return issubclass(event_type, self.matcher.types) or any(
            issubclass(event_type, c.types) for c in clauses
        )

    @property
    def runs_as_turns(self) -> bool:
        """Streaming or interruptible routes run as cancellable turns, one at a time; the rest run
        each matching event through in order, but never hold up a turn or an interrupt."""
        return bool(self.interrupts) or any(s.kind == "stream" for s in self.steps)

    @property
    def cutting(self) -> list[Clause]:
        """Clauses that cut a running turn off, numbered for checkpoints: interrupts, then suspends."""
        return [*self.interrupts, *self.suspends]
