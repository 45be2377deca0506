"""The edge's buffering rules, in process: a stuck client is cut off, nobody else waits for it.

The socket here is a stand-in whose ``send_json`` can be made to block, because a real client that
stops reading only blocks the server once kernel buffers of megabytes have filled; the behaviour
under test is the edge's own outbox policy, which this drives exactly.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bargein.agent.events import (
    AgentGenerationComplete,
    AgentPlayback,
    AgentResponse,
    DTMFOutputEvent,
    EndCall,
    InterruptPolicy,
    LogMetric,
    SpeechDelivered,
    ToolCall,
    ToolResult,
    TransferCall,
    TurnInterrupted,
    UserBackchannel,
    UserStartedSpeaking,
    UserTranscriptionReceived,
)
from bargein.agent.message import Source
from bargein.edge.core import CLOSE_SLOW, Connection, Edge, JsonWire, Outbox
from bargein.edge.protocol import (
    AgentChunk,
    Clear,
    Interrupt,
    SpeakingStarted,
    TextTurn,
    TurnComplete,
    frame_json,
)
from bargein.settings import BroadcastSettings
from bargein.transport.memory import MemoryStateStore, MemoryTransport
from bargein.wire.envelope import Envelope
from bargein.wire.names import IN, TIER_REASONING, TIER_SPEECH

from ..sdk.helpers import wait_for


class FakeSocket:
    def __init__(self, stuck: bool = False) -> None:
        self.sent: list[dict[str, Any]] = []
        self.closed_with: int | None = None
        self.unblock = asyncio.Event()
        if not stuck:
            self.unblock.set()

    async def send_json(self, frame: dict[str, Any]) -> None:
        await self.unblock.wait()
        self.sent.append(frame)

    async def close(self, code: int = 1000) -> None:
        self.closed_with = code


async def make_edge(buffer: int = 8) -> Edge:
    settings = BroadcastSettings(send_buffer=buffer, report_interval_ms=10)
    edge = Edge(MemoryTransport(), MemoryStateStore(), settings, owner="t", max_frame_bytes=64_000)
    await edge.start()
    return edge


def frames(connection: Connection) -> list[dict[str, Any]]:
    """What waits in a connection's outbox, as it would go on the socket."""
    return [frame_json(f) for f in connection.outbox.frames]


async def push(edge: Edge, session: str, event: Any, **fields: Any) -> None:
    """Hand the edge what its queue would: ``event`` as the session's owner (epoch 1) sent it."""
    if fields.get("epoch", 0) > await edge.store.current_epoch(TIER_REASONING, session):
        await edge.store.acquire_lease(TIER_REASONING, session, "the-owner", 60_000)
    await edge.on_event(Envelope.wrap(session, event, **fields), event)


async def test_a_stuck_client_is_cut_off_and_others_keep_receiving() -> None:
    edge = await make_edge(buffer=8)
    try:
        stuck, healthy = FakeSocket(stuck=True), FakeSocket()
        a = await edge.join("s1", JsonWire(stuck), "caller", False)  # type: ignore[arg-type]
        await edge.join("s1", JsonWire(healthy), "listener", False)  # type: ignore[arg-type]
        for seq in range(20):  # one at a time, as the consumer hands them over
            await push(edge, "s1", AgentResponse(content=f"w{seq} "), turn=1, seq=seq, epoch=1)
            await asyncio.sleep(0.001)
        await wait_for(lambda: stuck.closed_with is not None)
        assert stuck.closed_with == CLOSE_SLOW and a.closed
        await wait_for(lambda: len(healthy.sent) == 20)
        assert [f["seq"] for f in healthy.sent] == list(range(20))
        assert edge.counters["slow_clients"] == 1
    finally:
        await edge.stop()


async def test_clear_purges_queued_chunks_and_jumps_the_queue() -> None:
    box = Outbox(limit=100)
    for seq in range(5):
        box.put(AgentChunk(turn=1, seq=seq, text="x"))
    box.put(TurnComplete(turn=1))
    box.put(SpeakingStarted())
    assert box.purge_turns(1) == 6
    box.put_first(Clear(turn=1))
    assert [f.type for f in box.frames] == ["clear", "user_started_speaking"]


async def test_policy_lets_the_edge_clear_before_the_owner_says_so() -> None:
    edge = await make_edge()
    try:
        sock = FakeSocket(stuck=True)  # nothing is written yet: everything waits in the outbox
        connection = await edge.join("s2", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        await push(edge, "s2", InterruptPolicy(events=["UserStartedSpeaking"]), epoch=1)
        for seq in range(3):
            await push(edge, "s2", AgentResponse(content="x"), turn=4, seq=seq, epoch=1)
        await push(edge, "s2", UserStartedSpeaking())  # from speech detection; no TurnInterrupted yet
        kinds = [(f["type"], f.get("turn")) for f in frames(connection)]
        assert kinds == [("clear", 4), ("user_started_speaking", None)]
        await push(edge, "s2", AgentResponse(content="late"), turn=4, seq=3, epoch=1)  # in flight
        await push(edge, "s2", TurnInterrupted(turn=4), turn=4, epoch=1)  # the owner confirms
        assert [f["type"] for f in frames(connection)] == ["clear", "user_started_speaking"]
    finally:
        await edge.stop()


async def test_a_typed_turn_cuts_the_answer_at_once_and_its_echo_never_cuts_its_own_answer() -> None:
    """A caller's text is a barge-in (``UserStartedSpeaking``), then a turn. The edge hears its own
    barge-in back from the broker on its control queue, and the answer on its data queue: under
    load the answer's first chunk came first, and the late barge-in cleared the answer to the very
    text that began it (``bench scale``: a caller waited 60 s for an answer, 1 of 1,000). Now the
    edge cuts what played when the caller typed, at once, and a barge-in from the bus cuts no turn
    that reached the edge after the barge-in was published (the owner says if it is cut)."""
    edge = await make_edge()
    try:
        sock = FakeSocket(stuck=True)
        connection = await edge.join("s11", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        await push(edge, "s11", InterruptPolicy(events=["UserStartedSpeaking"]), epoch=1)
        await push(edge, "s11", AgentResponse(content="first answer "), turn=1, seq=0, epoch=1)
        assert await edge.client_message(connection, TextTurn(type="text", text="hello")) is None
        assert ("clear", 1) in [(f["type"], f.get("turn")) for f in frames(connection)]  # at once
        echo = UserStartedSpeaking()
        echoed = Envelope.wrap("s11", echo, source=Source.EDGE)  # published now, heard back late:
        await asyncio.sleep(0.01)
        await push(edge, "s11", AgentResponse(content="the answer "), turn=2, seq=0, epoch=1)
        await edge.on_event(echoed, echo)  # ... after the answer to the text it began
        await push(edge, "s11", AgentResponse(content="goes on"), turn=2, seq=1, epoch=1)
        sent = [(f["type"], f.get("turn")) for f in frames(connection)]
        assert ("clear", 2) not in sent, sent
        assert [f["text"] for f in frames(connection) if f["type"] == "agent_chunk"] == [
            "the answer ",
            "goes on",
        ]
        # a barge-in published while turn 2 plays still cuts it at once, before the owner says so
        await push(edge, "s11", UserStartedSpeaking())
        assert ("clear", 2) in [(f["type"], f.get("turn")) for f in frames(connection)]
    finally:
        await edge.stop()


async def test_without_the_policy_the_edge_waits_for_the_owner() -> None:
    edge = await make_edge()
    try:
        sock = FakeSocket(stuck=True)
        connection = await edge.join("s3", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        await push(edge, "s3", InterruptPolicy(events=[]), epoch=1)  # a conditional interrupt
        await push(edge, "s3", AgentResponse(content="x"), turn=2, seq=0, epoch=1)
        await push(edge, "s3", UserStartedSpeaking())
        assert "clear" not in [f["type"] for f in frames(connection)]  # the owner may decline
        await push(edge, "s3", TurnInterrupted(turn=2), turn=2, epoch=1)
        assert frames(connection)[0] == {"type": "clear", "turn": 2}
    finally:
        await edge.stop()


async def test_what_a_caller_was_sent_is_reported_back(monkeypatch: Any) -> None:
    edge = await make_edge()
    try:
        published: list[Envelope] = []
        transport = edge.transport
        original = transport.publish

        async def record(envelope: Envelope, direction: Any) -> None:
            published.append(envelope)
            await original(envelope, direction)

        monkeypatch.setattr(transport, "publish", record)
        sock = FakeSocket()
        await edge.join("s4", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        for seq in range(4):
            await push(edge, "s4", AgentResponse(content="x"), turn=3, seq=seq, epoch=1)
        await wait_for(lambda: any(e.type == "SpeechDelivered" for e in published))
        await asyncio.sleep(0.05)
        reports = [(e.payload["turn"], e.payload["seq"]) for e in published if e.type == "SpeechDelivered"]
        assert reports[-1] == (3, 3)
    finally:
        await edge.stop()


async def test_a_false_interruption_ends_the_speaking_state_for_clients() -> None:
    from bargein.agent.events import FalseInterruption

    edge = await make_edge()
    try:
        sock = FakeSocket(stuck=True)
        connection = await edge.join("s5", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        await push(edge, "s5", UserStartedSpeaking())
        await push(edge, "s5", FalseInterruption(duration_ms=180))
        assert frames(connection) == [
            {"type": "user_started_speaking"},
            {"type": "user_stopped_speaking", "false_interruption": True},
        ]
    finally:
        await edge.stop()


async def test_a_message_claiming_an_epoch_nobody_was_given_is_dropped() -> None:
    edge = await make_edge()
    try:
        sock = FakeSocket(stuck=True)
        connection = await edge.join("s6", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        await push(edge, "s6", AgentResponse(content="real"), turn=1, seq=0, epoch=1)
        forged = AgentResponse(content="forged")
        await edge.on_event(Envelope.wrap("s6", forged, turn=2, seq=0, epoch=10**9), forged)
        await push(edge, "s6", AgentResponse(content="still real"), turn=1, seq=1, epoch=1)
        assert [f.get("text") for f in frames(connection)] == ["real", "still real"]
        assert edge.counters["forged_epochs"] == 1
    finally:
        await edge.stop()


async def test_the_speech_tier_is_told_when_the_agent_starts_and_stops_reaching_the_caller() -> None:
    """AgentPlayback goes to the session's speech mailbox (the audio lane, in order with the
    caller's audio): speaking from the turn's first chunk; stopped once the turn is complete and its
    last chunk has reached the caller, or at once when the turn is cleared."""
    edge = await make_edge()
    try:
        told: list[bool] = []

        async def speech(_: Envelope, event: Any) -> None:
            if isinstance(event, AgentPlayback):
                told.append(event.speaking)

        await edge.transport.open_mailbox("s6", TIER_SPEECH, IN, speech)
        sock = FakeSocket(stuck=True)  # nothing reaches the caller until it reads
        await edge.join("s6", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        for seq in range(3):
            await push(edge, "s6", AgentResponse(content="x "), turn=1, seq=seq, epoch=1)
        await push(edge, "s6", AgentGenerationComplete(), turn=1, seq=3, epoch=1)
        await wait_for(lambda: told == [True])
        await asyncio.sleep(0.05)
        assert told == [True]  # complete, but the caller has not been sent the end of it yet
        sock.unblock.set()
        await wait_for(lambda: told == [True, False])
        await push(edge, "s6", AgentResponse(content="y "), turn=2, seq=0, epoch=1)
        await wait_for(lambda: told == [True, False, True])
        await push(edge, "s6", TurnInterrupted(turn=2), epoch=1)  # cut off: stopped now
        await wait_for(lambda: told == [True, False, True, False])
    finally:
        await edge.stop()


async def test_what_speech_to_text_heard_is_shown_to_clients() -> None:
    edge = await make_edge()
    try:
        connection = await edge.join("s7", JsonWire(FakeSocket(stuck=True)), "caller", False)  # type: ignore[arg-type]
        await push(edge, "s7", UserTranscriptionReceived(content="Book a table."), source=Source.SPEECH)
        await push(edge, "s7", UserBackchannel(content="Uh-huh."), source=Source.SPEECH)
        await push(edge, "s7", UserTranscriptionReceived(content="typed"), source=Source.EDGE)  # a text turn
        assert frames(connection) == [
            {"type": "user_transcript", "text": "Book a table.", "backchannel": False},
            {"type": "user_transcript", "text": "Uh-huh.", "backchannel": True},
        ]
    finally:
        await edge.stop()


async def test_what_the_agent_does_besides_speaking_reaches_clients_in_turn_order() -> None:
    """Tool calls and results, metrics, key presses and a transfer: Line's harness outputs, as
    frames that share the turn's seq with its chunks and are fenced like them."""
    edge = await make_edge()
    try:
        sock = FakeSocket(stuck=True)
        connection = await edge.join("s8", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        await push(edge, "s8", AgentResponse(content="One moment. "), turn=1, seq=0, epoch=1)
        call = ToolCall(tool_name="record_answer", tool_args={"answer": "42"}, tool_call_id="c1")
        await push(edge, "s8", call, turn=1, seq=1, epoch=1)
        await push(
            edge,
            "s8",
            ToolResult(tool_name="record_answer", result={"ok": True}, tool_call_id="c1"),
            turn=1,
            seq=2,
            epoch=1,
        )
        await push(edge, "s8", LogMetric(name="form_completed", value=1), turn=1, seq=3, epoch=1)
        await push(edge, "s8", DTMFOutputEvent(button="5"), turn=1, seq=4, epoch=1)
        await push(edge, "s8", TurnInterrupted(turn=1), epoch=1)
        await push(edge, "s8", LogMetric(name="late", value=2), turn=1, seq=5, epoch=1)  # fenced
        kinds = [f["type"] for f in frames(connection)]
        assert kinds == ["clear"]  # the cleared turn's queued frames went with it
        sent: list[dict[str, Any]] = []
        sock2 = FakeSocket(stuck=True)
        second = await edge.join("s9", JsonWire(sock2), "caller", False)  # type: ignore[arg-type]
        await push(edge, "s9", call, turn=1, seq=0, epoch=1)
        await push(edge, "s9", LogMetric(name="form_completed", value=1), turn=1, seq=1, epoch=1)
        await push(edge, "s9", DTMFOutputEvent(button="#"), turn=1, seq=2, epoch=1)
        sent = frames(second)
        assert sent == [
            {
                "type": "tool_call",
                "turn": 1,
                "seq": 0,
                "name": "record_answer",
                "arguments": {"answer": "42"},
                "id": "c1",
            },
            {"type": "log_metric", "turn": 1, "seq": 1, "name": "form_completed", "value": 1},
            {"type": "dtmf", "turn": 1, "seq": 2, "button": "#"},
        ]
    finally:
        await edge.stop()


async def test_a_transfer_is_sent_to_the_caller_and_ends_the_session() -> None:
    edge = await make_edge()
    try:
        told: list[Any] = []

        async def reasoning(_: Envelope, event: Any) -> None:
            told.append(event)

        await edge.transport.open_mailbox("s10", TIER_REASONING, IN, reasoning)
        sock = FakeSocket()
        await edge.join("s10", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        transfer = TransferCall(target_phone_number="+14155550100", reason="a human, please")
        await push(edge, "s10", transfer, turn=2, seq=0, epoch=1)
        await wait_for(lambda: sock.closed_with is not None)
        assert sock.sent == [
            {
                "type": "transfer",
                "turn": 2,
                "seq": 0,
                "target_phone_number": "+14155550100",
                "reason": "a human, please",
            },
            {"type": "ended", "reason": "transferred"},
        ]
        await wait_for(lambda: any(isinstance(e, EndCall) for e in told))  # the owners let it go
    finally:
        await edge.stop()


async def test_a_session_its_agent_rejects_before_the_caller_joins_tells_the_caller_when_it_joins() -> None:
    edge = await make_edge()
    try:
        sid = await edge.create_session({}, {})
        await push(edge, sid, EndCall(reason=EndCall.REJECTED), epoch=1)  # the pre-call handler said no
        assert await edge.known(sid)
        sock = FakeSocket()
        await edge.join(sid, JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        await wait_for(lambda: sock.closed_with is not None)
        assert sock.sent == [{"type": "ended", "reason": "rejected"}] and sock.closed_with == 1000
    finally:
        await edge.stop()


async def test_what_was_heard_is_reported_before_the_stop_button_and_the_cut_at_once() -> None:
    """Between the edge's periodic reports (BARGEIN_REPORT_INTERVAL_MS), what a caller received
    still reaches the owner before whatever the caller does next, and a turn cut off is reported
    (``final``) at once: the owner cuts its history where the caller stopped, not one interval
    later."""
    settings = BroadcastSettings(send_buffer=8, report_interval_ms=60_000)  # no periodic report here
    edge = Edge(MemoryTransport(), MemoryStateStore(), settings, owner="t", max_frame_bytes=64_000)
    await edge.start()
    owner: list[Any] = []

    async def record(envelope: Envelope, event: Any) -> None:
        owner.append(event)

    mailbox = await edge.transport.open_mailbox("s9", TIER_REASONING, IN, record)
    try:
        sock = FakeSocket()
        connection = await edge.join("s9", JsonWire(sock), "caller", False)  # type: ignore[arg-type]
        for seq in range(3):
            await push(edge, "s9", AgentResponse(content=f"w{seq} "), turn=2, seq=seq, epoch=1)
        await wait_for(lambda: len(sock.sent) == 3)  # written: a text caller has them
        assert not owner  # nothing periodic yet
        assert await edge.client_message(connection, Interrupt(type="interrupt")) is None
        await wait_for(lambda: len(owner) == 3)
        heard, barge_in, cut = owner
        assert (type(heard), heard.turn, heard.seq, heard.final) == (SpeechDelivered, 2, 2, False)
        assert isinstance(barge_in, UserStartedSpeaking)
        assert (type(cut), cut.turn, cut.final) == (SpeechDelivered, 2, True)
    finally:
        await mailbox.cancel()
        await edge.stop()


async def test_a_session_ending_slowly_holds_up_no_other_sessions_output() -> None:
    # the edge hears a session's output in order, from one queue for all its sessions: ending a
    # call (the last frames sent, the socket closed, the records removed) must happen aside, or a
    # caller slow to take its last frames holds every other caller's answer up
    edge = await make_edge()
    try:
        slow, other = FakeSocket(stuck=True), FakeSocket()
        await edge.join("ending", JsonWire(slow), "caller", False)  # type: ignore[arg-type]
        await edge.join("talking", JsonWire(other), "caller", False)  # type: ignore[arg-type]
        await push(edge, "ending", AgentResponse(content="bye"), turn=1, seq=0, epoch=1)
        async with asyncio.timeout(0.5):  # well before the ending's 2 s for its last frames
            await push(edge, "ending", EndCall(reason="done"), epoch=1)
            await push(edge, "talking", AgentResponse(content="hello"), turn=1, seq=0, epoch=1)
            await wait_for(lambda: [f.get("text") for f in other.sent] == ["hello"])
        slow.unblock.set()  # the slow caller takes its frames after all: its call ends as usual
        await wait_for(lambda: slow.closed_with == 1000)
        assert [f["type"] for f in slow.sent] == ["agent_chunk", "ended"]
    finally:
        await edge.stop()
