"""One session, running in whichever process owns it.

:class:`SessionRuntime` is the same code in process and distributed; only the transport and the
state store behind it differ. The path of an event:

1. the transport hands the decoded envelope to :meth:`SessionRuntime.handle`, one at a time in
   mailbox order, and acknowledges it when that returns; what the session's own bridges broadcast
   comes back through the session's inbox instead;
2. :meth:`SessionRuntime._dispatch` gives the event the next dispatch index and hands it to every
   route's :class:`~bargein.runtime.executor.RouteExecutor`: first to queue it (``admit``), then to
   act on its control clauses (``control``), where an interrupt cancels the running turn at once and
   :class:`~bargein.agent.events.TurnInterrupted` goes out before the turn has even unwound;
3. if any route queued the event, the session is checkpointed before the event is acknowledged, so
   a new owner would run that work; the routes do it in their own tasks, never under the dispatcher;
4. everything a run broadcasts goes out through :meth:`SessionRuntime.publish_output`, stamped with
   (session, turn, seq, epoch) and recorded in the :class:`~bargein.runtime.ledger.DeliveryLedger`
   (the numbers of what the caller gets have no gaps: an edge that finds one asks again,
   ``OutputMissed``, and gets what the ledger kept);
5. after each finished turn and each interrupt handler the nodes and the routes' unfinished work are
   checkpointed to the state store under the owner's epoch.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from opentelemetry.trace import SpanKind

from bargein import metrics, tracing
from bargein.agent.events import (
    CALLER_EVENTS,
    AgentGenerationComplete,
    AgentResponse,
    AgentSpeechSent,
    EndCall,
    Event,
    HeardRecord,
    InterruptPolicy,
    OutputMissed,
    SpeculationDropped,
    SpeculativeTurn,
    SpeechDelivered,
    TurnInterrupted,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.message import Message, Source
from bargein.agent.nodes import Node, ReasoningNode
from bargein.agent.routes import Bridge
from bargein.errors import (
    AgentFailedToStart,
    BrokerUnavailable,
    NotOwner,
    SessionRejected,
    StaleEpochError,
    UnroutableError,
)
from bargein.metrics import Counted
from bargein.runtime import journal, snapshot
from bargein.runtime.agents import Agent, AgentSession, launch_agent
from bargein.runtime.executor import RouteExecutor, TurnRun
from bargein.runtime.ledger import DeliveryLedger
from bargein.runtime.speculation import Action, Speculation, restore_nodes, save_nodes
from bargein.tasks import cancel_and_wait
from bargein.transport.abc import Heartbeat, SessionProcessor, StateStore, Transport
from bargein.wire.envelope import Envelope, message_of, validate_session_id
from bargein.wire.names import OUT, TIER_REASONING, Tier
from bargein.wire.session_info import SessionInfo

log = logging.getLogger("bargein.runtime")

OUTPUT_RETRY_S = 0.5  # a turn's output that found no broker tries again this soon

T = TypeVar("T")

DROP_UNWIND_S = 5.0  # how long a dropped speculative turn's work may take to unwind
SPECULATION_BARRIER_S = 1.0  # how long a speculative turn waits for earlier work (as a turn would)
HANDOVER_RECORD_WAIT_S = 1.0  # after a change of owner, how long a new turn waits for the edge's record


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
        self.agent_session = AgentSession([])
        self._nodes: list[Node] = []
        self._nodes_of: AgentSession | None = None
        self.executors: list[RouteExecutor] = []
        self.ledger = DeliveryLedger(session.edge_reports_delivery)
        self.counters: collections.Counter[str] = Counted("reasoning")
        self.last_turn = 0
        self.next_index = 0  # dispatch order, across the session's owners (checkpointed)
        self.initial_message_sent = False
        self.fenced = False  # another owner took the session over: write nothing more
        self.holding = False  # draining: no new turns start here (they are handed over)
        self.closed = False
        self.last_activity = time.monotonic()
        self.lease_deadline = math.inf  # set by the host (SessionProcessor)
        self.lease_confirmed_at = math.inf  # set by the host too: until then, no heartbeat is older
        self.liveness: Heartbeat | None = None
        self._dirty = False
        self._checkpoint_lock = asyncio.Lock()
        self._journal = journal.Journal()  # the nodes' long lists, as the log holds them
        self._flusher: asyncio.Task[None] | None = None
        self._restored_routes: dict[str, Any] = {}
        self._listeners: dict[type[Event], bool] = {}
        self._inline: list[RouteExecutor] = []  # executors of routes that do not run as turns
        self._progress = asyncio.Event()
        self._record_arrived = asyncio.Event()  # the edge said what the caller heard (HeardRecord)
        self._untold: set[int] = set()  # a predecessor's turns reported before the record came
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._dispatcher: asyncio.Task[None] | None = None
        self.speculation: Speculation | None = None  # a turn started before the caller's turn was sure
        # what a confirmed speculative turn held, going out; what it says meanwhile queues behind
        self._releasing: collections.deque[Action] | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        try:
            self.agent_session = await launch_agent(self.agent, self.session)
        except SessionRejected:
            raise
        except Exception as exc:  # the agent's own code: retrying it elsewhere would fail the same way
            raise AgentFailedToStart(f"the agent could not start: {type(exc).__name__}: {exc}") from exc
        self._name_nodes()
        restored = await self._restore()
        if self.session.turns_before > self.last_turn:
            # given back by its edge after its records were lost (edge/records.py): its turns are
            # numbered after those the caller had, and a greeting was said then already
            self.last_turn = self.session.turns_before
            self.initial_message_sent = True
        for b, bridge in enumerate(self.bridges):
            for r, route in enumerate(bridge.routes_to_run()):
                executor = RouteExecutor(route, self, f"{b}.{r}")
                if executor.key in self._restored_routes:
                    executor.restore(_route_state(self._restored_routes[executor.key]))
                self.executors.append(executor)
        self._inline = [e for e in self.executors if not e.turns]
        for executor in self.executors:
            executor.start()
        self._dispatcher = asyncio.create_task(self._dispatch_loop(), name=f"dispatch:{self.session_id}")
        for node in self.nodes:
            await self.guard(node.start(), "node start")
        await self.guard(self.agent_session.running(self.greet), "agent start")
        await self._announce(restored=restored)
        log.info("session %s running (epoch %d, %d bridges)", self.session_id, self.epoch, len(self.bridges))

    async def close(self, *, checkpoint: bool = True) -> None:
        """Stop working the session here. The checkpoint is taken *before* running turns are
        cancelled, so it records them as running: the next owner resumes them rather than treating
        the shutdown as an interrupt."""
        await cancel_and_wait(self._dispatcher)
        self._dispatcher = None
        if checkpoint:
            # a speculative turn is nobody's yet: the next owner runs the turn if it is confirmed
            await self.drop_speculation("the session closes here")
            await self.checkpoint()
        self.closed = True
        await cancel_and_wait(self._flusher)
        for executor in self.executors:  # all at once: a route finishing must not let a turn start
            executor.stop()
        await self.guard(self.agent_session.stop(), "agent stop")
        for executor in self.executors:
            await executor.close()
        for node in self.nodes:
            await self.guard(node.cleanup(), "node cleanup")

    def hold(self) -> None:
        self.holding = True
        for executor in self.executors:
            executor.nudge()

    async def _announce(self, *, restored: bool) -> None:
        """Tell the edge the events that always interrupt (``InterruptPolicy``); it answers with what
        the caller heard (``HeardRecord``). A new owner's first new turn waits for that answer,
        briefly: it must see the answer the caller heard from the previous owner. With no edge
        listening (the policy reaches no queue) there is nothing to wait for."""
        policy = InterruptPolicy(events=sorted(self.unconditional_interrupts()))
        try:
            await self.transport.publish(Envelope.wrap(self.session_id, policy, epoch=self.epoch), OUT)
        except UnroutableError:
            self._record_arrived.set()  # no edge: nobody heard anything we do not know
        except Exception:
            self._record_arrived.set()
            self.count("policy_errors")
            log.exception("session %s: publishing the interrupt policy failed", self.session_id)
        else:
            if not restored:  # a new session: nothing was heard before us
                self._record_arrived.set()

    async def turn_may_start(self) -> None:
        """Wait (at most ``HANDOVER_RECORD_WAIT_S``, once) for the edge's record after a hand-over."""
        await self._heard_record()

    async def _heard_record(self) -> None:
        """The edge's record of what the caller heard, once this process has it (after a change of
        owner: it comes in answer to :meth:`_announce`); waited for at most once."""
        if self._record_arrived.is_set():
            return
        try:
            async with asyncio.timeout(HANDOVER_RECORD_WAIT_S):
                await self._record_arrived.wait()
        except TimeoutError:
            self.count("heard_record_timeouts")
            log.warning(
                "session %s: no word from the edge on what the caller heard; going on", self.session_id
            )
        self._record_arrived.set()

    @property
    def bridges(self) -> list[Bridge]:
        return self.agent_session.bridges

    @property
    def speaking_bridge(self) -> Bridge | None:
        return self.agent_session.speaking_bridge

    @property
    def nodes(self) -> list[Node]:
        """The bridges' nodes, each once (asked at every checkpoint and delivery report; the
        bridges are the agent's from the start on, so they are listed once)."""
        if self._nodes_of is not self.agent_session:
            seen: dict[int, Node] = {}
            for bridge in self.bridges:
                seen.setdefault(id(bridge.node), bridge.node)
            self._nodes, self._nodes_of = list(seen.values()), self.agent_session
        return self._nodes

    @property
    def active_turns(self) -> int:
        return sum(1 for e in self.executors if e.active is not None)

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
        """Transport handler: returns once the event has been dispatched (not once routes are done
        with it), so the next event, an interrupt above all, is never held up by a route's work."""
        now = self.last_activity = time.monotonic()
        if not self.surely_owned(now):
            self.count("not_owner")  # thawed after a pause, say: another process may own it now
            raise NotOwner(f"session {self.session_id}: this process may no longer own it")
        bound = tracing.SESSION.set(self.session_id)
        try:
            await self._handle(envelope, event)
        finally:
            tracing.SESSION.reset(bound)

    async def _handle(self, envelope: Envelope, event: Event) -> None:
        if isinstance(event, OutputMissed):  # the broker lost some of a turn on its way
            await self._send_again(event)
            return
        if isinstance(event, SpeechDelivered | HeardRecord) and self.speculation is not None:
            self.speculation.reports.append(message_of(envelope, event))  # again if the nodes go back
        if isinstance(event, SpeechDelivered | HeardRecord):
            # the text so far only when a bridge hears AgentSpeechSent (a report a chunk, each
            # joining the turn's text, cost every answer the square of its length)
            spoken = (
                event
                if isinstance(event, SpeechDelivered) and self._heard_by_bridges(AgentSpeechSent)
                else None
            )
            if (
                spoken is not None
                and not self.ledger.knows(spoken.turn)
                and not self._record_arrived.is_set()
            ):
                # a predecessor's turn, reported after the change of owner: its text comes with the
                # edge's record (control), which a partition's control consumer hands over beside
                # this report, and which a session's own mailbox holds behind it
                if self.transport.partitions(self.tier):
                    await self._heard_record()  # so the bridges hear it before the caller's next words
                else:
                    self._untold.add(spoken.turn)  # told as the record comes
                    spoken = None
            if self._on_delivery_report(event):
                await self.checkpoint()  # an interrupted answer was corrected: keep it that way
            reported = [spoken.turn] if spoken is not None else []
            if isinstance(event, HeardRecord) and self._untold:
                reported, self._untold = sorted(self._untold), set()
            for turn in reported:  # in order with what the caller says next
                await self._speech_sent(message_of(envelope, event), turn)
            return
        speculative = isinstance(event, SpeculativeTurn | SpeculationDropped) or self.speculation is not None
        if speculative and await self._speculative(message_of(envelope, event)):
            return  # started, confirmed or dropped a speculative turn
        # Dispatched right here, not via the inbox: an interrupt reaches the running turn without
        # waiting for another task to be scheduled on what may be a busy event loop.
        with tracing.span(
            f"dispatch {envelope.type}", envelope.trace, kind=SpanKind.CONSUMER, session=self.session_id
        ):
            await self._dispatch(message_of(envelope, event))
        if isinstance(event, EndCall) and self.on_end is not None:
            self.on_end(self.session_id)  # the caller hung up: the bridges have heard it

    async def _send_again(self, missed: OutputMissed) -> None:
        """Publish again what the edge says it never got of a turn, as it was sent (same numbers, so
        the edge's fence drops any that arrive twice). Best effort: the edge lets what it holds go
        after ``BARGEIN_RESEND_WAIT_MS`` whatever happens here."""
        again = self.ledger.again(missed.turn, missed.first, missed.last)
        self.count("output_sent_again", len(again))
        # (an edge that asks for the rest of a turn asks past its end: only what was sent counts)
        asked = min(missed.last, self.ledger.last_sent(missed.turn)) - missed.first + 1
        if len(again) < asked:
            self.count("output_missed_unknown", asked - len(again))  # a predecessor's, or long gone
        (log.info if again else log.debug)(
            "session %s turn %d: the edge missed chunks %d-%d; sending %d of them again",
            self.session_id,
            missed.turn,
            missed.first,
            missed.last,
            len(again),
        )
        for envelope in again:
            try:
                await self.transport.publish(envelope, OUT)
            except (BrokerUnavailable, UnroutableError) as exc:
                self.count("output_sent_again_failed")
                log.warning("session %s: could not send chunks again: %s", self.session_id, exc)
                return

    def _on_delivery_report(self, report: SpeechDelivered | HeardRecord) -> bool:
        """Record how far the caller got; True if that corrected an interrupted answer."""
        if isinstance(report, HeardRecord):  # the edge's answer to our start: the whole record
            for heard in report.turns:
                self.ledger.delivered(heard.turn, heard.seq, heard.text, heard.chars)
            turns = [heard.turn for heard in report.turns]
            self._record_arrived.set()
        else:
            self.ledger.delivered(report.turn, report.seq, chars=report.chars)
            turns = [report.turn]
        final = isinstance(report, SpeechDelivered) and report.final
        amended = False
        for node in self.nodes:
            if isinstance(node, ReasoningNode):
                for turn in turns:
                    if node.amendable(turn, final=final):  # most reports concern no cut answer
                        text = self.ledger.delivered_text(turn)
                        amended |= node.amend_interrupted_turn(turn, text, final=final)
        return amended

    async def _speech_sent(self, report: Message, turn: int) -> None:
        """Tell the bridges what more of ``turn`` the caller was sent, as ``AgentSpeechSent`` (Line's
        agents route it into their history and read it back with ``get_committed_events``). What
        they were told is counted in the checkpoint: a report that reaches the next owner (the
        session moved between the answer and its report) tells them the rest, not nothing (the
        next owner's record of the turn came whole from the edge, so it saw nothing new in it,
        and the model's next request lacked the answer the caller heard), nor all of it again."""
        untold = self.ledger.untold(turn)
        if not untold:
            return
        sent = AgentSpeechSent(content=untold)
        await self._dispatch(dataclasses.replace(report, event=sent, id=uuid.uuid4().hex))

    async def _dispatch_loop(self) -> None:
        """Dispatches what the session's own bridges broadcast, for its other bridges."""
        while True:
            await self._dispatch(await self._inbox.get())

    async def _dispatch(self, message: Message) -> None:
        """Hand ``message`` to every route that hears it, in dispatch order; checkpointed before the
        caller acknowledges it if a route queued work for it."""
        try:
            index = self.next_index
            self.next_index += 1
            hearing = [e for e in self.executors if e.route.bridge.accepts(message)]  # origin included
            for executor in hearing:
                if executor.admit(message, index):
                    self._dirty = True
            for executor in hearing:  # interrupts act now, on what was dispatched before this event
                await executor.control(message, index)
            if self._dirty:
                await self.checkpoint()
        except Exception:
            self.count("dispatch_errors")
            log.exception("session %s: dispatching %s failed", self.session_id, type(message.event))

    # --- speculative turns (runtime/speculation.py) ------------------------------------------------

    async def _speculative(self, message: Message) -> bool:
        """Start, confirm or drop a speculative turn. True if ``message`` was taken care of here;
        False if it is to be dispatched as usual (after the speculation it ended was dropped)."""
        event, speculation = message.event, self.speculation
        if isinstance(event, SpeculativeTurn):
            await self._speculate(message, event.transcript)
            return True
        if isinstance(event, SpeculationDropped):
            await self.drop_speculation("the caller went on")
            return True
        assert speculation is not None
        if (
            isinstance(event, UserTranscriptionReceived)
            and event.content == speculation.transcript
            and not speculation.words_confirmed
        ):
            speculation.words_confirmed = True  # the same words: the stop that follows confirms it
            return True
        if isinstance(event, UserStoppedSpeaking) and speculation.words_confirmed:
            await self._confirm_speculation()
            return True
        await self.drop_speculation(f"{type(event).__name__} came instead")
        return False

    async def _speculate(self, message: Message, transcript: str) -> None:
        """Run the turn the caller's words so far would start, holding what it sends."""
        if self.speculation is not None:
            await self.drop_speculation("a newer one starts")
        await self._wait_for_earlier_work()
        if self._dirty:  # what came before it is durable; nothing of it will be until confirmed
            await self.checkpoint()
        self.count("speculations")
        self.speculation = Speculation(
            transcript, self.next_index, self.last_turn, save_nodes(self.nodes), dict(self.ledger.told)
        )
        log.info("session %s: speculative turn on %r", self.session_id, transcript)
        for event in (UserTranscriptionReceived(content=transcript), UserStoppedSpeaking()):
            await self._dispatch(dataclasses.replace(message, event=event, id=uuid.uuid4().hex))

    async def _wait_for_earlier_work(self) -> None:
        """Wait (up to ``SPECULATION_BARRIER_S``) until the routes that do not run as turns have
        done what was dispatched so far, as a turn's barrier does: the nodes a speculative turn
        saves must be what that work leaves. A Line agent's ``AgentSpeechSent`` added just after
        the save was undone by a drop, which puts the saved nodes back: the caller's last answer
        was gone from the history."""
        index = self.next_index
        try:
            async with asyncio.timeout(SPECULATION_BARRIER_S):
                while not self.earlier_work_done(index):
                    await self.wait_for_progress()
        except TimeoutError:  # a route's own code takes its time: speculate regardless
            self.count("speculation_barrier_timeouts")
            log.warning("session %s: earlier work not done before a speculative turn", self.session_id)

    async def _confirm_speculation(self) -> None:
        speculation, self.speculation = self.speculation, None
        assert speculation is not None
        self.count("speculations_confirmed")
        log.info("session %s: speculative turn confirmed (%d held)", self.session_id, len(speculation.held))
        # each publish waits for the broker, and the turn goes on meanwhile: what it says now
        # joins the queue (_later), or its newer chunks would overtake the held ones, which the
        # edge's fence then drops as stale
        self._releasing = queue = collections.deque(speculation.held)
        try:
            while queue:
                await queue.popleft()()
        finally:
            self._releasing = None
        await self.checkpoint()

    def _later(self, action: Action) -> bool:
        """Hold ``action`` while a speculative turn is unconfirmed, or queue it behind what a
        confirmed one is still letting out; False: it may run now."""
        if self.speculation is not None:
            self.speculation.hold(action)
            return True
        if self._releasing is not None:
            self._releasing.append(action)
            return True
        return False

    async def drop_speculation(self, why: str) -> None:
        """Undo the speculative turn: its work discarded in every route, once that has unwound the
        nodes put back as they were (what the caller's reports corrected meanwhile applied again),
        and what it held forgotten."""
        speculation = self.speculation
        if speculation is None:
            return
        self.count("speculations_dropped")
        log.info("session %s: speculative turn dropped (%s)", self.session_id, why)
        since = speculation.from_index
        for executor in self.executors:
            executor.discard_since(since)
        try:
            async with asyncio.timeout(DROP_UNWIND_S):
                while any(executor.busy_since(since) for executor in self.executors):
                    await self.wait_for_progress()
        except TimeoutError:  # a route's own code does not let go: put the nodes back regardless
            self.count("speculation_unwind_timeouts")
            log.warning("session %s: the dropped turn's work did not unwind in time", self.session_id)
        restore_nodes(self.nodes, speculation.saved)
        self.last_turn = speculation.last_turn  # the next turn is numbered as if it never happened
        self.ledger.told = speculation.told  # what the bridges were told meanwhile went with its work
        for report in speculation.reports:
            assert isinstance(report.event, SpeechDelivered | HeardRecord)
            self._on_delivery_report(report.event)
        self.speculation = None
        for report in speculation.reports:  # told again, as the nodes are now
            if isinstance(report.event, SpeechDelivered) and self._heard_by_bridges(AgentSpeechSent):
                await self._speech_sent(report, report.event.turn)
        if self._dirty:
            await self.checkpoint()

    async def _send_out(self, envelope: Envelope) -> None:
        """Publish ``envelope`` ``out``, or hold it while a speculative turn is unconfirmed."""
        if not self._later(functools.partial(self.transport.publish, envelope, OUT)):
            await self.transport.publish(envelope, OUT)

    # --- the barrier turns wait at (RouteExecutor._run_turn) --------------------------------------

    def earlier_work_done(self, index: int) -> bool:
        return all(e.oldest_index is None or e.oldest_index >= index for e in self._inline)

    async def wait_for_progress(self) -> None:
        self._progress.clear()
        await self._progress.wait()

    def progressed(self) -> None:
        self._progress.set()

    async def inline_routes_idle(self) -> None:
        """Wait until every route that does not run as turns has done what it was handed (the
        in-process test harness waits for this, so a test sees a ``.map()``'s effect after ``emit``)."""
        while any(e.oldest_index is not None for e in self._inline) or not self._inbox.empty():  # noqa: ASYNC110
            await asyncio.sleep(0.001)  # two sources, and the inbox signals nothing: a test-only poll

    # --- turns and output ------------------------------------------------------------------------

    async def greet(self, bridge: Bridge, text: str) -> None:
        """Say ``text`` first, as a turn of ``bridge``; only once per session, whichever process
        runs the agent (an adopter builds it again and it asks again)."""
        if self.initial_message_sent:
            return
        self.initial_message_sent = True
        trigger = Message(AgentResponse(content=text), source=Source.SYSTEM, session=self.session_id)
        run = TurnRun(self, trigger, bridge)
        await self.publish_output(AgentResponse(content=text), run)
        await self.publish_output(AgentGenerationComplete(), run)
        if isinstance(bridge.node, ReasoningNode):
            bridge.node.add_event(AgentResponse(content=text))
        await self.checkpoint()

    def allocate_turn(self) -> int:
        self.last_turn += 1
        return self.last_turn

    def delivered_text(self, turn: int) -> str:
        return self.ledger.delivered_text(turn)

    async def publish_output(self, event: Event, run: TurnRun) -> None:
        if self.closed:  # a turn still unwinding after the session moved on: nothing more goes out
            self.count("dropped_after_close")
            return
        turn = run.ensure_turn()
        # A plain agent's broadcasts all reach the caller; with a speaking node (Line's style) only
        # its events the caller has a use for do, as Line's user bridge forwarded only those
        to_caller = self.speaking_bridge is None or (
            run.bridge is self.speaking_bridge and isinstance(event, CALLER_EVENTS)
        )
        # What the caller gets is numbered without gaps, so the edge can tell one was lost; what
        # only the bridges hear, and control (it overtakes data: no order to keep), takes no number
        numbered = to_caller and not event.control
        seq = run.next_seq() if numbered else run.last_seq
        envelope = Envelope.wrap(
            self.session_id, event, turn=turn, seq=seq, epoch=self.epoch, source=run.bridge.node.id or ""
        )
        # goes out when (if) the caller's turn is confirmed, and after what that turn held
        if not self._later(functools.partial(self._emit_output, envelope, event, run, to_caller)):
            await self._emit_output(envelope, event, run, to_caller)

    async def _emit_output(self, envelope: Envelope, event: Event, run: TurnRun, to_caller: bool) -> None:
        turn, seq = envelope.turn, envelope.seq
        if to_caller:
            if isinstance(event, AgentResponse):
                self.ledger.published(turn, seq, event.content)
            if not event.control:
                self.ledger.sent(envelope)
            await self._publish_while_owned(envelope)
            self.count("published")
            if seq == 0 and not run.resumed:
                metrics.TURN_TO_FIRST_CHUNK.observe(metrics.since(run.trigger.timestamp))
        else:
            self.count("background_outputs")  # heard by the session's bridges only
        # the session's bridges hear it too (background nodes, Line-style); skipped when none listens,
        # which is the common case and keeps a busy worker's event loop free for interrupts
        if self._heard_by_bridges(type(event)):
            self._inbox.put_nowait(message_of(envelope, event))

    async def _publish_while_owned(self, envelope: Envelope) -> None:
        """Publish a turn's output, waiting for the broker for as long as this process owns the
        session. The transport gives up after ``BARGEIN_BROKER_WAIT_S``; a turn does not: nobody
        else may speak for the session while this process holds its lease (kept in Redis, not in
        the broker), so a failed turn would leave the caller with half an answer and no word. A
        RabbitMQ node that froze for longer than that wait (its sockets open, so nobody is told)
        failed every answer in flight; now they go on once it thaws, or once the process has moved
        to another node. An interrupt still cuts the turn while it waits (it cancels the task), and
        the session's close ends the wait. A chunk the broker took before it stalled, sent again,
        is dropped by the edge's fence (its number is not new)."""
        waited_since = None
        while True:
            try:
                await self.transport.publish(envelope, OUT)
            except BrokerUnavailable as exc:
                if self.closed:
                    raise
                if waited_since is None:
                    waited_since = time.monotonic()
                    self.count("output_waited_for_broker")
                    log.warning(
                        "session %s turn %s: its output waits for RabbitMQ (%s); it goes on when it is back",
                        self.session_id,
                        envelope.turn,
                        exc,
                    )
                await asyncio.sleep(OUTPUT_RETRY_S)
                continue
            if waited_since is not None:
                log.info(
                    "session %s turn %s: output flows again after %.1f s",
                    self.session_id,
                    envelope.turn,
                    time.monotonic() - waited_since,
                )
            return

    def unconditional_interrupts(self) -> set[str]:
        """Events that always cut off a turn the caller hears (no condition on the clause)."""
        bridges = [self.speaking_bridge] if self.speaking_bridge is not None else self.bridges
        return {
            event.__name__
            for bridge in bridges
            for route in bridge.routes_to_run()
            if route.runs_as_turns
            for clause in route.interrupts
            if clause.condition is None
            for event in clause.types
        }

    def _heard_by_bridges(self, event_type: type[Event]) -> bool:
        heard = self._listeners.get(event_type)
        if heard is None:
            heard = any(e.route.listens_to(event_type) for e in self.executors)
            self._listeners[event_type] = heard
        return heard

    async def turn_interrupted(self, run: TurnRun) -> None:
        self.count("interrupts")
        self._dirty = True
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
        await self._send_out(notice)

    async def turn_started(self, run: TurnRun) -> None:
        if run.resumed:
            self.count("turns_resumed")
            log.info("session %s: resuming turn %d after a change of owner", self.session_id, run.turn)
        await self.checkpoint()

    async def turn_finished(self, run: TurnRun | None) -> None:
        turn = run.turn if run is not None else None
        if turn is not None and not self._later(functools.partial(self._finish_in_ledger, turn)):
            self.ledger.finished(turn)
        await self.checkpoint()

    async def _finish_in_ledger(self, turn: int) -> None:
        self.ledger.finished(turn)

    # --- state -----------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The session's state; the nodes' long lists are passed through for the journal."""
        return {
            "last_turn": self.last_turn,
            "next_index": self.next_index,
            "initial_message_sent": self.initial_message_sent,
            "told": {str(turn): n for turn, n in self.ledger.told.items()},
            "nodes": {node.id: snapshot.capture(node, long_lists=False) for node in self.nodes if node.id},
            "routes": {e.key: e.durable_state() for e in self.executors},
        }

    async def write_back(self) -> None:
        await self.checkpoint(whole=True)

    async def checkpoint(self, *, whole: bool = False) -> None:
        """Write the session's state under our epoch. Serialised, and the snapshot is taken inside
        the lock, so a slow write can never overwrite a newer one. ``whole``: the store lost what
        was written before, the log included, so every list is written again, item by item."""
        async with self._checkpoint_lock:
            if self.fenced or self.closed:
                return
            if self.speculation is not None:  # nothing of it is durable until it is confirmed
                self._dirty = True
                return
            if whole:
                self._journal.forget_written()
            self._dirty = False
            try:
                state = self.snapshot()
                lengths, change, lists = self._journal.take(state["nodes"], snapshot.pack_item)
                state["journal"] = self._journal.record(lengths)
                data = snapshot.dumps(state)
                await self.store.save_state(
                    self.tier, self.session_id, self.epoch, data, self.state_ttl_ms, log=change
                )
                self._journal.written(lists)
                for executor in self.executors:
                    executor.state_written()
                self.count("checkpoints")
            except StaleEpochError:
                # Another owner has the session, or Redis lost its records (the epoch counter with
                # them): the host's next lease renewal tells which, and closes the session here or
                # takes everything back. Until then nothing is written.
                self._dirty = True
                self.count("checkpoints_refused")
                log.warning(
                    "session %s: checkpoint refused for epoch %d; the next lease renewal decides",
                    self.session_id,
                    self.epoch,
                )
            except Exception:
                self._dirty = True
                self.count("checkpoint_errors")
                log.exception("session %s: checkpoint failed", self.session_id)

    def checkpoint_soon(self) -> None:
        """A checkpoint after work done outside a turn (a ``.map()`` that changed a node), without
        making that route wait for it; several in a row are written once."""
        self._dirty = True
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let what finishes in the same pass of the loop join in
        if self._dirty:
            await self.checkpoint()

    async def _restore(self) -> bool:
        """Load the checkpoint, if there is one (then this is a change of owner): True if so."""
        checkpoint = await journal.read(self.store, self.tier, self.session_id)
        if checkpoint is None:
            return False
        state, self._journal = checkpoint
        self.last_turn = int(state.get("last_turn", 0))
        self.next_index = int(state.get("next_index", 0))
        self.initial_message_sent = bool(state.get("initial_message_sent", False))
        self.ledger.told = {int(turn): int(n) for turn, n in state.get("told", {}).items()}
        by_id = {node.id: node for node in self.nodes}
        for node_id, attrs in state.get("nodes", {}).items():
            node = by_id.get(node_id)
            if node is None:
                log.warning("session %s: checkpoint names unknown node %r", self.session_id, node_id)
                continue
            snapshot.restore(node, attrs)
        self._restored_routes = dict(state.get("routes", {}))
        log.info("session %s restored at turn %d", self.session_id, self.last_turn)
        return True

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


def _route_state(state: dict[str, Any]) -> dict[str, Any]:
    """A route's checkpoint; one written before routes had their own queues (``active`` and
    ``pending`` triggers of turn routes) reads as the same work, in the same order."""
    if "work" in state:
        return state
    work: list[dict[str, Any]] = []
    active = state.get("active")
    if active is not None:
        cut = active.get("interrupted_by") is not None and active.get("clause") is not None
        work.append(
            {
                "kind": "cut" if cut else "trigger",
                "index": 0,
                "message": active["trigger"],
                "turn": active.get("turn"),
                "by": active.get("interrupted_by"),
                "clause": active.get("clause"),
            }
        )
    work.extend({"kind": "trigger", "index": 0, "message": raw} for raw in state.get("pending", []))
    return {"work": work}
