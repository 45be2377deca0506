"""Running one route in a session: its queue, its worker, a run of it, and cutting a run off.

Every route of a session gets a :class:`RouteExecutor` with a queue and a worker task of its own.
The session's dispatcher hands each event to the executors twice, and neither waits for any
route's work:

1. :meth:`RouteExecutor.admit` (no awaiting): note suspend and resume, and queue the event if its
   type starts the route. The event carries the session's dispatch index, its place in the order.
2. :meth:`RouteExecutor.control`: the event's interrupt and suspend clauses act right here, so an
   interrupt cancels the running turn the moment it is dispatched, whatever else the session is
   doing. It only ever cuts off work that was dispatched before it.

The worker takes its queue in order. A *turn route* (it streams, or it can be interrupted) runs one
turn at a time, each as a :class:`TurnRun` in a task of its own that an interrupt can cancel; when
a cut-off turn has unwound, the clause's handler runs, and only then the next turn. Before a turn
starts it waits at a barrier until every other route that does not run as turns has finished the
events dispatched before its trigger, so the turn sees their effects (the transcript that
``map(node.add_event)`` puts in the history before ``UserStoppedSpeaking`` starts the answer); a
concurrent (Line) route's run, until it first waits.
Every other route runs each event through its pipeline in its own worker, in order: a slow
``.map()`` holds up nothing but its own route.

What an executor has not finished is in :meth:`RouteExecutor.durable_state`, which the session
checkpoints before it acknowledges the event: an adopter runs it again (a running turn keeps its
number, so the edge drops the chunks the caller already has).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar, cast

from opentelemetry.trace import Span
from pydantic import BaseModel

from bargein import metrics, tracing
from bargein.agent.calling import call_flexible, close_generator
from bargein.agent.events import AgentError, Event, register_model
from bargein.agent.message import Message
from bargein.agent.routes import Bridge, Callback, Clause, Route
from bargein.agent.turn import reset_current_run, set_current_run
from bargein.errors import BargeinError
from bargein.tasks import cancel_and_wait
from bargein.wire.envelope import decode_message, encode_message

log = logging.getLogger("bargein.runtime.executor")

T = TypeVar("T")

WorkKind = Literal["trigger", "cut", "suspend", "resume"]


class RouteHost(Protocol):
    """What an executor and its runs need from the session that owns them."""

    session_id: str
    holding: bool  # the process drains: start no new turn (it is handed over with the checkpoint)

    def count(self, name: str, n: int = 1) -> None: ...

    async def guard(self, awaitable: Awaitable[T], what: str, default: T | None = None) -> T | None: ...

    def allocate_turn(self) -> int: ...

    def delivered_text(self, turn: int) -> str: ...

    async def publish_output(self, event: Event, run: TurnRun) -> None: ...

    async def turn_started(self, run: TurnRun) -> None: ...

    async def turn_may_start(self) -> None:
        """Wait until a new turn may start (after a hand-over, for the edge's record of what the
        caller heard)."""

    async def turn_interrupted(self, run: TurnRun) -> None: ...

    async def turn_finished(self, run: TurnRun | None) -> None: ...

    async def checkpoint(self) -> None: ...

    def checkpoint_soon(self) -> None:
        """Checkpoint shortly (coalesced): for work done outside a turn."""

    def earlier_work_done(self, index: int) -> bool:
        """Whether every route that does not run as turns has finished the events before ``index``."""

    async def wait_for_progress(self) -> None:
        """Return the next time some route finishes a piece of work."""

    def progressed(self) -> None: ...


@dataclass
class Work:
    """One item on a route's queue."""

    kind: WorkKind  # trigger: run the route; cut: only the handler of a cut-off turn is left;
    #                 suspend / resume: the clause's handler
    message: Message  # the trigger, or the event that called the handler
    index: int  # the session's dispatch order
    turn: int | None = None  # a turn started by a previous owner keeps its number
    interrupted_by: Message | None = None  # cut: the event that cut the turn off
    clause: int | None = None  # cut: into route.cutting; suspend / resume: into that clause list
    dropped: bool = False  # an interrupt dropped this trigger while it waited at the barrier

    def to_state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "index": self.index,
            "message": encode_message(self.message),
            "turn": self.turn,
            "by": None if self.interrupted_by is None else encode_message(self.interrupted_by),
            "clause": self.clause,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Work:
        by = state.get("by")
        return cls(
            kind=state["kind"],
            message=decode_message(state["message"]),
            index=int(state["index"]),
            turn=state.get("turn"),
            interrupted_by=None if by is None else decode_message(by),
            clause=state.get("clause"),
        )


class TurnRun:
    """One run of a route. It gets a turn number when it first publishes (turn routes: when they
    start); its chunks are numbered from 0; after an interrupt it publishes nothing more."""

    def __init__(
        self, host: RouteHost, trigger: Message, bridge: Bridge, *, index: int = 0, turn: int | None = None
    ) -> None:
        self.host = host
        self.trigger = trigger
        self.bridge = bridge  # whose node speaks in this run (its output may be the caller's to hear)
        self.index = index  # the trigger's dispatch index: interrupts cut only runs triggered before them
        self.turn = turn  # preset when an adopter resumes a turn its previous owner had started
        self.resumed = turn is not None
        self.cancelled = False
        self.discarded = False  # a speculative turn dropped: it never happened (no handler, no notice)
        self.interrupted_by: Message | None = None
        self.clause: int | None = None  # which cutting clause (route.cutting) cut the turn off
        self.span: Span | None = None
        self.task: asyncio.Task[None] | None = None
        self.generating = asyncio.Event()  # the run has reached its pipeline (the generator)
        # a checkpoint was written after this run, cut off, had unwound: it holds the cut already
        self.cut_written = False
        self._seq = -1

    def ensure_turn(self) -> int:
        if self.turn is None:
            self.turn = self.host.allocate_turn()
        return self.turn

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    @property
    def last_seq(self) -> int:
        """The number last given out (0 before any): what an unnumbered message is stamped with."""
        return max(self._seq, 0)

    def delivered_text(self) -> str:
        return "" if self.turn is None else self.host.delivered_text(self.turn)

    async def publish(self, value: Any, event_type: type[Event] | None) -> None:
        if self.cancelled:
            self.host.count("dropped_after_interrupt")
            return
        await self.host.publish_output(as_event(value, event_type), self)

    async def run_inline(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run in the calling task (the route's worker), with this run as the current one."""
        token = set_current_run(self)
        try:
            await coro
        finally:
            reset_current_run(token)

    async def run_as_task(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run as its own task so an interrupt can cancel it; return once it has fully unwound."""
        self.ensure_turn()

        async def body() -> None:
            set_current_run(self)
            tracing.SESSION.set(self.host.session_id)  # this task's own context: its log lines
            tracing.TURN.set(self.turn)
            with tracing.span(
                f"turn {self.turn}", self.trigger.trace, session=self.host.session_id, turn=self.turn or 0
            ) as span:
                self.span = span
                await coro

        task = self.task = asyncio.create_task(body(), name=f"turn:{self.host.session_id}:{self.turn}")
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:  # the route itself is closing
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            raise
        finally:
            # The task's context holds this run, and its exception the frames that hold it too: let
            # go of the task, so that all of it goes when the turn does, not at the collector's
            # next pass (a cycle per barge-in was most of this process's garbage collection).
            self.task = None
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self.host.count("route_errors")
            log.error("session %s turn %s failed", self.host.session_id, self.turn, exc_info=error)
            if not self.cancelled:  # tell the caller, rather than leave them waiting in silence
                failure = AgentError(message=f"{type(error).__name__}: {error}", code="turn_failed")
                await self.host.guard(self.host.publish_output(failure, self), "error report")

    async def interrupt(self, message: Message, clause: int) -> None:
        task = self.task
        if task is None or task.done():
            return
        self.cancelled = True  # from here on nothing of this turn is published
        self.interrupted_by = message
        self.clause = clause
        if self.span is not None:
            self.span.set_attribute("bargein.interrupted_by", type(message.event).__name__)
            self.span.add_event("interrupted", {"bargein.delivered_chars": len(self.delivered_text())})
            tracing.link_current_to(self.span)  # the interrupt's own trace points at the turn it cut
        if not self.generating.is_set():
            # Cut off before it reached its generator (a resumed turn, just restarted): the caller
            # is told at once, and the cancel lands in the generator, which records what was heard.
            await self.host.turn_interrupted(self)
            reached = asyncio.ensure_future(self.generating.wait())
            await asyncio.wait({reached, task}, return_when=asyncio.FIRST_COMPLETED)
            reached.cancel()
            task.cancel()
            return
        task.cancel()
        # Let the turn's task take its CancelledError before we spend time on the notice and the
        # log line: the cancelled task was scheduled by cancel(), so one yield runs it first.
        await asyncio.sleep(0)
        metrics.INTERRUPT_TO_CANCEL.observe(metrics.since(message.timestamp))
        await self.host.turn_interrupted(self)

    def discard(self) -> None:
        """Drop this run without trace (a speculative turn the caller spoke on through): nothing
        more of it is published, its task is cancelled, and no handler or notice follows."""
        self.cancelled = self.discarded = True
        if self.task is not None:
            self.task.cancel()


def _before(trigger: Message, index: int, interrupt: Message, at: int) -> bool:
    """Whether ``trigger`` (dispatched at ``index``) came before ``interrupt`` (dispatched at
    ``at``), so the interrupt may cut what it started: dispatched before it, and not sent after it.
    The second half matters where control and data travel apart (a partition's two queues,
    ``BARGEIN_MAILBOXES=partitioned``): the start of what the caller says (control) can then be
    dispatched after its end (data), and must not cut the turn that answers it. Send times are the
    producers' clocks (``Message.timestamp``): one process for a caller's start and end."""
    return index < at and trigger.timestamp <= interrupt.timestamp


def _clause_for(clauses: list[Clause], message: Message) -> Clause | None:
    """The first clause ``message``'s event belongs to."""
    return next((c for c in clauses if isinstance(message.event, c.types)), None)


def as_event(value: Any, event_type: type[Event] | None) -> Event:
    """What ``.broadcast()`` publishes for a value: the event itself, or ``event_type`` wrapping it."""
    if isinstance(value, Event) and (event_type is None or isinstance(value, event_type)):
        return value
    if isinstance(value, BaseModel) and event_type is None:  # a plain pydantic model: Line's events
        register_model(type(value))
        return cast(Event, value)
    if event_type is not None:
        if isinstance(value, dict):
            return event_type(**value)
        if "content" in event_type.model_fields:
            return event_type.model_validate({"content": value})
    raise BargeinError(
        f"broadcast got {type(value).__name__} {value!r:.80}; yield events or use broadcast(event_type=...)"
    )


class RouteExecutor:
    """Runs one route of one session (see the module docstring)."""

    def __init__(self, route: Route, host: RouteHost, key: str) -> None:
        self.route = route
        self.host = host
        self.key = key  # the route's place in the session ("bridge.route"): names its checkpoint
        self.turns = route.runs_as_turns
        self.suspended = False
        self.queue: collections.deque[Work] = collections.deque()
        self.current: Work | None = None  # what the worker has taken and not finished
        self.active: TurnRun | None = None  # the running turn (turn routes)
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._running: dict[asyncio.Task[None], Work] = {}  # a concurrent route's work under way
        self._cut_in_snapshot: TurnRun | None = None  # see durable_state
        self._unstarted: set[asyncio.Task[None]] = set()  # ... of which not yet run to its first wait
        # when the latest interrupt that found nothing to cut was emitted: see _overtaken
        self._uncut_interrupt_at = 0.0

    def start(self) -> None:
        self._worker = asyncio.create_task(self._work(), name=f"route:{self.host.session_id}:{self.key}")

    def stop(self) -> None:
        """Stop the worker where it stands (it starts nothing more); :meth:`close` waits for it."""
        if self._worker is not None:
            self._worker.cancel()
        for task in self._running:
            task.cancel()

    async def close(self) -> None:
        self.stop()
        await cancel_and_wait(self._worker)
        self._worker = None
        await asyncio.gather(*self._running, return_exceptions=True)

    @property
    def oldest_index(self) -> int | None:
        """The dispatch index of the oldest event this route has not finished with: what a turn's
        barrier waits for. A concurrent (Line) route's run counts until it has first waited: by then
        what it does at once (``add_event``) is done, and what it waits for (a debounce's sleep)
        holds up no turn, as on Line, where every route ran on its own."""
        unfinished = [w.index for t, w in self._running.items() if t in self._unstarted]
        if self.current is not None:
            unfinished.append(self.current.index)
        elif self.queue:
            unfinished.append(self.queue[0].index)
        return min(unfinished, default=None)

    # --- the dispatcher's side: never waits for the route's work --------------------------------

    def admit(self, message: Message, index: int) -> bool:
        """Note suspend and resume, and queue what ``message`` starts. True if anything was queued
        (the session then checkpoints before the event is acknowledged)."""
        route = self.route
        queued = False
        if _clause_for(route.suspends, message) is not None:
            self.suspended = True
        resume = _clause_for(route.resumes, message)
        if resume is not None:
            self.suspended = False
            if resume.handler is not None:
                self._enqueue(Work("resume", message, index, clause=route.resumes.index(resume)))
                queued = True
        if isinstance(message.event, route.matcher.types):
            if self.suspended:
                self.host.count("triggers_while_suspended")
            elif self._overtaken(message):
                self.host.count("triggers_overtaken")
            else:
                self._enqueue(Work("trigger", message, index))
                queued = True
        return queued

    async def control(self, message: Message, index: int) -> None:
        """Let ``message``'s interrupt and suspend clauses cut off what was dispatched before it."""
        route = self.route
        clause = _clause_for(route.interrupts, message)
        if clause is not None:
            await self._interrupt(clause.condition, route.cutting.index(clause), message, index)
        clause = _clause_for(route.suspends, message)
        if clause is not None:  # suspending stops what runs, as Line meant it to
            cut = route.cutting.index(clause)
            if not await self._interrupt(None, cut, message, index) and clause.handler is not None:
                self._enqueue(Work("suspend", message, index, clause=route.suspends.index(clause)))

    async def _interrupt(self, condition: Callback | None, clause: int, message: Message, index: int) -> bool:
        """Cut off the running turn (and drop the triggers waiting behind it) if it was started by
        an earlier event and ``condition`` holds. Returns whether a running turn was cut off."""
        if not self._something_to_cut(message, index):
            if condition is None:  # (a condition is asked only when there is something to cut)
                self._uncut_interrupt_at = max(self._uncut_interrupt_at, message.timestamp)
            return False
        if condition is not None:
            ok = await self.host.guard(call_flexible(condition, message), "condition", default=False)
            if not ok:
                self.host.count("interrupts_declined")
                return False
            if not self._something_to_cut(message, index):  # it ended while the condition was evaluated
                return False
        self._drop_triggers_before(message, index)
        run = self.active
        if run is None or run.cancelled or not _before(run.trigger, run.index, message, index):
            return False  # only a trigger waiting at the barrier was there: dropped, no handler
        await run.interrupt(message, clause)
        return True

    def _overtaken(self, trigger: Message) -> bool:
        """Whether an interrupt emitted after ``trigger`` was dispatched before it. Control overtakes
        data that waits in a mailbox (priorities), so when a backlog builds up (the agent's process
        away, the broker restarting), the start of the caller's next utterance may reach the routes
        before the end of the one it follows: it found nothing to cut, and the turn it should have
        cut comes after it. That turn is as stale as one the interrupt found waiting at the barrier
        (:meth:`_drop_triggers_before`): the caller spoke again. The order is the producers' send
        times (``Message.timestamp``): the edge's and the speech tier's clocks, within milliseconds
        of each other, while the reordering spans the backlog."""
        return trigger.timestamp < self._uncut_interrupt_at

    def _something_to_cut(self, interrupt: Message, index: int) -> bool:
        """A turn started before ``interrupt``: running, waiting at the barrier, or still queued. The
        last is there when the interrupt is dispatched beside the turn's trigger (a partition's
        control and data consumers, handing over a backlog side by side), before the route's worker
        has taken the trigger up: let be, it ran in full and the caller's next words got an answer
        of their own (the fault suite's RabbitMQ stop_app test, two texts typed in the outage)."""
        run = self.active
        return (
            (run is not None and not run.cancelled and _before(run.trigger, run.index, interrupt, index))
            or self._waiting(interrupt, index)
            or bool(self._queued_before(interrupt, index))
        )

    def _queued_before(self, interrupt: Message, index: int) -> list[Work]:
        """The triggers queued at this route from before ``interrupt``."""
        return [
            w for w in self.queue if w.kind == "trigger" and _before(w.message, w.index, interrupt, index)
        ]

    def _waiting(self, interrupt: Message, index: int) -> bool:
        """Whether the worker holds a trigger from before ``interrupt`` that waits at the barrier."""
        work = self.current
        return (
            self.active is None
            and work is not None
            and work.kind == "trigger"
            and _before(work.message, work.index, interrupt, index)
        )

    def _drop_triggers_before(self, interrupt: Message, index: int) -> None:
        """Triggers that arrived before an interrupt are stale: the caller spoke again."""
        stale = self._queued_before(interrupt, index)
        if stale:
            self.queue = collections.deque(w for w in self.queue if w not in stale)
            self.host.count("triggers_dropped", len(stale))
        if self._waiting(interrupt, index) and self.current is not None:
            self.current.dropped = True  # wakes the worker, which lets it go
            self.host.count("triggers_dropped")
            self.host.progressed()

    def _enqueue(self, work: Work) -> None:
        self.queue.append(work)
        self._wakeup.set()

    def discard_since(self, index: int) -> None:
        """Forget the work of events dispatched at ``index`` or later (a dropped speculative turn):
        queued work is removed, a trigger waiting at the barrier let go, a running turn discarded
        (:meth:`TurnRun.discard`), a concurrent route's runs cancelled. :meth:`busy_since` says
        when it has all unwound."""
        self.queue = collections.deque(w for w in self.queue if w.index < index)
        work = self.current
        if self.active is None and work is not None and work.kind == "trigger" and work.index >= index:
            work.dropped = True
            self.host.progressed()
        if self.active is not None and self.active.index >= index:
            self.active.discard()
        for task, running in self._running.items():
            if running.index >= index:
                task.cancel()

    def busy_since(self, index: int) -> bool:
        """Whether work of an event dispatched at ``index`` or later is still under way."""
        work = self.current
        return (
            (self.active is not None and self.active.index >= index)
            or (work is not None and work.index >= index)
            or any(w.index >= index for w in self._running.values())
        )

    # --- the worker ------------------------------------------------------------------------------

    def nudge(self) -> None:
        """Have the worker look at its queue again (the session started holding, say)."""
        self._wakeup.set()

    async def _next(self) -> Work:
        # a turn route whose session holds leaves its queue as it is, for the next owner
        while not self.queue or (self.turns and self.host.holding and self.queue[0].kind == "trigger"):
            self._wakeup.clear()
            await self._wakeup.wait()
        return self.queue.popleft()

    async def _work(self) -> None:
        while True:
            work = await self._next()
            self.current = work
            try:
                await self._do(work)
            finally:
                self.current = None
                self.host.progressed()

    async def _do(self, work: Work) -> None:
        route = self.route
        if work.kind == "cut":  # restored after a failover: the turn was cut off; its handler is left
            assert work.clause is not None and work.interrupted_by is not None
            await self._run_handler(route.cutting[work.clause].handler, work.interrupted_by, "interrupt")
            self.current = None  # done: the checkpoint must not hand it to an adopter again
            await self.host.turn_finished(None)
        elif work.kind in ("suspend", "resume"):
            assert work.clause is not None
            clauses = route.suspends if work.kind == "suspend" else route.resumes
            await self._run_handler(clauses[work.clause].handler, work.message, work.kind)
            self.host.checkpoint_soon()
        elif self.suspended and work.turn is None:
            self.host.count("triggers_while_suspended")
        elif self.turns:
            await self._run_turn(work)
        elif route.concurrent:  # Line's way: this message's run goes on while the next is taken
            task = asyncio.create_task(
                self._run_inline(work), name=f"route:{self.host.session_id}:{self.key}"
            )
            self._running[task] = work
            self._unstarted.add(task)
            task.add_done_callback(self._inline_done)
        else:
            await self._run_inline(work)

    async def _run_inline(self, work: Work) -> None:
        task = asyncio.current_task()
        if task in self._unstarted:  # a concurrent run: once it first waits, the barrier lets go
            self._unstarted.discard(task)
            asyncio.get_running_loop().call_soon(self.host.progressed)
        if await self._matches(work.message):
            run = TurnRun(self.host, work.message, self.route.bridge, index=work.index)
            await self.host.guard(run.run_inline(self._execute(work.message, run)), "route")
        self.host.checkpoint_soon()

    def _inline_done(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        self._unstarted.discard(task)
        self.host.progressed()

    async def _matches(self, message: Message) -> bool:
        matched = await self.host.guard(self.route.matcher.matches(message), "filter", default=False)
        return bool(matched)

    async def _run_turn(self, work: Work) -> None:
        if work.turn is None:  # a new turn (a resumed one passed all this with its first owner)
            await self.host.turn_may_start()
            # the barrier: what the events before this trigger do to the nodes happens first
            while not work.dropped and not self.host.earlier_work_done(work.index):
                await self.host.wait_for_progress()
            if work.dropped or not await self._matches(work.message):
                return
        run = TurnRun(self.host, work.message, self.route.bridge, index=work.index, turn=work.turn)
        self.active = run
        try:
            await run.run_as_task(self._turn_body(run))
        finally:
            self.active = None
        if run.discarded:  # a speculative turn dropped: the session puts its nodes back
            return
        if run.interrupted_by is not None and run.clause is not None:
            # Record the cut history (and that only the handler is left) before running it, so an
            # adopter runs the handler rather than the turn if this process dies meanwhile. Usually
            # the interrupt's own checkpoint, written once the turn had unwound, did.
            self.current = Work("cut", run.trigger, work.index, run.turn, run.interrupted_by, run.clause)
            if not run.cut_written:
                await self.host.checkpoint()
            await self._run_handler(self.route.cutting[run.clause].handler, run.interrupted_by, "interrupt")
        self.current = None  # done: the checkpoint must not hand it to an adopter again
        await self.host.turn_finished(run)

    async def _turn_body(self, run: TurnRun) -> None:
        await self.host.turn_started(run)
        run.generating.set()
        await self._execute(run.trigger, run)

    async def _run_handler(self, handler: Callback | None, message: Message, kind: str) -> None:
        if handler is not None:
            await self.host.guard(call_flexible(handler, message), f"{kind} handler")

    # --- the pipeline ----------------------------------------------------------------------------

    async def _execute(self, value: Any, run: TurnRun, index: int = 0) -> None:
        """Push ``value`` through the route's steps from ``index`` on."""
        steps = self.route.steps
        for i in range(index, len(steps)):
            step = steps[i]
            if step.kind == "map":
                value = await call_flexible(step.fn, value)
                if value is None and step.stops_on_none:
                    return
            elif step.kind == "filter":
                if not await call_flexible(step.fn, value):
                    return
            elif step.kind == "broadcast":
                if value is not None:  # nothing to say (Line's rule): not an error
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

    # --- checkpoints -----------------------------------------------------------------------------

    def durable_state(self) -> dict[str, Any]:
        """What an adopter needs to carry on: the work not finished, in order, and suspension."""
        work: list[Work] = []
        run = self.active
        self._cut_in_snapshot = None
        if run is not None:  # the running turn, as it stands (a cut-off one: only its handler is left)
            kind: WorkKind = "cut" if run.interrupted_by is not None else "trigger"
            work.append(Work(kind, run.trigger, run.index, run.turn, run.interrupted_by, run.clause))
            if kind == "cut" and run.task is not None and run.task.done():  # the nodes hold the cut too
                self._cut_in_snapshot = run
        elif self.current is not None and not self.current.dropped:
            work.append(self.current)
        work[:0] = sorted(self._running.values(), key=lambda w: w.index)  # run again by an adopter
        work.extend(self.queue)
        return {"suspended": self.suspended, "work": [w.to_state() for w in work]}

    def state_written(self) -> None:
        """The checkpoint that took :meth:`durable_state` is written."""
        if self._cut_in_snapshot is not None:
            self._cut_in_snapshot.cut_written = True
            self._cut_in_snapshot = None

    def restore(self, state: dict[str, Any]) -> None:
        self.suspended = bool(state.get("suspended", False))
        self.queue.extend(Work.from_state(w) for w in state.get("work", []))
        if self.queue:
            self._wakeup.set()
