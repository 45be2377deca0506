"""``line.bus``: the :class:`Message` routes receive, and Line's in-process :class:`Bus`.

``Message`` is bargein's (:class:`bargein.agent.message.Message`): Line's ``.event``, ``.source``,
``.id`` and ``.timestamp``, plus where the event sits in the session (``.session``, ``.turn``,
``.seq``, ``.epoch``).

``Bus`` is Line's in-memory router, for code that wires bridges together by hand (Line's own tests
do): a bounded queue, one router task, and every message handed to every registered bridge's
``handle_event`` as a task of its own, so a slow route never holds up the next message. An agent
run by bargein (``handle_new_call``, or bridges given to ``LocalSession``) does not use it: the
session runtime and RabbitMQ carry its events, across processes. One difference from Line on
purpose: ``AgentHandoff`` (and a ``transfer_to_*`` tool call) reaches the bridges like any event;
Line's bus swallowed it and broadcast an event no bridge could route.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from bargein.agent.message import Message
from bargein.tasks import cancel_and_wait

if TYPE_CHECKING:
    from bargein.line.bridge import Bridge

log = logging.getLogger("bargein.line")
ROUTER_POLL_S = 1.0


class Bus:
    def __init__(self, max_queue_size: int = 1000) -> None:
        self.max_queue_size = max_queue_size
        self.message_queue: asyncio.Queue[Message] = asyncio.Queue(maxsize=max_queue_size)
        self.running = False
        self.router_task: asyncio.Task[None] | None = None
        self.bridges: dict[str, Bridge] = {}
        self.pending_requests: dict[str, asyncio.Future[Any]] = {}
        self.shutdown_event = asyncio.Event()
        self._deliveries: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        if self.running:
            log.debug("bus already running")
            return
        self.running = True
        self.router_task = asyncio.create_task(self._message_router(), name="line-bus")
        log.info("bus started with %d bridges: %s", len(self.bridges), ", ".join(sorted(self.bridges)))

    async def cleanup(self) -> None:
        self.running = False
        self.shutdown_event.set()
        if self.router_task is not None and not self.router_task.done():
            await cancel_and_wait(self.router_task)
        for future in self.pending_requests.values():
            future.cancel()
        self.pending_requests.clear()

    def register_bridge(self, node_id: str, bridge: Bridge) -> None:
        self.bridges[node_id] = bridge
        bridge.set_bus(self)

    async def broadcast(self, message: Message) -> None:
        """Queue ``message`` for every bridge; waits while the queue is full (backpressure)."""
        await self.message_queue.put(message)

    async def _message_router(self) -> None:
        while self.running:
            try:
                message = await asyncio.wait_for(self.message_queue.get(), timeout=ROUTER_POLL_S)
            except TimeoutError:
                continue
            self._route_message(message)

    def _route_message(self, message: Message) -> None:
        for bridge in list(self.bridges.values()):
            task = asyncio.create_task(self._deliver(bridge, message))
            self._deliveries.add(task)
            task.add_done_callback(self._deliveries.discard)

    @staticmethod
    async def _deliver(bridge: Bridge, message: Message) -> None:
        try:
            await bridge.handle_event(message)
        except Exception:
            log.exception("bridge %s failed on %s", bridge.node_id, type(message.event).__name__)


__all__ = ["Bus", "Message"]
