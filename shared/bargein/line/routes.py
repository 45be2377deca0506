"""``line.routes``: Line's ``RouteBuilder``, ``RouteHandler``, ``RouteConfig`` and ``RouteState``.

A route declared with Line's API has two lives, and this module gives it both:

* **On bargein's runtime** (what an agent does in production): :class:`RouteBuilder` *is* a
  :class:`bargein.agent.routes.Route`, so every ``.map/.stream/.broadcast/.interrupt_on`` also
  records bargein's steps and clauses, and the session runtime runs it with cancellation that
  reaches the generator, delivered-only history and failover.
* **In Line's own in-process engine** (what Line's tests, and code that drives a ``Bus`` or calls
  ``bridge.handle_event`` directly, expect): each builder also keeps Line's ``route_config``
  (operations as ``{"_fn_type": ..., "fn": ...}`` dicts, handlers per event, a state), and
  :class:`RouteHandler` runs it as Line did: a task per message, ``interrupt_on`` as a *control
  route* on the bridge that cancels the route's tasks, then runs the handler.

What the in-process engine does differently from Line, on purpose: an async interrupt, suspend or
resume handler is awaited (Line called it and dropped the coroutine), ``interrupt_on`` takes a list
of events (Line raised ``TypeError``), and ``id=``/``timestamp=``/callable ``source=`` filters are
applied (Line stored them and never looked at them).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from enum import Enum
from fnmatch import fnmatch
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from bargein.agent.calling import call_flexible, check_callable, is_generator_function
from bargein.agent.events import register_model
from bargein.agent.message import Message
from bargein.agent.routes import Clause, Route, Step
from bargein.line.events import EventsRegistry
from bargein.line.utils.aio import await_tasks_safe
from bargein.tasks import cancel_and_wait

if TYPE_CHECKING:
    from bargein.line.bridge import Bridge

log = logging.getLogger("bargein.line")

Control = Literal["suspend", "resume", "interrupt"]
_MESSAGE_FIELDS = {"id": "id_filter", "source": "source", "timestamp": "timestamp_filter"}


class _EventHandlerDict:
    """An interrupt, suspend or resume handler, and whether it takes the message."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        parameters = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
        if len(parameters) > 1:
            raise ValueError(
                f"handler {fn!r} takes {len(parameters)} arguments; it may take the message or none"
            )
        self.has_argument = bool(parameters)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs) if self.has_argument else self.fn()


class RouteState(Enum):
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    SUSPENDED = "suspended"
    EXITED = "exited"


@dataclass
class RouteConfig:
    """What Line's engine reads of a route: its operations in order, its state, its filters, and
    the handlers of the events that interrupt, suspend or resume it."""

    operations: list[dict[str, Any]] = field(default_factory=list)
    state: RouteState = RouteState.RUNNING
    source: Any = None
    max_concurrent_tasks: int | None = None
    interrupt_handlers: dict[Any, _EventHandlerDict | None] = field(default_factory=dict)
    suspend_handlers: dict[Any, _EventHandlerDict | None] = field(default_factory=dict)
    resume_handlers: dict[Any, _EventHandlerDict | None] = field(default_factory=dict)
    event_property_filters: dict[str, Any] = field(default_factory=dict)
    filter_fn: Callable[[Message], Any] | None = None
    id_filter: Any = None
    timestamp_filter: Any = None


def _fits(expected: Any, value: Any) -> bool:
    return bool(expected(value)) if callable(expected) else value == expected


def pattern_covers(pattern: Any, event: Any) -> bool:
    """Whether a route's event pattern takes ``event``: a class by ``isinstance``, ``"*"`` all, a
    string any event whose registered alias (its own class's, not a base's) fits the glob."""
    if isinstance(pattern, type):
        return isinstance(event, pattern)
    if pattern == "*":
        return True
    alias = EventsRegistry.get(type(event))
    return isinstance(pattern, str) and alias is not None and fnmatch(alias, pattern)


def fields_admit(config: RouteConfig, message: Message) -> bool:
    """The message filters (``id``, ``source``, ``timestamp``) and the event's field filters."""
    for name, attribute in _MESSAGE_FIELDS.items():
        expected = getattr(config, attribute)
        if expected is not None and not _fits(expected, getattr(message, name, None)):
            return False
    for name, expected in (config.event_property_filters or {}).items():
        if not hasattr(message.event, name) or not _fits(expected, getattr(message.event, name)):
            return False
    return True


class _Pattern:
    """Which events start a Line route on bargein's runtime: a class (any class: Line's events
    were plain pydantic models), a list of classes (bargein's addition), ``"*"``, or a glob over
    :class:`EventsRegistry` aliases."""

    def __init__(self, pattern: Any, config: RouteConfig) -> None:
        self.patterns: tuple[Any, ...] = tuple(pattern) if isinstance(pattern, list | tuple) else (pattern,)
        self.config = config
        classes = tuple(p for p in self.patterns if isinstance(p, type))
        self.types: tuple[type, ...] = classes if len(classes) == len(self.patterns) else (object,)

    async def matches(self, message: Message) -> bool:
        config = self.config
        if not any(p is not None and pattern_covers(p, message.event) for p in self.patterns):
            return False
        if not fields_admit(config, message):
            return False
        if config.filter_fn is not None:
            return bool(await call_flexible(config.filter_fn, message))
        return True


def _streamer(fn: Callable[..., Any] | None) -> Callable[[Any], AsyncIterator[Any]]:
    """Line's ``.stream()`` took any callable (or none): a generator's items flow on one by one, an
    iterable result's items too, anything else as one item. bargein's runtime streams generators,
    so a non-generator is adapted into one."""
    if fn is not None and is_generator_function(fn):
        return fn

    async def stream(value: Any) -> AsyncIterator[Any]:
        result = value if fn is None else await call_flexible(fn, value)
        if hasattr(result, "__aiter__"):
            async for item in result:
                yield item
        elif hasattr(result, "__iter__") and not isinstance(result, str | bytes | dict):
            for item in result:
                yield item
        else:
            yield result

    return stream


class RouteBuilder(Route):
    """``bridge.on(...)`` under Line's name: a bargein :class:`Route` that also keeps Line's
    ``route_config`` (see the module docstring)."""

    def __init__(self, bridge: Bridge, pattern: Any = None) -> None:
        self.route_config = RouteConfig()
        super().__init__(bridge, _Pattern(pattern, self.route_config))  # type: ignore[arg-type]
        self.route_handler: RouteHandler | None = None
        self.concurrent = True  # on the runtime too, a route that is not a turn takes messages at once

    def _set_route_handler(self, route_handler: RouteHandler) -> None:
        self.route_handler = route_handler

    def _has_control_operation(self) -> bool:
        ops = self.route_config.operations
        return bool(ops) and ops[0]["_fn_type"] == "control"

    def _validate_pre(self) -> None:
        if self._has_control_operation():
            raise ValueError("a control operation must be the first and only operation of its route")

    def _add_control_operation(self, fn: Callable[[Message], Any]) -> RouteBuilder:
        """The whole of a control route (Line's implementation of interrupt/suspend/resume_on): it
        acts on another route, synchronously, when its event arrives."""
        if self.route_config.operations:
            raise ValueError("a control operation must be the first and only operation of its route")
        self.route_config.operations.append({"_fn_type": "control", "fn": fn})
        return self

    # --- the DSL: Line's operations and bargein's steps, side by side ------------------------------

    def map(self, fn: Callable[..., Any]) -> RouteBuilder:
        self._validate_pre()
        self.route_config.operations.append({"_fn_type": "map", "fn": fn})
        self.steps.append(Step("map", check_callable(fn, "map", allow_zero=False), stops_on_none=False))
        return self

    def stream(self, generator_fn: Callable[..., Any] | None = None) -> RouteBuilder:
        self._validate_pre()
        self.route_config.operations.append({"_fn_type": "stream", "fn": generator_fn})
        self.steps.append(Step("stream", _streamer(generator_fn)))
        return self

    def filter(self, fn: Callable[..., Any]) -> RouteBuilder:
        self._validate_pre()
        self.route_config.operations.append({"_fn_type": "filter", "fn": fn})
        self.steps.append(Step("filter", check_callable(fn, "filter", allow_zero=False)))
        return self

    def broadcast(self, event_type: type | None = None) -> RouteBuilder:
        self._validate_pre()
        if isinstance(event_type, type) and issubclass(event_type, BaseModel):
            register_model(event_type)
        self.route_config.operations.append({"_fn_type": "broadcast", "event": event_type})
        self.steps.append(Step("broadcast", event_type))
        return self

    def interrupt_on(  # type: ignore[override]
        self,
        event_type: Any,
        handler: Callable[..., Any] | None = None,
        filter_fn: Callable[..., Any] | None = None,
        *,
        condition: Callable[..., Any] | None = None,
    ) -> RouteBuilder:
        if filter_fn is not None and condition is not None:
            raise ValueError("give filter_fn= or condition=, not both")
        condition = condition if condition is not None else filter_fn
        self._on_control("interrupt", event_type, handler, condition)
        self.interrupts.append(Clause(_types(event_type), _checked(handler), _checked(condition)))
        return self

    def suspend_on(self, event_type: Any, handler: Callable[..., Any] | None = None) -> RouteBuilder:
        self._on_control("suspend", event_type, handler)
        self.suspends.append(Clause(_types(event_type), _checked(handler)))
        return self

    def resume_on(self, event_type: Any, handler: Callable[..., Any] | None = None) -> RouteBuilder:
        self._on_control("resume", event_type, handler)
        self.resumes.append(Clause(_types(event_type), _checked(handler)))
        return self

    def on(self, event: Any, **filters: Any) -> RouteBuilder:  # type: ignore[override]
        """Start another route on the same bridge."""
        return self.bridge.on(event, **filters)  # type: ignore[return-value]

    def _on_control(
        self,
        kind: Control,
        event_type: Any,
        handler: Callable[..., Any] | None,
        condition: Callable[..., Any] | None = None,
    ) -> None:
        """Line's bookkeeping for interrupt/suspend/resume_on: the handler by event, and a control
        route on the bridge that acts on this route when the event arrives."""
        handlers: dict[Any, _EventHandlerDict | None] = getattr(self.route_config, f"{kind}_handlers")
        events = list(event_type) if isinstance(event_type, list | tuple) else [event_type]
        for event in events:
            if event in handlers:
                raise ValueError(f"{getattr(event, '__name__', event)} is already registered for {kind}")
        wrapped = _EventHandlerDict(handler) if handler is not None else None
        for event in events:
            handlers[event] = wrapped
            control = (
                self.bridge.on(event, filter_fn=condition) if kind == "interrupt" else self.bridge.on(event)
            )
            control._add_control_operation(self._control_action(kind, wrapped))  # type: ignore[attr-defined]

    def _control_action(self, kind: Control, handler: _EventHandlerDict | None) -> Callable[[Message], Any]:
        def act(message: Message) -> Any:
            if self.route_handler is None:
                raise RuntimeError("this RouteBuilder has no RouteHandler (create one, or use bridge.on)")
            return getattr(self.route_handler, f"_{kind}")(message, handler)

        return act


def _types(spec: Any) -> tuple[type, ...]:
    items = list(spec) if isinstance(spec, list | tuple) else [spec]
    for item in items:
        if not isinstance(item, type):
            raise ValueError(f"interrupt, suspend and resume take event classes, got {item!r}")
        if issubclass(item, BaseModel):
            register_model(item)
    return tuple(items)


def _checked(fn: Callable[..., Any] | None) -> Callable[..., Any] | None:
    return check_callable(fn, "handler", allow_zero=True) if fn is not None else None


async def _settle(result: Any) -> Any:
    """A handler's result, awaited if it is awaitable (Line dropped async handlers' coroutines)."""
    return await result if inspect.isawaitable(result) else result


class RouteHandler:
    """Line's engine for one route, in process: a task per matching message (at most
    ``max_concurrent_tasks``, the oldest cancelled beyond that), cancelled by the route's control
    routes."""

    def __init__(self, route_builder: RouteBuilder, bridge: Bridge) -> None:
        self.route_builder = route_builder
        route_builder._set_route_handler(self)
        self.bridge = bridge
        self._active_tasks: list[asyncio.Task[Any]] = []
        self._task_lock = asyncio.Lock()
        self._task_cancel_all_tasks: asyncio.Task[None] | None = None  # the interrupt in progress

    @property
    def route_config(self) -> RouteConfig:
        return self.route_builder.route_config

    def should_process_message(self, message: Message) -> bool:
        config = self.route_config
        if config.state == RouteState.SUSPENDED or not config.operations:
            return False
        if config.filter_fn is not None and not config.filter_fn(message):
            return False
        return fields_admit(config, message)

    async def handle(self, message: Message) -> Any:
        """Run the route on ``message``; its result, or None if it did not run or was cancelled."""
        config = self.route_config
        if config.state == RouteState.SUSPENDED or not config.operations:
            return None
        if config.source is not None and not _fits(config.source, message.source):
            return None
        if self._task_cancel_all_tasks is not None:  # an interrupt is unwinding: let it finish first
            await await_tasks_safe(self._task_cancel_all_tasks)
        if self.route_builder._has_control_operation():
            return await _settle(config.operations[0]["fn"](message))
        try:
            async with self._task_lock:
                if config.max_concurrent_tasks is not None:
                    self._active_tasks = [t for t in self._active_tasks if not t.done()]
                    if len(self._active_tasks) >= config.max_concurrent_tasks:
                        await self._cancel_task_with_cleanup(self._active_tasks.pop(0))
                task = asyncio.create_task(self._process_operations(message, config.operations))
                self._active_tasks.append(task)
            result = await task
            await self._clean_active_tasks_safe()
            return result
        except asyncio.CancelledError:
            log.debug("route %r: run cancelled", self)
            return None

    def _interrupt(self, message: Message, handler: _EventHandlerDict | None = None) -> None:
        """Cancel the running tasks; once they have all unwound (and any earlier interrupt has
        finished), run the handler. Nothing running: nothing to do, no handler."""
        running = [t for t in self._active_tasks if not t.done()]
        if not running:
            return
        for task in running:
            task.cancel()
        previous = self._task_cancel_all_tasks

        async def unwind() -> None:
            if previous is not None:
                await await_tasks_safe(previous)
            await await_tasks_safe(running)
            if handler is not None:
                await _settle(handler(message))
            await self._clean_active_tasks_safe()

        self._task_cancel_all_tasks = asyncio.create_task(unwind())

    def _suspend(self, message: Message, handler: _EventHandlerDict | None = None) -> None:
        self.route_config.state = RouteState.SUSPENDED
        self._interrupt(message, handler)

    async def _resume(self, message: Message, handler: _EventHandlerDict | None = None) -> None:
        self.route_config.state = RouteState.RUNNING
        if handler is not None:
            await _settle(handler(message))

    async def _clean_active_tasks_safe(self) -> None:
        async with self._task_lock:
            self._active_tasks = [t for t in self._active_tasks if not t.done()]

    async def _cancel_task_with_cleanup(self, task: asyncio.Task[Any]) -> None:
        if not task.done():
            await cancel_and_wait(task)

    async def _process_operations(self, data: Any, operations: list[dict[str, Any]]) -> Any:
        """Push ``data`` through ``operations``; returns ``data`` itself when there are none, and
        None otherwise (a route's effects are its broadcasts)."""
        if not operations:
            return data
        current = data
        for i, operation in enumerate(operations):
            kind = operation["_fn_type"]
            fn = operation.get("fn")
            if kind == "map":
                current = await _settle(fn(current))  # type: ignore[misc]
            elif kind == "stream":
                await self._handle_stream(current, fn, operations[i + 1 :])
                return None
            elif kind == "filter":
                if not await _settle(fn(current)):  # type: ignore[misc]
                    return None
            elif kind == "broadcast":
                await self._broadcast(current, operation["event"])
        return None

    async def _broadcast(self, value: Any, event_type: type | None) -> None:
        bus = self.bridge.bus
        if value is None or bus is None:
            return
        event = value
        if event_type is not None:
            try:
                event = event_type(**value)
            except Exception:
                log.exception("cannot make a %s of %r", event_type.__name__, value)
                raise
        await bus.broadcast(Message(source=self.bridge.node_id, event=event))

    async def _handle_stream(
        self, data: Any, generator_fn: Callable[..., Any] | None, remaining: list[dict[str, Any]]
    ) -> None:
        if generator_fn is None:
            source: Any = data
        elif inspect.isasyncgenfunction(generator_fn) or inspect.isgeneratorfunction(generator_fn):
            source = generator_fn(data)
        else:
            await self._process_operations(await _settle(generator_fn(data)), remaining)
            return
        if hasattr(source, "__aiter__"):
            async for item in source:
                await self._process_operations(item, remaining)
        elif generator_fn is not None or (
            hasattr(source, "__iter__") and not isinstance(source, str | bytes)
        ):
            for item in source:
                await self._process_operations(item, remaining)
        else:
            await self._process_operations(source, remaining)

    def _is_async_generator_function(self, fn: Callable[..., Any]) -> bool:
        return inspect.isasyncgenfunction(fn)

    def _is_generator_function(self, fn: Callable[..., Any]) -> bool:
        return inspect.isgeneratorfunction(fn)


__all__ = ["Route", "RouteBuilder", "RouteConfig", "RouteHandler", "RouteState"]
