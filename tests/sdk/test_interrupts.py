"""Interrupt semantics beyond the seed's forms: ordering, waiting, idleness, fencing, history."""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

from bargein import (
    AgentResponse,
    Bridge,
    ConversationContext,
    Event,
    Message,
    ReasoningNode,
    SessionInfo,
    SpeechDelivered,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.llm import ScriptedLLM
from bargein.testing import LocalSession
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN

from ..agents import interruptible_agent
from .helpers import ask, reply_text, take_chunks, wait_for

WORDS = " ".join(f"w{i}" for i in range(40))


def slow_llm(first_token_delay: float = 0.005) -> ScriptedLLM:
    return ScriptedLLM([WORDS], first_token_delay=first_token_delay, tokens_per_second=100)


class Recorder(ReasoningNode):
    """Records the order of generation starts, unwinds and handler calls."""

    def __init__(
        self,
        log: list[str],
        *,
        unwind_delay: float = 0.0,
        handler_delay: float = 0.0,
        first_token_delay: float = 0.005,
    ) -> None:
        super().__init__(llm_client=slow_llm(first_token_delay))
        self._log = log
        self._unwind_delay = unwind_delay
        self._handler_delay = handler_delay

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        self._log.append("start")
        try:
            async for text in self.generate_response(context):
                yield AgentResponse(content=text)
        except asyncio.CancelledError:
            await asyncio.sleep(self._unwind_delay)  # slow cleanup: the handler must still wait
            self._log.append("unwound")
            raise
        self._log.append("completed")

    async def on_interrupt_generate(self, message: Message) -> None:
        self._log.append("handler-start")
        await asyncio.sleep(self._handler_delay)
        self._log.append("handler-end")


def recorder_agent(log: list[str], **kw: Any) -> Any:
    return interruptible_agent(lambda: Recorder(log, **kw))


async def test_handler_runs_after_the_cancelled_turn_has_unwound() -> None:
    log: list[str] = []
    async with LocalSession(recorder_agent(log, unwind_delay=0.2)) as s:
        await ask(s)
        await take_chunks(s, 2)
        await s.emit(UserStartedSpeaking())
        await wait_for(lambda: "handler-end" in log)
        assert log == ["start", "unwound", "handler-start", "handler-end"]


async def test_next_turn_waits_for_the_handler() -> None:
    log: list[str] = []
    async with LocalSession(recorder_agent(log, handler_delay=0.3)) as s:
        await ask(s)
        await take_chunks(s, 2)
        await s.emit(UserStartedSpeaking())
        await s.emit(UserStoppedSpeaking())  # the next turn is requested while the handler still runs
        events = await s.collect_turn()
        assert log == ["start", "unwound", "handler-start", "handler-end", "start", "completed"]
        assert reply_text(events) == WORDS


async def test_no_handler_when_nothing_is_running() -> None:
    log: list[str] = []
    async with LocalSession(recorder_agent(log)) as s:
        await s.emit(UserStartedSpeaking())  # before any turn
        await ask(s)
        await s.collect_turn()
        await s.emit(UserStartedSpeaking())  # after the turn completed
        await s.quiet(0.1)
        assert "handler-start" not in log
        assert s.interrupted_turns == []
        assert s.runtime.counters["interrupts"] == 0


class Burst(ReasoningNode):
    """Yields a burst of chunks at once, then idles: chunks pile up at the edge unread."""

    def __init__(self, swallow_cancel: bool = False) -> None:
        super().__init__()
        self.swallow_cancel = swallow_cancel

    async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
        for i in range(5):
            yield AgentResponse(content=f"c{i} ")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if not self.swallow_cancel:
                raise
            yield AgentResponse(content="LEAK ")  # a misbehaving node keeps talking after the cancel


def burst_agent(swallow_cancel: bool = False) -> Any:
    def agent(session: SessionInfo) -> Bridge:
        node = Burst(swallow_cancel)
        bridge = Bridge(node)
        bridge.on(UserStoppedSpeaking).interrupt_on(UserStartedSpeaking).stream(node.generate).broadcast()
        return bridge

    return agent


async def test_queued_chunks_of_an_interrupted_turn_never_reach_the_caller() -> None:
    """Line 0.1 still delivered chunks queued before the interrupt; the edge fence drops them."""
    async with LocalSession(burst_agent()) as s:
        await s.emit(UserStoppedSpeaking())
        assert await s.next() == AgentResponse(content="c0 ")  # the rest are queued, unread
        await s.emit(UserStartedSpeaking())
        assert await s.quiet(0.2) == []
        assert s.fence.dropped["interrupted_turn"] == 4


async def test_owner_publishes_nothing_after_the_interrupt_even_if_the_node_keeps_yielding() -> None:
    async with LocalSession(burst_agent(swallow_cancel=True)) as s:
        await s.emit(UserStoppedSpeaking())
        await take_chunks(s, 5)
        published = s.runtime.counters["published"]
        await s.emit(UserStartedSpeaking())
        assert await s.quiet(0.2) == []
        assert s.runtime.counters["published"] == published  # nothing reached the transport
        assert s.runtime.counters["dropped_after_interrupt"] >= 1


async def test_history_keeps_only_what_was_delivered() -> None:
    log: list[str] = []
    async with LocalSession(recorder_agent(log)) as s:
        await ask(s, "first question")
        heard = "".join(await take_chunks(s, 3))
        await s.emit(UserStartedSpeaking())
        await wait_for(lambda: "handler-end" in log)
        node = s.nodes[0]
        assert isinstance(node, ReasoningNode)
        last = node.conversation_events[-1]
        assert isinstance(last, AgentResponse) and last.content == heard == "w0 w1 w2 "
        await ask(s, "second question")
        await s.collect_turn()
        roles = [(m["role"], m["content"]) for m in node.context.format_messages()]
        assert roles == [
            ("user", "first question"),
            ("assistant", "w0 w1 w2 "),
            ("user", "second question"),
        ]


async def test_the_callers_words_around_an_answer_never_heard_reach_the_model_as_one() -> None:
    """ "are you" starts an answer; "there?" cuts it before a word of it was out. The history keeps
    the cut answer's (empty) place, and the model reads one utterance: found when texts typed during
    a broker restart came back as two user messages or one, depending on when the second arrived."""
    log: list[str] = []
    async with LocalSession(recorder_agent(log, first_token_delay=30.0)) as s:
        await ask(s, "are you")
        await wait_for(lambda: "start" in log)  # the answer has begun, nothing of it is out
        await s.emit(UserStartedSpeaking())
        await wait_for(lambda: "handler-end" in log)
        node = s.nodes[0]
        assert isinstance(node, ReasoningNode)
        assert node.conversation_events[-1] == AgentResponse(content="")
        await ask(s, "there?")
        await wait_for(lambda: log.count("start") == 2)
        assert node.context.format_messages() == [{"role": "user", "content": "are you there?"}]


async def test_a_turn_whose_interrupt_overtook_it_in_the_mailbox_never_starts() -> None:
    """Two texts typed while the agent's process was away wait in its mailbox; RabbitMQ hands out
    control first, so the second's UserStartedSpeaking comes before the first's end of turn. It
    found nothing to cut, and the first turn then ran in full before the second was answered: two
    answers where the caller made one utterance (the fault test of a RabbitMQ node restart, now and
    then). The turn emitted before the interrupt is stale, as one waiting at the barrier is."""
    log: list[str] = []
    async with LocalSession(recorder_agent(log)) as s:
        t = time.time()
        mailbox = [  # as the priority queue hands them out; each stamped when the edge sent it
            (UserStartedSpeaking(), t),
            (UserStartedSpeaking(), t + 0.3),
            (UserTranscriptionReceived(content="are you"), t + 0.1),
            (UserStoppedSpeaking(), t + 0.2),
            (UserTranscriptionReceived(content="there?"), t + 0.4),
            (UserStoppedSpeaking(), t + 0.5),
        ]
        for event, sent in mailbox:
            await s.transport.publish(Envelope.wrap(s.session_id, event, ts=sent, source="edge"), IN)
        events = await s.collect_turn()
        assert reply_text(events) == WORDS
        assert log == ["start", "completed"]  # one answer, to the whole utterance
        assert s.runtime.counters["triggers_overtaken"] == 1
        node = s.nodes[0]
        assert isinstance(node, ReasoningNode)
        assert node.context.format_messages()[0] == {"role": "user", "content": "are you there?"}


async def test_an_interrupt_drops_the_turn_queued_before_it_though_nothing_runs_yet() -> None:
    """Two texts typed during a RabbitMQ restart reach a partition's two consumers together when it
    comes back, and are handled side by side: the second's UserStartedSpeaking (control) can be
    dispatched while the first's end of turn is queued for its route and not yet taken up. The
    interrupt found nothing running, let the queued turn be, and the first text was answered on
    its own, then the second (the fault suite's RabbitMQ stop_app test: the next answer was one
    further on than the caller had heard). A turn queued before an interrupt is stale, as one
    running or waiting at the barrier is."""
    log: list[str] = []
    async with LocalSession(recorder_agent(log)) as s:
        t = time.time()

        def sent(event: Event, at: float) -> Envelope:
            return Envelope.wrap(s.session_id, event, ts=at, source="edge")

        await s.transport.publish(sent(UserStartedSpeaking(), t), IN)
        await s.transport.publish(sent(UserTranscriptionReceived(content="are you"), t + 0.1), IN)
        await s.settle()
        runtime = s.runtime
        # the data consumer hands over the end of turn, and before the route has taken it up the
        # control consumer hands over the caller's next start (two handlers, side by side)
        stop, start = UserStoppedSpeaking(), UserStartedSpeaking()
        await asyncio.gather(
            runtime.handle(sent(stop, t + 0.2), stop), runtime.handle(sent(start, t + 0.3), start)
        )
        await s.transport.publish(sent(UserTranscriptionReceived(content="there?"), t + 0.4), IN)
        await s.transport.publish(sent(UserStoppedSpeaking(), t + 0.5), IN)
        events = await s.collect_turn()
        assert reply_text(events) == WORDS
        await s.settle()
        assert log == ["start", "completed"]  # one answer, to the whole utterance
        node = s.nodes[0]
        assert isinstance(node, ReasoningNode)
        assert node.context.format_messages()[0] == {"role": "user", "content": "are you there?"}


async def test_an_utterances_start_dispatched_after_its_end_does_not_cut_its_answer() -> None:
    """Found by ``bench scale --mailboxes partitioned`` (a caller in a few hundred never answered):
    a partition's control and data are two queues, consumed side by side, so the start of what the
    caller typed (UserStartedSpeaking, control) could reach the routes after its end (data), and
    cut the answer to it before its first word. An interrupt cuts only what was sent before it."""
    log: list[str] = []
    async with LocalSession(recorder_agent(log)) as s:
        t = time.time()
        dispatched = [  # the data consumer quicker than the control one; each stamped as sent
            (UserTranscriptionReceived(content="hello"), t + 0.1),
            (UserStoppedSpeaking(), t + 0.2),
            (UserStartedSpeaking(), t),
        ]
        for event, sent in dispatched:
            await s.transport.publish(Envelope.wrap(s.session_id, event, ts=sent, source="edge"), IN)
            await s.settle()
        events = await s.collect_turn()
        assert reply_text(events) == WORDS
        assert log == ["start", "completed"]
        assert not s.interrupted_turns


async def test_an_interrupt_before_a_turn_was_said_leaves_the_turn_alone() -> None:
    """The usual order: the caller starts speaking while the agent is idle (nothing to cut), then
    stops; the turn that stop starts was emitted after the interrupt and runs."""
    log: list[str] = []
    async with LocalSession(recorder_agent(log)) as s:
        await s.emit(UserStartedSpeaking())
        await ask(s, "hello")
        await s.collect_turn()
        assert log == ["start", "completed"]
        assert s.runtime.counters["triggers_overtaken"] == 0


async def test_late_delivery_report_corrects_the_history() -> None:
    """The edge's report may reach the owner after the cancel; the history follows the report."""
    log: list[str] = []
    async with LocalSession(recorder_agent(log)) as s:
        await ask(s)
        await take_chunks(s, 2)
        await wait_for(lambda: s.runtime.counters["published"] >= 4)  # w2, w3 published, not yet read
        await s.emit(UserStartedSpeaking())
        await wait_for(lambda: "handler-end" in log)
        node = s.nodes[0]
        assert isinstance(node, ReasoningNode)
        assert node.conversation_events[-1] == AgentResponse(content="w0 w1 ")
        # the client reports it had played one more chunk than the edge had confirmed
        report = Envelope.wrap(s.session_id, SpeechDelivered(turn=1, seq=2), source="edge")
        await s.transport.publish(report, IN)
        await s.broker.settle()
        assert node.conversation_events[-1] == AgentResponse(content="w0 w1 w2 ")


async def test_without_an_edge_the_published_text_stands_in() -> None:
    log: list[str] = []
    async with LocalSession(recorder_agent(log), report_delivery=False) as s:
        await ask(s)
        await take_chunks(s, 2)
        await s.emit(UserStartedSpeaking())
        await wait_for(lambda: "handler-end" in log)
        node = s.nodes[0]
        assert isinstance(node, ReasoningNode)
        recorded = node.conversation_events[-1]
        assert isinstance(recorded, AgentResponse)
        assert recorded.content.startswith("w0 w1 ")
        assert recorded.content != WORDS and WORDS.startswith(recorded.content)
        assert recorded.content == s.runtime.ledger.delivered_text(1)


async def test_failing_handler_is_counted_and_the_session_goes_on() -> None:
    def agent(session: SessionInfo) -> Bridge:
        node = ReasoningNode(llm_client=slow_llm())

        def broken(message: Message) -> None:
            raise RuntimeError("handler bug")

        bridge = Bridge(node)
        bridge.on(UserStoppedSpeaking).interrupt_on(UserStartedSpeaking, handler=broken).stream(
            node.generate
        ).broadcast()
        return bridge

    async with LocalSession(agent) as s:
        await s.emit(UserStoppedSpeaking())
        await take_chunks(s, 1)
        await s.emit(UserStartedSpeaking())
        await s.emit(UserStoppedSpeaking())
        events = await s.collect_turn()
        assert reply_text(events) == WORDS
        assert s.runtime.counters["interrupt_handler_errors"] == 1


async def test_async_condition_and_zero_arg_handler() -> None:
    calls: list[str] = []

    async def condition(message: Message) -> bool:
        await asyncio.sleep(0)
        calls.append(f"condition:{type(message.event).__name__}")
        return True

    async def handler() -> None:
        calls.append("handler")

    def agent(session: SessionInfo) -> Bridge:
        node = ReasoningNode(llm_client=slow_llm())
        bridge = Bridge(node)
        (
            bridge.on(UserStoppedSpeaking)
            .interrupt_on(UserStartedSpeaking, handler=handler, condition=condition)
            .stream(node.generate)
            .broadcast()
        )
        return bridge

    async with LocalSession(agent) as s:
        await s.emit(UserStoppedSpeaking())
        await take_chunks(s, 1)
        await s.emit(UserStartedSpeaking())
        await wait_for(lambda: "handler" in calls)
        assert calls == ["condition:UserStartedSpeaking", "handler"]
        assert s.interrupted_turns == [1]


async def test_one_interrupt_cancels_every_route_it_names() -> None:
    def agent(session: SessionInfo) -> list[Bridge]:
        bridges = []
        for name in ("a", "b"):
            node = ReasoningNode(node_id=name, llm_client=slow_llm())
            bridge = Bridge(node)
            bridge.on(UserStoppedSpeaking).interrupt_on(UserStartedSpeaking).stream(node.generate).broadcast()
            bridges.append(bridge)
        return bridges

    async with LocalSession(agent) as s:
        await s.emit(UserStoppedSpeaking())
        await take_chunks(s, 2)
        await s.emit(UserStartedSpeaking())
        assert sorted(s.interrupted_turns) == [1, 2]
        assert await s.quiet(0.2) == []


async def test_a_turn_cancelled_between_chunks_unwinds_the_node_at_once() -> None:
    """The cancel can land outside the generator (here in a slow step after it; over RabbitMQ, while
    a chunk is being published). process_context must still see CancelledError right away, and the
    history must be cut before the handler runs, not whenever the garbage collector finds it."""
    seen: list[str] = []

    class Aware(ReasoningNode):
        async def process_context(self, context: ConversationContext) -> AsyncIterator[Event]:
            try:
                for i in range(50):
                    yield AgentResponse(content=f"x{i} ")
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        def on_interrupt_generate(self, message: Message) -> None:
            seen.append(f"handler, history={self.conversation_events[-1]!r}")

    async def slow(event: Event) -> Event:
        await asyncio.sleep(0.02)  # every chunk waits here: the cancel lands in this step
        return event

    def agent(session: SessionInfo) -> Bridge:
        node = Aware()
        bridge = Bridge(node)
        (
            bridge.on(UserStoppedSpeaking)
            .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate)
            .stream(node.generate)
            .map(slow)
            .broadcast()
        )
        return bridge

    async with LocalSession(agent) as s:
        await s.emit(UserStoppedSpeaking())
        heard = "".join(await take_chunks(s, 3))
        await s.emit(UserStartedSpeaking())
        await wait_for(lambda: len(seen) == 2)
        assert seen[0] == "cancelled"
        assert seen[1] == f"handler, history={AgentResponse(content=heard)!r}"


async def test_a_report_to_the_word_cuts_the_history_inside_a_chunk() -> None:
    """An edge that plays the agent's voice reports how far into a chunk the caller heard."""
    log: list[str] = []
    async with LocalSession(recorder_agent(log), report_delivery=False) as s:
        s.runtime.ledger.edge_reports = True  # an edge that reports, but only what we send here
        await ask(s)
        await take_chunks(s, 4)
        report = Envelope.wrap(s.session_id, SpeechDelivered(turn=1, seq=2, chars=2), source="edge")
        await s.transport.publish(report, IN)
        await s.broker.settle()
        await s.emit(UserStartedSpeaking())
        await wait_for(lambda: "handler-end" in log)
        node = s.nodes[0]
        assert isinstance(node, ReasoningNode)
        assert node.conversation_events[-1] == AgentResponse(content="w0 w1 w2")  # not "w2 "


async def test_a_final_report_cuts_an_answer_the_agent_had_finished() -> None:
    """With the agent's voice, a barge-in usually comes after the text is complete: the edge's
    final report (no more of the turn will be heard) cuts the finished answer to what was heard,
    and a cough may then resume it."""
    log: list[str] = []
    async with LocalSession(recorder_agent(log), report_delivery=False) as s:
        s.runtime.ledger.edge_reports = True
        await ask(s)
        await s.collect_turn()
        node = s.nodes[0]
        assert isinstance(node, ReasoningNode)
        assert node.conversation_events[-1] == AgentResponse(content=WORDS)
        early = Envelope.wrap(s.session_id, SpeechDelivered(turn=1, seq=3, chars=1), source="edge")
        await s.transport.publish(early, IN)  # heard so far, the voice goes on: nothing is cut
        await s.broker.settle()
        assert node.conversation_events[-1] == AgentResponse(content=WORDS)
        cut = Envelope.wrap(s.session_id, SpeechDelivered(turn=1, seq=3, chars=2, final=True), source="edge")
        await s.transport.publish(cut, IN)
        await s.broker.settle()
        assert node.conversation_events[-1] == AgentResponse(content="w0 w1 w2 w3")
        assert node._resumable is not None  # a FalseInterruption now picks it up where it was cut


async def test_the_caller_reports_delivery_coalesced_and_before_whatever_it_does_next() -> None:
    """A report per chunk cost as much as the chunk: the in-process caller, as the edge, reports
    a turn's position at most every interval while chunks stream; the interrupt still finds the
    history exact, because the caller reports what it got before it publishes anything else."""
    log: list[str] = []
    reports: list[SpeechDelivered] = []
    async with LocalSession(recorder_agent(log)) as s:
        publish = s.transport.publish

        async def counting(envelope: Envelope, direction: Any) -> None:
            if envelope.type == "SpeechDelivered":
                reports.append(SpeechDelivered.model_validate(envelope.payload))
            await publish(envelope, direction)

        s.transport.publish = counting  # type: ignore[method-assign]  # counts, then publishes
        await ask(s)
        text = "".join(await take_chunks(s, 12))  # 12 chunks at ~10 ms: a few report intervals
        assert 1 <= len(reports) < 8, reports  # not one a chunk
        assert all(later.seq > earlier.seq for earlier, later in itertools.pairwise(reports))
        await s.emit(UserStartedSpeaking())  # reports first: how far the caller got, then the cut
        await wait_for(lambda: "handler-end" in log)
        assert reports[-1].seq == 11 and not reports[-1].final
        node = s.nodes[0]
        assert isinstance(node, ReasoningNode)
        assert node.conversation_events[-1] == AgentResponse(content=text)


async def test_barge_ins_leave_no_garbage_cycles_and_no_growing_records() -> None:
    """A barge-in cancels a turn's task; the task, the exception that unwound it and the frames
    that exception holds referred to each other (through the run, in the task's context and the
    frames): fifty objects a barge-in waited for the garbage collector, a sixth of a busy
    process's work. And a node kept every interrupted answer of the call, for late reports."""
    async with LocalSession(interruptible_agent(replies=(WORDS,) * 40, tokens_per_second=400)) as s:
        await ask(s, "warm up")
        await take_chunks(s, 1)
        await s.emit(UserStartedSpeaking())
        await s.quiet(0.05)
        gc.collect()
        gc.disable()
        try:
            for turn in range(30):
                await ask(s, f"question {turn}")
                await take_chunks(s, 2)
                await s.emit(UserStartedSpeaking())
                await s.quiet(0.02)
            unreachable = gc.collect()
        finally:
            gc.enable()
        assert unreachable < 30, unreachable  # a handful, not one cycle a barge-in
        node = s.nodes[0]
        assert isinstance(node, ReasoningNode)
        assert len(node._interrupted) <= 16
