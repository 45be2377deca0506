"""``bargein bench checkpoint``: what a turn's checkpoint costs at turn 1, 100 and 1,000 of a call,
and how long a 1,000-turn session takes to restore, on the real Redis.

One session answers ``--turns`` questions (a reasoning node with the scripted model, in process,
checkpointing to Redis as the reasoning service does). At each reported turn the bench shows:

* the bytes the turn's largest checkpoint wrote (the record and the log items), and the time its
  ``save_state`` took;
* beside it, the baseline measured in the same run: the bytes the same state would be if written
  whole (every node's history in the record), as every checkpoint was before the journal.

The target: the journaled checkpoint at turn 1,000 within 1.5 times its size at turn 1 (it must not
grow with the call), and restoring the 1,000-turn session (reading the record and the log, and
rebuilding the history) under 100 ms. The session's keys are deleted at the end.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from bargein.agent.events import UserStartedSpeaking, UserStoppedSpeaking, UserTranscriptionReceived
from bargein.agent.llm import ScriptedLLM
from bargein.agent.nodes import ReasoningNode
from bargein.agent.routes import Bridge
from bargein.runtime import journal, snapshot
from bargein.settings import BrokerSettings, load
from bargein.testing import LocalSession
from bargein.tools.benchkit import BenchError, run_main, say, verdict
from bargein.transport.abc import NO_LOG_CHANGE, LogChange
from bargein.transport.redis_store import RedisStateStore
from bargein.wire.names import TIER_REASONING
from bargein.wire.session_info import SessionInfo

ANSWER = " ".join(f"word{i}" for i in range(20))  # a twenty-word answer each turn
TARGET_GROWTH = 1.5
TARGET_RESTORE_MS = 100.0
DEFAULT_TURNS = 1000


@dataclass
class Written:
    bytes: int
    seconds: float


class MeasuredStore(RedisStateStore):
    """The Redis store, noting what each checkpoint wrote and how long it took."""

    writes: list[Written]

    async def save_state(
        self, tier: Any, session: str, epoch: int, data: bytes, ttl_ms: int, log: LogChange = NO_LOG_CHANGE
    ) -> None:
        started = time.perf_counter()
        await super().save_state(tier, session, epoch, data, ttl_ms, log)
        size = len(data) + log.size
        self.writes.append(Written(size, time.perf_counter() - started))


def agent(session: SessionInfo) -> Bridge:
    node = ReasoningNode(llm_client=ScriptedLLM([ANSWER], first_token_delay=0.0, tokens_per_second=1e6))
    bridge = Bridge(node)
    bridge.on(UserTranscriptionReceived).map(node.add_event)
    (
        bridge.on(UserStoppedSpeaking)
        .interrupt_on(UserStartedSpeaking, handler=node.on_interrupt_generate)
        .stream(node.generate)
        .broadcast()
    )
    return bridge


def _measured(writes: list[Written], session: LocalSession) -> dict[str, float]:
    """A reported turn: its largest checkpoint, the median write time, and the whole state's size."""
    node = session.nodes[0]
    whole = len(snapshot.dumps({"nodes": {node.id: snapshot.capture(node)}}))
    return {
        "bytes": max(w.bytes for w in writes),
        "ms": 1000 * statistics.median(w.seconds for w in writes),
        "whole_bytes": whole,
    }


@dataclass
class Report:
    turns: dict[int, dict[str, float]] = field(default_factory=dict)
    restore_ms: float = 0.0
    history_events: int = 0


async def run_checkpoint_bench(turns: int, redis_url: str, out: TextIO = sys.stdout) -> Report:
    store = MeasuredStore.from_url(redis_url)
    store.writes = []
    try:
        await store.redis.ping()
    except Exception as exc:
        raise BenchError(f"Redis is not reachable at {redis_url} ({type(exc).__name__}: {exc})") from exc
    marks = sorted({1, min(100, turns), turns})
    report = Report()
    say(out, f"checkpoint bench: one session, {turns} turns, on {redis_url}")
    session = LocalSession(agent)
    try:
        async with session:
            session.store = store  # type: ignore[assignment]  # the real store, as the service has
            await session.restart()
            for turn in range(1, turns + 1):
                before = len(store.writes)
                await session.emit(UserTranscriptionReceived(content=f"question {turn}"))
                await session.emit(UserStoppedSpeaking())
                await session.collect_turn(timeout=30)
                if turn in marks:
                    await session.quiet(0.05)  # the turn's last checkpoint follows its last chunk
                    report.turns[turn] = _measured(store.writes[before:], session)
                    numbers = report.turns[turn]
                    say(
                        out,
                        f"  turn {turn:>5}: checkpoint {numbers['bytes']:>7.0f} B in {numbers['ms']:.2f} ms"
                        f"   (written whole it would be {numbers['whole_bytes']:>9.0f} B)",
                    )
                elif turn % 100 == 0:
                    say(out, f"  ... turn {turn}")
        # the session closed with a checkpoint; a new owner restores it from the record and the log
        started = time.perf_counter()
        checkpoint = await journal.read(store, TIER_REASONING, session.session_id)
        if checkpoint is None:
            raise BenchError("the session left no checkpoint")
        fresh = ReasoningNode()
        snapshot.restore(fresh, next(iter(checkpoint[0]["nodes"].values())))
        report.restore_ms = 1000 * (time.perf_counter() - started)
        report.history_events = len(fresh.conversation_events)
    finally:
        await store.delete_state(TIER_REASONING, session.session_id)
    first, last = report.turns[marks[0]], report.turns[marks[-1]]
    growth = last["bytes"] / first["bytes"]
    say(
        out,
        f"  restoring the {turns}-turn session ({report.history_events} events): {report.restore_ms:.1f} ms",
    )
    met = verdict(growth <= TARGET_GROWTH)
    say(out, f"checkpoint at turn {turns} / turn 1: {growth:.2f}x (target <= {TARGET_GROWTH}x: {met})")
    say(
        out,
        f"restore: {report.restore_ms:.1f} ms (target < {TARGET_RESTORE_MS:.0f} ms: "
        f"{verdict(report.restore_ms < TARGET_RESTORE_MS)})",
    )
    await store.close()
    return report


def main(turns: int = DEFAULT_TURNS, redis_url: str | None = None) -> int:
    url = redis_url or load(BrokerSettings).redis_url
    return run_main(lambda: run_checkpoint_bench(turns, url), "checkpoint")


if __name__ == "__main__":
    sys.exit(main())
