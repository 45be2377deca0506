"""``line.bridge``: Line's :class:`Bridge`, which is also a bargein bridge.

On bargein's runtime a session runs the bridge's routes (``routes_to_run``) with its own executors.
Line's in-process surface is here as well, because Line's tests and some agents drive it directly:
``routes`` is Line's dict of event pattern → :class:`~bargein.line.routes.RouteHandler`,
``handle_event`` runs every matching route at once, ``bus`` is the :class:`~bargein.line.bus.Bus`
it broadcasts to, and ``with_input_routing`` feeds the bus from a source object.

``bridge.on`` takes a class (any class: Line's events were plain pydantic models), ``"*"``, or a glob
over :class:`~bargein.line.events.EventsRegistry` aliases; ``id=``, ``source=`` and ``timestamp=``
filter the message, other keywords the event's fields (a value, or a predicate).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from bargein.agent.events import register_model
from bargein.agent.message import Message
from bargein.agent.routes import Bridge as _RuntimeBridge
from bargein.agent.routes import Route
from bargein.line.routes import RouteBuilder, RouteHandler, pattern_covers
from bargein.line.utils.aio import await_tasks_safe
from bargein.tasks import cancel_and_wait

if TYPE_CHECKING:
    from bargein.line.bus import Bus

log = logging.getLogger("bargein.line")
INPUT_POLL_S = 1.0


class Bridge(_RuntimeBridge):
    def __init__(self, node: Any) -> None:
        super().__init__(node)
        with contextlib.suppress(AttributeError, TypeError):
            node._bridge = self  # Line let a node find its bridge
        self.routes: defaultdict[Any, list[RouteHandler]] = defaultdict(list)  # type: ignore[assignment]
        self._builders: list[RouteBuilder] = []  # in declaration order: what the runtime runs
        self.bus: Bus | None = None
        self.scheduled_tasks: list[asyncio.Task[Any]] = []
        self.active_route_tasks: list[asyncio.Task[Any]] = []
        self._route_tasks_lock = asyncio.Lock()
        self.input_source: Any = None
        self.input_task: asyncio.Task[None] | None = None
        self.input_shutdown: asyncio.Event | None = None

    @property
    def node_id(self) -> str:
        if isinstance(self.node, str):
            return self.node
        node_id = getattr(self.node, "id", None)
        return node_id if isinstance(node_id, str) else type(self.node).__name__

    @property
    def authorized_nodes(self) -> set[str]:
        """Line's name: the nodes whose broadcasts this bridge hears (empty: all)."""
        return self.authorized or set()

    def authorize(self, *node_ids: str) -> Bridge:
        self.authorized = set(node_ids)
        return self

    def set_bus(self, bus: Bus) -> Bridge:
        self.bus = bus
        return self

    def on(  # type: ignore[override]
        self,
        event_pattern: Any,
        filter: Any = None,
        *,
        id: Any = None,
        source: Any = None,
        timestamp: Any = None,
        filter_fn: Any = None,
        **event_property_filters: Any,
    ) -> RouteBuilder:
        patterns = list(event_pattern) if isinstance(event_pattern, list | tuple) else [event_pattern]
        for pattern in patterns:
            if not inspect.isclass(pattern) and not isinstance(pattern, str):
                raise ValueError(f"bridge.on takes event classes or string patterns, got {pattern!r}")
            if inspect.isclass(pattern) and issubclass(pattern, BaseModel):
                register_model(pattern)  # a plain model (Line's kind of event) must travel too
        if not patterns:
            raise ValueError("bridge.on needs at least one event class or pattern")
        if filter is not None and filter_fn is not None:
            raise ValueError("give filter= or filter_fn=, not both")
        builder = RouteBuilder(self, event_pattern)
        handler = RouteHandler(builder, self)
        config = builder.route_config
        config.id_filter, config.source, config.timestamp_filter = id, source, timestamp
        config.filter_fn = filter if filter is not None else filter_fn
        config.event_property_filters = event_property_filters
        for pattern in patterns:  # a list (bargein's addition) is one route under each pattern
            self.routes[pattern].append(handler)
        self._builders.append(builder)
        return builder

    def routes_to_run(self) -> list[Route]:
        """Every declared route but Line's control routes: on bargein's runtime an interrupt is a
        clause of the route it cuts, not a route of its own."""
        return [b for b in self._builders if not b._has_control_operation()]

    def accepts(self, message: Message) -> bool:
        return not self.authorized or message.from_caller_side or message.source in self.authorized

    def can_handle(self, event: Any) -> bool:
        return bool(self._find_matching_routes(event))

    def _find_matching_routes(self, event: Any) -> list[RouteHandler]:
        found = [
            h for pattern, handlers in self.routes.items() if pattern_covers(pattern, event) for h in handlers
        ]
        return list(dict.fromkeys(found))  # a route on a list of patterns counts once

    async def handle_event(self, message: Message) -> None:
        """Run every route ``message`` starts, at once, and wait for them (a failing route is logged
        and does not stop the others)."""
        if self.authorized and message.source not in self.authorized:
            return
        handlers = [h for h in self._find_matching_routes(message.event) if h.should_process_message(message)]
        if not handlers:
            return
        tasks = [asyncio.create_task(h.handle(message)) for h in handlers]
        async with self._route_tasks_lock:
            self.active_route_tasks.extend(tasks)
        for number, result in enumerate(await asyncio.gather(*tasks, return_exceptions=True)):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error(
                    "bridge %s: route %d failed on %s: %r",
                    self.node_id,
                    number,
                    type(message.event).__name__,
                    result,
                    exc_info=result,
                )
        async with self._route_tasks_lock:
            self.active_route_tasks = [t for t in self.active_route_tasks if not t.done()]

    # --- input routing: a source object's messages become bus events -----------------------------

    def with_input_routing(self, source: Any = None) -> Bridge:
        """Feed the bus from ``source`` (default: the node): an object with ``async get()`` and
        ``map_to_events(message)``."""
        self.input_source = source if source is not None else self.node
        return self

    async def start_input_routing(self) -> None:
        if self.input_source is None or not hasattr(self.input_source, "get"):
            log.warning("bridge %s: no input source with get() to route from", self.node_id)
            return
        self.input_shutdown = asyncio.Event()
        self.input_task = asyncio.create_task(self._input_router(), name=f"input:{self.node_id}")

    async def _input_router(self) -> None:
        assert self.input_shutdown is not None
        while not self.input_shutdown.is_set():
            try:
                raw = await asyncio.wait_for(self.input_source.get(), timeout=INPUT_POLL_S)
            except TimeoutError:
                continue
            try:
                for event in self.input_source.map_to_events(raw):
                    if self.bus is not None:
                        await self.bus.broadcast(Message(source=self.node_id, event=event))
            except Exception:
                log.exception("bridge %s: routing input %r failed", self.node_id, raw)

    async def stop_input_routing(self) -> None:
        if self.input_shutdown is not None:
            self.input_shutdown.set()
        if self.input_task is not None and not self.input_task.done():
            await cancel_and_wait(self.input_task)

    async def start(self) -> None:
        if self.input_source is not None:
            await self.start_input_routing()

    async def stop(self) -> None:
        await self.stop_input_routing()
        async with self._route_tasks_lock:
            for task in self.active_route_tasks:
                task.cancel()
            await await_tasks_safe(self.active_route_tasks)
            self.active_route_tasks.clear()
        for task in self.scheduled_tasks:
            task.cancel()
        await asyncio.gather(*self.scheduled_tasks, return_exceptions=True)
        self.scheduled_tasks.clear()


__all__ = ["Bridge"]
