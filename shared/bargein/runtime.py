"""One session, running in whichever process owns it.

:class:`SessionRuntime` is the same code in-process and distributed; only the transport and the
state store behind it differ. The path of an event:

1. the transport hands the decoded envelope to :meth:`SessionRuntime.handle` (one at a time, in
   mailbox order); it becomes a :class:`~bargein.message.Message` on the session's inbox;
2. the dispatcher applies every route's control clauses first (an interrupt cancels the running
   turn right here and :class:`~bargein.events.TurnInterrupted` goes out before the turn has even
   unwound), then delivers the message to the routes it starts;
3. a route run is a :class:`TurnRun`; everything it broadcasts goes out as an envelope stamped with
   (session, turn, seq, epoch), unless the turn was interrupted, in which case it is dropped;
4. after each finished turn and each interrupt handler the nodes are checkpointed to the state
   store under the owner's epoch.

The :class:`DeliveryLedger` records what each turn published and what the edge reports delivered,
so an interrupted assistant message is cut to exactly what the caller received.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import inspect
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgpack
from opentelemetry.trace import Span, SpanKind

from bargein import snapshot, tracing
from bargein.abc import SessionProcessor, StateStore, Transport
from bargein.envelope import Envelope, validate_session_id
from bargein.errors import BargeinError, EnvelopeError, InvalidEnvelope, StaleEpochError
from bargein.events import (
    AgentError,
    AgentGenerationComplete,
    AgentResponse,
    EndCall,
    Event,
    InterruptPolicy,
    SpeechDelivered,
    TurnInterrupted,
)
from bargein.message import Message
from bargein.names import OUT, TIER_REASONING, Tier
from bargein.nodes import Node, ReasoningNode
from bargein.route import Bridge
from bargein.system import CallRequest, LineCall, is_line_style, launch

log = logging.getLogger("bargein.runtime")

T = TypeVar("T")

_CURRENT_RUN: contextvars.ContextVar[TurnRun | None] = contextvars.ContextVar("bargein_run", default=None)


def current_run() -> TurnRun | None:
    """The route run the calling code belongs to (None outside a runtime)."""
    return _CURRENT_RUN.get()


@dataclass
class SessionInfo:
    """What an agent is told about the session it is building."""

    session_id: str
    options: dict[str, Any] = field(default_factory=dict)
    # True when a client edge reports delivery (SpeechDelivered); then only reported chunks count
    # as heard. Without an edge the record of what was published stands in.
    edge_reports_delivery: bool = False

    @property
    def id(self) -> str:
        return self.session_id

    def encode(self) -> bytes:
        data: bytes = msgpack.packb(
            {
                "session_id": self.session_id,
                "options": self.options,
                "edge_reports_delivery": self.edge_reports_delivery,
            },
            use_bin_type=True,
        )
        return data

    @classmethod
    def decode(cls, raw: bytes) -> SessionInfo:
        """A session start from the work queue; :class:`InvalidEnvelope` if it is not one."""
        try:
            data = msgpack.unpackb(raw, raw=False)
            info = cls(
                session_id=validate_session_id(data["session_id"]),
                options=dict(data.get("options") or {}),
                edge_reports_delivery=bool(data.get("edge_reports_delivery", False)),
            )
        except EnvelopeError:
            raise
        except Exception as exc:
            raise InvalidEnvelope(f"not a session start: {type(exc).__name__}: {exc}") from None
        return info


AgentResult = Bridge | list[Bridge] | tuple[Bridge, ...]
Agent = Callable[[SessionInfo], AgentResult | Awaitable[AgentResult]]


async def build_bridges(agent: Agent, session: SessionInfo) -> list[Bridge]:
    result: Any = agent(session)
    if inspect.isawaitable(result):
        result = await result
    bridges = [result] if isinstance(result, Bridge) else list(result or [])
    if not bridges or not all(isinstance(b, Bridge) for b in bridges):
        raise BargeinError(f"agent {agent!r} must return a Bridge or a list of Bridges, got {result!r}")
    return bridges


class DeliveryLedger:
    """Per turn: the text of each published chunk, and how far the edge says the caller got."""

    def __init__(self, edge_reports: bool) -> None:
        self.edge_reports = edge_reports
        self._chunks: dict[int, dict[int, str]] = collections.defaultdict(dict)
        self._delivered_upto: dict[int, int] = {}

    def published(self, turn: int, seq: int, text: str) -> None:
        self._chunks[turn][seq] = text

    def delivered(self, turn: int, seq: int) -> None:
        self._delivered_upto[turn] = max(seq, self._delivered_upto.get(turn, -1))

    def delivered_text(self, turn: int) -> str:
        chunks = self._chunks.get(turn, {})
        upto = self._delivered_upto.get(turn, -1) if self.edge_reports else max(chunks, default=-1)
        return "".join(text for seq, text in sorted(chunks.items()) if seq <= upto)

    def forget_before(self, turn: int) -> None:
        for old in [t for t in self._chunks if t < turn]:
            self._chunks.pop(old, None)
            self._delivered_upto.pop(old, None)


class TurnRun:
    """One run of a route. It gets a turn number when it first publishes (streaming routes: when
    they start), and after an interrupt it publishes nothing more."""

    def __init__(
        self, runtime: SessionRuntime, trigger: Message, bridge: Bridge, turn: int | None = None
    ) -> None:
        self.runtime = runtime
        self.trigger = trigger
        self.bridge = bridge  # whose node speaks in this run (its output may be the caller's to hear)
        self.turn = turn  # preset when an adopter resumes a turn its previous owner had started
        self.resumed = turn is not None
        self.cancelled = False
        self.interrupted_by: Message | None = None
        self.clause: int | None = None  # which interrupt_on clause cut the turn off
        self.span: Span | None = None
        self.task: asyncio.Task[None] | None = None

    def ensure_turn(self) -> int:
        if self.turn is None:
            self.turn = self.runtime.allocate_turn()
        return self.turn

    def delivered_text(self) -> str:
        return "" if self.turn is None else self.runtime.ledger.delivered_text(self.turn)

    async def publish(self, value: Any, event_type: type[Event] | None) -> None:
        if self.cancelled:
            self.runtime.count("dropped_after_interrupt")
            return
        await self.runtime.publish_output(_as_event(value, event_type), self)

    async def execute(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run inline (in the dispatcher), with this run as the current one."""
        token = _CURRENT_RUN.set(self)
        try:
            await coro
        finally:
            _CURRENT_RUN.reset(token)

    async def run_as_task(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run as its own task so an interrupt can cancel it; return once it has fully unwound."""
        self.ensure_turn()

        async def body() -> None:
            _CURRENT_RUN.set(self)
            with tracing.span(
                f"turn {self.turn}", self.trigger.trace, session=self.runtime.session_id, turn=self.turn or 0
            ) as span:
                self.span = span
                await coro

        self.task = asyncio.create_task(body(), name=f"turn:{self.runtime.session_id}:{self.turn}")
        try:
            await asyncio.wait({self.task})
        except asyncio.CancelledError:  # the route itself is closing
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
            raise
        error = None if self.task.cancelled() else self.task.exception()
        if error is not None:
            self.runtime.count("route_errors")
            log.error("session %s turn %s failed", self.runtime.session_id, self.turn, exc_info=error)
            if not self.cancelled:  # tell the caller, rather than leave them waiting in silence
                failure = AgentError(message=f"{type(error).__name__}: {error}", code="turn_failed")
                await self.runtime.guard(self.runtime.publish_output(failure, self), "error report")

    async def interrupt(self, message: Message, clause: int) -> None:
        if self.task is None or self.task.done():
            return
        self.cancelled = True  # from here on nothing of this turn is published
        self.interrupted_by = message
        self.clause = clause
        if self.span is not None:
            self.span.set_attribute("bargein.interrupted_by", type(message.event).__name__)
            self.span.add_event("interrupted", {"bargein.delivered_chars": len(self.delivered_text())})
        self.task.cancel()
        # Let the turn's task take its CancelledError before we spend time on the notice and the
        # log line: the cancelled task was scheduled by cancel(), so one yield runs it first.
        await asyncio.sleep(0)
        await self.runtime.turn_interrupted(self)


def _as_event(value: Any, event_type: type[Event] | None) -> Event:
    if isinstance(value, Event) and (event_type is None or isinstance(value, event_type)):
        return value
    if event_type is not None:
        if isinstance(value, dict):
            return event_type(**value)
        if "content" in event_type.model_fields:
            return event_type.model_validate({"content": value})
    raise BargeinError(
        f"broadcast got {type(value).__name__} {value!r:.80}; yield events or use broadcast(event_type=...)"
    )


class SessionRuntime(SessionProcessor):
    def __init__(
        self,
        session: SessionInfo,
        transport: Transport,
        store: StateStore,
        *,
        agent: Agent,
        epoch: int,
        owner: str,
        tier: Tier = TIER_REASONING,
        state_ttl_ms: int = 24 * 3600 * 1000,
        on_end: Callable[[str], None] | None = None,
    ) -> None:
        self.session = session
        self.agent = agent
        self.session_id = validate_session_id(session.session_id)
        self.transport = transport
        self.store = store
        self.epoch = epoch
        self.owner = owner
        self.tier = tier
        self.state_ttl_ms = state_ttl_ms
        self.on_end = on_end
        self.bridges: list[Bridge] = []
        self.ledger = DeliveryLedger(session.edge_reports_delivery)
        self.counters: collections.Counter[str] = collections.Counter()
        self.last_turn = 0
        self.fenced = False  # another owner took the session over: write nothing more
        self.closed = False
        self._dirty = False
        self._checkpoint_lock = asyncio.Lock()
        self._restored_routes: dict[str, Any] = {}
        self.line_call: LineCall | None = None
        self._listeners: dict[type[Event], bool] = {}
        self.speaking_bridge: Bridge | None = None  # None: every bridge's output reaches the caller
        self.initial_message_sent = False
        self._seq: dict[int, int] = {}
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._dispatch_lock = asyncio.Lock()
        self._dispatcher: asyncio.Task[None] | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if is_line_style(self.agent):
            request = CallRequest.from_options(self.session_id, dict(self.session.options))
            self.line_call = await launch(self.agent, request)
            self.bridges = list(self.line_call.system.bridges)
            self.speaking_bridge = self.line_call.system.speaking_bridge
        else:
            self.bridges = await build_bridges(self.agent, self.session)
        self._name_nodes()
        await self._restore()
        for b, bridge in enumerate(self.bridges):
            for r, route in enumerate(bridge.routes):
                route.bind(self, f"{b}.{r}")
                if route.key in self._restored_routes:
                    route.restore_durable(self._restored_routes[route.key])
        self._dispatcher = asyncio.create_task(self._dispatch_loop(), name=f"dispatch:{self.session_id}")
        for node in self.nodes:
            await self.guard(node.start(), "node start")
        if self.line_call is not None:
            self.line_call.system.attach(self.send_initial_message)
        policy = InterruptPolicy(events=sorted(self.unconditional_interrupts()))
        await self.guard(
            self.transport.publish(Envelope.wrap(self.session_id, policy, epoch=self.epoch), OUT), "policy"
        )
        log.info("session %s running (epoch %d, %d bridges)", self.session_id, self.epoch, len(self.bridges))

    async def close(self, *, checkpoint: bool = True) -> None:
        """Stop working the session here. The checkpoint is taken *before* running turns are
        cancelled, so it records them as running: the next owner resumes them rather than treating
        the shutdown as an interrupt."""
        if self._dispatcher is not None:
            self._dispatcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._dispatcher
            self._dispatcher = None
        if checkpoint:
            await self.checkpoint()
        self.closed = True
        if self.line_call is not None:
            await self.line_call.stop()
        for bridge in self.bridges:
            for route in bridge.routes:
                await route.close()
        for node in self.nodes:
            await self.guard(node.cleanup(), "node cleanup")

    @property
    def nodes(self) -> list[Node]:
        seen: dict[int, Node] = {}
        for bridge in self.bridges:
            seen.setdefault(id(bridge.node), bridge.node)
        return list(seen.values())

    @property
    def active_turns(self) -> int:
        return sum(1 for b in self.bridges for r in b.routes if r.active is not None)

    def _name_nodes(self) -> None:
        taken = {n.id for n in self.nodes if n.id}
        counts: collections.Counter[str] = collections.Counter()
        for node in self.nodes:
            if node.id:
                continue
            base = type(node).__name__
            while True:
                counts[base] += 1
                candidate = base if counts[base] == 1 else f"{base}-{counts[base]}"
                if candidate not in taken:
                    break
            node.id = candidate
            taken.add(candidate)

    # --- input -----------------------------------------------------------------------------------

    async def handle(self, envelope: Envelope, event: Event) -> None:
        """Transport handler: returns once the event has been dispatched (not once turns finish)."""
        if envelope.session != self.session_id:
            self.count("wrong_session")
            log.warning("session %s got a message for %s; ignored", self.session_id, envelope.session)
            return
        message = Message.from_envelope(envelope, event)
        if isinstance(event, SpeechDelivered):
            if self._on_delivery_report(event):
                await self.checkpoint()  # an interrupted answer was corrected: keep it that way
            return
        # Dispatched right here, not via the inbox: an interrupt reaches the running turn without
        # waiting for another task to be scheduled on what may be a busy event loop.
        with tracing.span(
            f"dispatch {envelope.type}", envelope.trace, kind=SpanKind.CONSUMER, session=self.session_id
        ):
            await self._dispatch_guarded(message)
        if isinstance(event, EndCall) and self.on_end is not None:
            self.on_end(self.session_id)  # the caller hung up: the bridges have heard it

    def _on_delivery_report(self, report: SpeechDelivered) -> bool:
        """Record how far the caller got; True if that corrected an interrupted answer."""
        self.ledger.delivered(report.turn, report.seq)
        amended = False
        for node in self.nodes:
            if isinstance(node, ReasoningNode):
                amended |= node.amend_interrupted_turn(report.turn, self.ledger.delivered_text(report.turn))
        return amended

    async def _dispatch_loop(self) -> None:
        """Dispatches what the session's own bridges broadcast, for its other bridges."""
        while True:
            await self._dispatch_guarded(await self._inbox.get())

    async def _dispatch_guarded(self, message: Message) -> None:
        """One event at a time, in order; checkpointed before the caller acknowledges it."""
        async with self._dispatch_lock:
            try:
                await self._dispatch(message)
                if self._dirty:  # before the event is acknowledged, so a new owner would see it
                    await self.checkpoint()
            except Exception:
                self.count("dispatch_errors")
                log.exception("session %s: dispatching %s failed", self.session_id, type(message.event))

    async def _dispatch(self, message: Message) -> None:
        bridges = [b for b in self.bridges if b.accepts(message)]  # the origin hears itself, as on Line's bus
        for bridge in bridges:  # control first: an interrupt acts before anything new starts
            await bridge.apply_control(message)
        for bridge in bridges:
            await bridge.deliver(message)

    # --- turns and output ------------------------------------------------------------------------

    def new_run(self, message: Message, bridge: Bridge, turn: int | None = None) -> TurnRun:
        return TurnRun(self, message, bridge, turn)

    async def send_initial_message(self, bridge: Bridge, text: str) -> None:
        """The greeting, as a turn of the speaking bridge; only once per session."""
        if self.initial_message_sent:
            return
        self.initial_message_sent = True
        run = self.new_run(
            Message(AgentResponse(content=text), source="system", session=self.session_id), bridge
        )
        await self.publish_output(AgentResponse(content=text), run)
        await self.publish_output(AgentGenerationComplete(), run)
        if isinstance(bridge.node, ReasoningNode):
            bridge.node.conversation_events.append(AgentResponse(content=text))
        self.forget_turn(run)
        await self.checkpoint()

    def mark_dirty(self) -> None:
        self._dirty = True

    def allocate_turn(self) -> int:
        self.last_turn += 1
        return self.last_turn

    async def publish_output(self, event: Event, run: TurnRun) -> None:
        turn = run.ensure_turn()
        seq = self._seq.get(turn, -1) + 1
        self._seq[turn] = seq
        source = run.bridge.node.id or ""
        envelope = Envelope.wrap(
            self.session_id,
            event,
            turn=turn,
            seq=seq,
            epoch=self.epoch,
            source=source,
        )
        if self.speaking_bridge is None or run.bridge is self.speaking_bridge:
            if isinstance(event, AgentResponse):
                self.ledger.published(turn, seq, event.content)
            await self.transport.publish(envelope, OUT)
            self.count("published")
        else:
            self.count("background_outputs")  # a background node: heard by the other bridges only
        # the session's bridges hear it too (background nodes, Line-style); skipped when none listens,
        # which is the common case and keeps a busy worker's event loop free for interrupts
        if self._heard_by_bridges(type(event)):
            self._inbox.put_nowait(Message.from_envelope(envelope, event))

    def unconditional_interrupts(self) -> set[str]:
        """Events that always cut off a turn the caller hears (no condition on the clause)."""
        bridges = [self.speaking_bridge] if self.speaking_bridge is not None else self.bridges
        return {
            event.type_name()
            for bridge in bridges
            for route in bridge.routes
            if route.runs_as_turns
            for clause in route.interrupts
            if clause.condition is None
            for event in clause.types
        }

    def _heard_by_bridges(self, event_type: type[Event]) -> bool:
        heard = self._listeners.get(event_type)
        if heard is None:
            heard = any(route.listens_to(event_type) for bridge in self.bridges for route in bridge.routes)
            self._listeners[event_type] = heard
        return heard

    async def turn_interrupted(self, run: TurnRun) -> None:
        self.count("interrupts")
        self.mark_dirty()
        if run.turn is None:
            return
        log.info(
            "session %s: turn %d interrupted by %s",
            self.session_id,
            run.turn,
            type(run.interrupted_by.event).__name__ if run.interrupted_by else "?",
        )
        notice = Envelope.wrap(
            self.session_id, TurnInterrupted(turn=run.turn), turn=run.turn, epoch=self.epoch
        )
        await self.transport.publish(notice, OUT)

    async def turn_started(self, run: TurnRun) -> None:
        run.ensure_turn()
        if run.resumed:
            self.count("turns_resumed")
            log.info("session %s: resuming turn %d after a change of owner", self.session_id, run.turn)
        await self.checkpoint()

    def forget_turn(self, run: TurnRun) -> None:
        if run.turn is not None:
            self._seq.pop(run.turn, None)

    async def turn_finished(self, run: TurnRun | None) -> None:
        if run is not None and run.turn is not None:
            self.forget_turn(run)
            self.ledger.forget_before(run.turn - 16)  # late delivery reports only concern recent turns
        await self.checkpoint()

    # --- state -----------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {
            "last_turn": self.last_turn,
            "initial_message_sent": self.initial_message_sent,
            "nodes": {node.id: snapshot.capture(node) for node in self.nodes if node.id},
            "routes": {
                route.key: route.durable_state()
                for bridge in self.bridges
                for route in bridge.routes
                if route.runs_as_turns
            },
        }

    async def checkpoint(self) -> None:
        """Write the session's state under our epoch. Serialised, and the snapshot is taken inside
        the lock, so a slow write can never overwrite a newer one."""
        async with self._checkpoint_lock:
            if self.fenced or self.closed:
                return
            self._dirty = False
            try:
                data = snapshot.dumps(self.snapshot())
                await self.store.save_state(self.tier, self.session_id, self.epoch, data, self.state_ttl_ms)
                self.count("checkpoints")
            except StaleEpochError:
                self.fenced = True
                self.count("fenced")
                log.warning(
                    "session %s: epoch %d was fenced; another owner has it", self.session_id, self.epoch
                )
            except Exception:
                self._dirty = True
                self.count("checkpoint_errors")
                log.exception("session %s: checkpoint failed", self.session_id)

    async def _restore(self) -> None:
        data = await self.store.load_state(self.tier, self.session_id)
        if data is None:
            return
        state = snapshot.loads(data)
        self.last_turn = int(state.get("last_turn", 0))
        self.initial_message_sent = bool(state.get("initial_message_sent", False))
        by_id = {node.id: node for node in self.nodes}
        for node_id, attrs in state.get("nodes", {}).items():
            node = by_id.get(node_id)
            if node is None:
                log.warning("session %s: checkpoint names unknown node %r", self.session_id, node_id)
                continue
            snapshot.restore(node, attrs)
        self._restored_routes = dict(state.get("routes", {}))
        log.info("session %s restored at turn %d", self.session_id, self.last_turn)

    # --- errors and counters ---------------------------------------------------------------------

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    async def guard(self, awaitable: Awaitable[T], what: str, default: T | None = None) -> T | None:
        """Await user code; its failure is logged and counted but never takes the session down."""
        try:
            return await awaitable
        except Exception:
            self.count(f"{what.replace(' ', '_')}_errors")
            log.exception("session %s: %s raised", self.session_id, what)
            return default
