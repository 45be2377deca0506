"""The route DSL: ``bridge.on(Event).interrupt_on(...).stream(fn).broadcast()``.

A :class:`Bridge` ties a node to the routes that feed it. A :class:`Route` is a little pipeline
(map / filter / stream / broadcast) started by matching events, plus the events that interrupt,
suspend or resume it. Declaration only records and validates; the :class:`~bargein.runtime.SessionRuntime`
that owns the session drives the routes:

1. for every event, first every route's *control* clauses run (interrupt, suspend, resume), so an
   interrupt acts the moment it is dispatched, never behind queued work;
2. then every route the event starts gets it. Routes that stream or can be interrupted run as one
   task per turn, one turn at a time, in arrival order; the rest run inline, in event order.

Interrupt semantics (Line's, with its documented-but-broken forms made real): when an interrupt event
arrives while the route is running and its condition holds, the running turn is cancelled (the
generator sees ``CancelledError`` at its current await), nothing more of that turn is published,
triggers queued before the interrupt are dropped, the handler runs after the turn has unwound, and
the route's next turn starts only after the handler has returned.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from bargein._callables import call_flexible, check_callable, close_generator, is_generator_function
from bargein.errors import RouteError
from bargein.events import Event
from bargein.message import Message

if TYPE_CHECKING:
    from bargein.nodes import Node
    from bargein.runtime import SessionRuntime, TurnRun

log = logging.getLogger("bargein.route")

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
class _Step:
    kind: StepKind
    fn: Any


@dataclass
class _Pending:
    """A trigger waiting for the route's worker. After a failover it may carry the turn it resumes,
    or, for a turn interrupted just before its owner died, only the handler that is left to run."""

    message: Message
    turn: int | None = None
    interrupted_by: Message | None = None
    clause: int | None = None


@dataclass(frozen=True)
class _Clause:
    """One interrupt_on / suspend_on / resume_on clause."""

    types: tuple[type[Event], ...]
    handler: Callback | None
    condition: Callback | None = None


class _Matcher:
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
        matcher = _Matcher(event_types(event, "Bridge.on"), filter or filter_fn, property_filters)
        route = Route(self, matcher)
        self.routes.append(route)
        return route

    def authorize(self, *node_ids: str) -> Bridge:
        """Accept events broadcast by these nodes (Line's API). Until called, a bridge accepts all."""
        self.authorized = (self.authorized or set()) | set(node_ids)
        return self

    def accepts(self, message: Message) -> bool:
        return (
            self.authorized is None or message.source in ("user", "edge") or message.source in self.authorized
        )

    # --- driven by the runtime -------------------------------------------------------------------

    async def apply_control(self, message: Message) -> None:
        for route in self.routes:
            await route.apply_control(message)

    async def deliver(self, message: Message) -> None:
        for route in self.routes:
            if await route.matcher.matches(message):
                await route.trigger(message)


class Route:
    """A pipeline started by matching events. Build it by chaining; every method returns the route."""

    def __init__(self, bridge: Bridge, matcher: _Matcher) -> None:
        self.bridge = bridge
        self.matcher = matcher
        self.steps: list[_Step] = []
        self.interrupts: list[_Clause] = []
        self.suspends: list[_Clause] = []
        self.resumes: list[_Clause] = []
        self.suspended = False
        self._runtime: SessionRuntime | None = None
        self.key = ""  # position in the session ("bridge.route"), set by the runtime; names checkpoints
        self._pending: collections.deque[_Pending] = collections.deque()
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._active: TurnRun | None = None
        self._handler_due: _Pending | None = None

    # --- the DSL ---------------------------------------------------------------------------------

    def on(self, event: EventSpec, filter: Callback | None = None, **kwargs: Any) -> Route:
        """Start another route on the same bridge (Line allowed chaining ``.on`` from a route)."""
        return self.bridge.on(event, filter, **kwargs)

    def map(self, fn: Callback) -> Route:
        """Transform the value (sync or async). Returning ``None`` ends this run of the route."""
        self.steps.append(_Step("map", check_callable(fn, "map", allow_zero=False)))
        return self

    def filter(self, pred: Callback) -> Route:
        self.steps.append(_Step("filter", check_callable(pred, "filter", allow_zero=False)))
        return self

    def stream(self, gen_fn: Callback) -> Route:
        """Run a generator function (async or sync); everything it yields flows on down the route."""
        if not is_generator_function(gen_fn):
            raise RouteError(
                f".stream() needs a generator function (async def ... yield, or def ... yield); "
                f"got {gen_fn!r}"
            )
        check_callable(gen_fn, "stream", allow_zero=False)
        self.steps.append(_Step("stream", gen_fn))
        return self

    def broadcast(self, event_type: type[Event] | None = None) -> Route:
        """Publish each value as an event of this session. ``event_type`` wraps non-event values."""
        if event_type is not None and not (isinstance(event_type, type) and issubclass(event_type, Event)):
            raise RouteError(f"broadcast(event_type=...) takes one Event subclass, got {event_type!r}")
        self.steps.append(_Step("broadcast", event_type))
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
            _Clause(
                event_types(event, "interrupt_on"),
                check_callable(handler, "interrupt handler", allow_zero=True) if handler else None,
                check_callable(cond, "interrupt condition", allow_zero=True) if cond else None,
            )
        )
        return self

    def suspend_on(self, event: EventSpec, handler: Callback | None = None) -> Route:
        """Stop starting new runs of this route when ``event`` arrives, until a ``resume_on`` event."""
        h = check_callable(handler, "suspend handler", allow_zero=True) if handler else None
        self.suspends.append(_Clause(event_types(event, "suspend_on"), h))
        return self

    def resume_on(self, event: EventSpec, handler: Callback | None = None) -> Route:
        h = check_callable(handler, "resume handler", allow_zero=True) if handler else None
        self.resumes.append(_Clause(event_types(event, "resume_on"), h))
        return self

    # --- driven by the runtime -------------------------------------------------------------------

    def listens_to(self, event_type: type[Event]) -> bool:
        """Whether an event of this type could start, interrupt, suspend or resume this route."""
        clauses = [*self.interrupts, *self.suspends, *self.resumes]
        return issubclass(event_type, self.matcher.types) or any(
            issubclass(event_type, c.types) for c in clauses
        )

    @property
    def runs_as_turns(self) -> bool:
        """Streaming or interruptible routes run as cancellable tasks, one turn at a time."""
        return bool(self.interrupts) or any(s.kind == "stream" for s in self.steps)

    @property
    def active(self) -> TurnRun | None:
        return self._active

    def bind(self, runtime: SessionRuntime, key: str) -> None:
        self._runtime = runtime
        self.key = key
        if self.runs_as_turns:
            self._worker = asyncio.create_task(self._work(), name=f"route:{runtime.session_id}:{key}")

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None

    @staticmethod
    def _clause_for(clauses: list[_Clause], message: Message) -> _Clause | None:
        return next((c for c in clauses if isinstance(message.event, c.types)), None)

    @property
    def _cutting(self) -> list[_Clause]:
        """Clauses that cut a running turn off, numbered for checkpoints: interrupts, then suspends."""
        return [*self.interrupts, *self.suspends]

    async def apply_control(self, message: Message) -> None:
        clause = self._clause_for(self.interrupts, message)
        if clause is not None:
            await self._maybe_interrupt(clause, message)
        clause = self._clause_for(self.suspends, message)
        if clause is not None:
            self.suspended = True
            run = self._active
            if run is not None and not run.cancelled:  # suspending stops what runs, like Line meant
                self._pending.clear()
                await run.interrupt(message, self._cutting.index(clause))
            elif clause.handler is not None:
                await self._runtime_or_fail().guard(call_flexible(clause.handler, message), "suspend handler")
        clause = self._clause_for(self.resumes, message)
        if clause is not None:
            self.suspended = False
            if clause.handler is not None:
                await self._runtime_or_fail().guard(call_flexible(clause.handler, message), "resume handler")

    async def _maybe_interrupt(self, clause: _Clause, message: Message) -> None:
        run = self._active
        if run is None or run.cancelled:
            return  # nothing running: no cancel, no handler
        runtime = self._runtime_or_fail()
        if clause.condition is not None:
            ok = await runtime.guard(call_flexible(clause.condition, message), "condition", default=False)
            if not ok:
                runtime.count("interrupts_declined")
                return
        self._pending.clear()  # triggers that arrived before the interrupt are stale now
        await run.interrupt(message, self.interrupts.index(clause))

    async def trigger(self, message: Message) -> None:
        runtime = self._runtime_or_fail()
        if self.suspended:
            runtime.count("triggers_while_suspended")
            return
        runtime.mark_dirty()
        if self.runs_as_turns:
            self._pending.append(_Pending(message))
            self._wakeup.set()
        else:
            run = runtime.new_run(message, self.bridge)
            await runtime.guard(run.execute(self._execute(message, run)), "route")
            runtime.forget_turn(run)

    async def _next_pending(self) -> _Pending:
        while not self._pending:
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._pending.popleft()

    async def _work(self) -> None:
        runtime = self._runtime_or_fail()
        while True:
            item = await self._next_pending()
            if item.interrupted_by is not None and item.clause is not None:
                # restored after a failover: the turn was cut off; only its handler is left to run
                await self._run_handler(item.clause, item.interrupted_by)
                await runtime.turn_finished(None)
                continue
            if self.suspended and item.turn is None:
                continue
            run = runtime.new_run(item.message, self.bridge, turn=item.turn)
            self._active = run
            try:
                await runtime.turn_started(run)
                await run.run_as_task(self._execute(item.message, run))
            finally:
                self._active = None
            if run.interrupted_by is not None and run.clause is not None:
                # Record the cut history (and that only the handler is left) before running it, so
                # an adopter runs the handler rather than the turn if this process dies meanwhile.
                self._handler_due = _Pending(run.trigger, run.turn, run.interrupted_by, run.clause)
                await runtime.checkpoint()
                await self._run_handler(run.clause, run.interrupted_by)
                self._handler_due = None
            await runtime.turn_finished(run)

    async def _run_handler(self, clause: int, message: Message) -> None:
        handler = self._cutting[clause].handler
        if handler is not None:
            await self._runtime_or_fail().guard(call_flexible(handler, message), "interrupt handler")

    # --- checkpoints -----------------------------------------------------------------------------

    def durable_state(self) -> dict[str, Any]:
        """What an adopter needs to carry on: the running turn and the triggers still waiting."""
        active = self._active
        if active is not None:
            current: _Pending | None = _Pending(
                active.trigger, active.turn, active.interrupted_by, active.clause
            )
        else:
            current = self._handler_due
        return {
            "active": None
            if current is None
            else {
                "turn": current.turn,
                "trigger": current.message.encode(),
                "interrupted_by": current.interrupted_by.encode() if current.interrupted_by else None,
                "clause": current.clause,
            },
            "pending": [p.message.encode() for p in self._pending],
        }

    def restore_durable(self, state: dict[str, Any]) -> None:
        active = state.get("active")
        if active is not None:
            interrupted = active.get("interrupted_by")
            self._pending.append(
                _Pending(
                    Message.decode(active["trigger"]),
                    turn=active.get("turn"),
                    interrupted_by=Message.decode(interrupted) if interrupted else None,
                    clause=active.get("clause"),
                )
            )
        self._pending.extend(_Pending(Message.decode(raw)) for raw in state.get("pending", []))
        if self._pending:
            self._wakeup.set()

    async def _execute(self, value: Any, run: TurnRun, index: int = 0) -> None:
        """Push ``value`` through steps[index:]."""
        for i in range(index, len(self.steps)):
            step = self.steps[i]
            if step.kind == "map":
                value = await call_flexible(step.fn, value)
                if value is None:
                    return
            elif step.kind == "filter":
                if not await call_flexible(step.fn, value):
                    return
            elif step.kind == "broadcast":
                await run.publish(value, step.fn)
            else:  # stream: the rest of the route runs once per yielded item
                await self._stream(step.fn(value), run, i + 1)
                return

    async def _stream(self, gen: Any, run: TurnRun, next_index: int) -> None:
        if not inspect.isasyncgen(gen):
            for item in gen:
                await self._execute(item, run, next_index)
            return
        while True:
            try:
                item = await gen.__anext__()  # a cancel here is raised inside the generator itself
            except StopAsyncIteration:
                return
            try:
                await self._execute(item, run, next_index)
            except BaseException as exc:  # cancelled while publishing: the generator sits at a yield
                await close_generator(gen, exc)
                raise

    def _runtime_or_fail(self) -> SessionRuntime:
        if self._runtime is None:
            raise RouteError("this route is not running in a session (no runtime bound)")
        return self._runtime
