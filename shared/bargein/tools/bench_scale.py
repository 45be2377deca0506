"""``bargein bench scale``: how many sessions a stack starts a second and what an idle one costs
everywhere, at 1,000 and 10,000 idle sessions with 200 of them active, on one RabbitMQ node or on a
3-node cluster; and, beneath the services, the two mailbox designs side by side
(:mod:`bargein.tools.bench_mailboxes`).

**bargein as built.** One reasoning, one speech and one edge process on the broker (the configured
one, or with ``--cluster`` a private 3-node cluster with the replication policy of
``docs/operations.md``; Redis is the configured one). Sessions are created as clients create them
(``POST /v1/sessions``, join, say "hello", wait for the first chunk: :mod:`bench_sessions`' callers)
up to each level of ``--idle``, each caller staying connected and idle. At each level the bench
reports the starts a second since the level before, the memory per idle session of each service
process, of the broker (every node) and of Redis; then ``--active`` of the callers each type a
turn every ``TURN_EVERY_S`` (on average) for ``--active-s`` seconds, and the bench reports the time
from a turn's text to its first chunk (p50/p95) with every idle session still there.

**The mailbox designs** (``--designs``, on by default): per-session mailboxes (today) against
partitioned quorum mailboxes on the same broker: session starts, broker memory per idle session,
control latency under a data load, and, on a cluster, failover after the node holding a mailbox's
leader is SIGKILLed.

Targets (issue 27): 200 session starts a second on one machine; 30 KB of broker memory per idle
session; 10,000 idle sessions on one node; failover after a node loss within 5 s. Missing one is a
result, reported, not an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from websockets.asyncio.client import ClientConnection

from bargein.settings import BrokerSettings, load
from bargein.tools import bench_mailboxes as designs
from bargein.tools.bench_sessions import (
    SETTLE_S,
    LLMChoice,
    _SessionsBench,
    broker_eval,
    broker_nodes,
    growth_per_session,
    rabbitmq_total,
    rabbitmqctl,
)
from bargein.tools.benchkit import (
    BenchError,
    cpu_of,
    forget_partitions,
    percentile,
    run_main,
    say,
    verdict,
)
from bargein.tools.private_brokers import MIRRORING_POLICY, PrivateRabbitCluster
from bargein.transport import amqp_address
from bargein.transport.amqp import AmqpTransport

LEVELS = (1000, 10000)
ACTIVE = 200
ACTIVE_S = 20.0
TURN_EVERY_S = 5.0  # an active caller's turns come this often on average (a conversation's pace)
ANSWER_TIMEOUT_S = 30.0
TARGET_STARTS_PER_S = 200.0
TARGET_BROKER_KB = 30.0
TARGET_FAILOVER_S = 5.0
DESIGN_SESSIONS = 1000  # started per design for its start rate and idle memory
LOAD_SESSIONS = 200  # sessions under load for the control latency
LOAD_RATE = 5.0  # data messages a second a session (a streaming turn's reports and events): 1,000 a second
WORK_MS = 0.2  # a consumer's CPU per message
SAMPLES = 100
SAMPLE_INTERVAL_S = 0.1


def broker_eval_int(node: str | None, expression: str) -> int | None:
    """An Erlang expression evaluated on a RabbitMQ node that answers a number (None: no answer)."""
    answer = broker_eval(node, expression)
    with contextlib.suppress(ValueError):
        return int(answer.strip().strip('"')) if answer is not None else None
    return None


def broker_pid(node: str | None) -> int | None:
    """The OS process of a RabbitMQ node on this machine (its CPU time is read from /proc)."""
    return broker_eval_int(node, "os:getpid().")


def queue_leader(node: str | None, queue: str) -> str | None:
    """The node holding ``queue``'s leader (a quorum queue) or master (a classic one)."""
    listed = rabbitmqctl(
        node, "-q", "list_queues", "--no-table-headers", "name", "pid", "leader", timeout_s=60
    )
    for line in (listed or "").splitlines():
        name, _, rest = line.partition("\t")
        if name != queue:
            continue
        pid, _, leader = rest.partition("\t")
        if leader.strip():
            return leader.strip()
        if pid.startswith("<"):  # <rabbit@host.1.2.3>
            return pid[1:].rsplit(".", 3)[0]
    return None


def file_handle_limit(node: str | None) -> int | None:
    """How many files a RabbitMQ node's classic queues may hold open (its file handle cache)."""
    return broker_eval_int(node, "file_handle_cache:get_limit().")


def cpu_by_process(pids: dict[str, int | list[int]]) -> dict[str, float | None]:
    """CPU seconds each named process (or group of processes: a cluster's nodes) has used."""
    return {name: cpu_of(which if isinstance(which, list) else [which]) for name, which in pids.items()}


class _ScaleBench:
    def __init__(
        self,
        *,
        levels: tuple[int, ...],
        active: int,
        active_s: float,
        cluster: bool,
        mailboxes: str,
        with_designs: bool,
        concurrency: int,
        design_sessions: int,
        samples: int,
        out: TextIO,
        llm: LLMChoice = "scripted",
    ) -> None:
        self.levels = levels
        self.llm = llm
        self.active = active
        self.active_s = active_s
        self.cluster = cluster
        self.mailboxes = mailboxes
        self.with_designs = with_designs
        self.concurrency = concurrency
        self.design_sessions = design_sessions
        self.samples = samples
        self.out = out
        broker = load(BrokerSettings)
        self.rabbitmq_url = broker.rabbitmq_url
        self.redis_url = broker.redis_url
        self.nodes: list[str] = []  # the broker's nodes, by name ([]: none found: not measured)

    def say(self, text: str) -> None:
        say(self.out, text)

    async def run(self) -> dict[str, Any]:
        where = "a private 3-node cluster (mirrored)" if self.cluster else "one node (the configured broker)"
        model = "over HTTP" if self.llm == "server" else "in process"
        self.say(
            f"bench scale on {where}: idle levels {', '.join(map(str, self.levels))}, {self.active} active,"
            f" {self.mailboxes} mailboxes, the agent's model {model}"
        )
        if not self.cluster:
            self.nodes = await broker_nodes(self.rabbitmq_url)
            self.say(
                f"  the broker's memory, CPU and open files are read on {', '.join(self.nodes)}"
                if self.nodes
                else "  the broker's memory, CPU and open files are not measured: rabbitmqctl here reaches"
                " no node that listens at BARGEIN_RABBITMQ_URL"
            )
            return await self._run_here()
        self.say("starting a private 3-node RabbitMQ cluster")
        cluster = PrivateRabbitCluster(Path(tempfile.mkdtemp(prefix="bargein-bench-scale-")), 3)
        await asyncio.to_thread(cluster.start)
        try:
            await asyncio.to_thread(
                cluster.nodes[0].set_policy, "bargein-replicated", "^bargein\\.|^bench\\.", MIRRORING_POLICY
            )
            self.rabbitmq_url = cluster.url
            self.nodes = [node.node for node in cluster.nodes]
            return await self._run_here(cluster)
        finally:
            self.say("stopping the private cluster")
            await asyncio.to_thread(cluster.stop)

    async def _run_here(self, cluster: PrivateRabbitCluster | None = None) -> dict[str, Any]:
        results: dict[str, Any] = {
            "cluster": self.cluster,
            "mailboxes": self.mailboxes,
            "levels": await self.as_built(),
        }
        if self.with_designs:
            results["designs"] = await self.designs(cluster)
        self.verdicts(results)
        return results

    # --- bargein as built ---------------------------------------------------------------------

    async def as_built(self) -> list[dict[str, Any]]:
        for node in self.nodes:
            limit = await asyncio.to_thread(file_handle_limit, node)
            if limit is not None and limit < 2 * max(self.levels):
                self.say(
                    f"  warning: RabbitMQ{' ' + node if node else ''} may hold {limit} files open, fewer "
                    f"than the {2 * max(self.levels)} mailboxes of {max(self.levels)} sessions: its file "
                    "handle cache will work through every queue at each queue operation (ending "
                    "sessions ran at 3 a second with 2,000 open here); raise its open-files limit "
                    "(docs/operations.md, 'Open files')"
                )
        bench = _SessionsBench(
            sessions=max(self.levels),
            concurrency=self.concurrency,
            rabbitmq_url=self.rabbitmq_url,
            redis_url=self.redis_url,
            out=self.out,
            llm=self.llm,
        )
        bench.rabbit_nodes = self.nodes
        bench.env["BARGEIN_MAILBOXES"] = self.mailboxes
        levels: list[dict[str, Any]] = []
        async with bench.stack() as before:
            pids: dict[str, int | list[int]] = {
                name: child.proc.pid for name, child in bench.children.items()
            }
            pids.update(rabbitmq=await self.broker_pids(), callers=os.getpid())
            for level in sorted(self.levels):
                count = level - len(bench.sockets)
                cpu_before = cpu_by_process(pids)
                rate = await bench.create_all(bench.children["broadcast"].url, count)
                cpu = {
                    name: (now - then) / count * 1000
                    for name, now in cpu_by_process(pids).items()
                    if now is not None and (then := cpu_before.get(name)) is not None
                }
                await asyncio.sleep(SETTLE_S)
                per_session = growth_per_session(before, await bench.memory(), level)
                turns = await self.active_phase(bench)
                levels.append(
                    {"idle": level, "starts_per_s": rate, "cpu_ms": cpu, "bytes": per_session, "turns": turns}
                )
                self.report_level(levels[-1], bench.connected())
        if self.mailboxes == "partitioned":  # durable: they would outlive the bench
            await forget_partitions(self.rabbitmq_url, self.redis_url, load(BrokerSettings).partitions)
        return levels

    async def broker_pids(self) -> list[int]:
        """The broker's OS processes (every node of a cluster): their CPU is read from /proc."""
        found = [await asyncio.to_thread(broker_pid, node) for node in self.nodes]
        return [pid for pid in found if pid is not None]

    async def active_phase(self, bench: _SessionsBench) -> dict[str, Any]:
        """``active`` callers type a turn every TURN_EVERY_S on average: text → first chunk."""
        count = min(self.active, len(bench.sockets))
        self.say(f"  {count} callers active for {self.active_s:.0f} s")
        waits: list[float] = []
        failures: list[str] = []
        deadline = time.monotonic() + self.active_s

        async def caller(index: int) -> None:
            ws = await bench.take_over(index)
            try:
                # spread over the pace, within the phase: every caller has a turn in a short one
                await asyncio.sleep(random.uniform(0, min(TURN_EVERY_S, self.active_s / 2)))
                while time.monotonic() < deadline:
                    began = time.monotonic()
                    try:
                        waits.append(await self.one_turn(ws))
                    except Exception as exc:  # a turn that fails is counted, the others go on
                        failures.append(f"{type(exc).__name__}: {exc}")
                        return
                    spent = time.monotonic() - began
                    await asyncio.sleep(max(0.0, random.uniform(0, 2 * TURN_EVERY_S) - spent))
            finally:
                bench.give_back(index)

        await asyncio.gather(*(caller(i) for i in range(count)))
        ordered = sorted(waits)
        summary: dict[str, Any] = {"callers": count, "turns": len(ordered), "failed": len(failures)}
        if ordered:
            summary.update(p50_ms=percentile(ordered, 50) * 1000, p95_ms=percentile(ordered, 95) * 1000)
        if failures:
            self.say(f"  {len(failures)} active callers failed, the first: {failures[0]}")
        return summary

    @staticmethod
    async def one_turn(ws: ClientConnection) -> float:
        """Seconds from a typed turn to its answer's first chunk; then the answer is read to its
        end (a caller listens before it speaks again)."""
        sent = time.monotonic()
        await ws.send(json.dumps({"type": "text", "text": "hello"}))
        first: float | None = None
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            while True:
                frame = json.loads(await ws.recv())
                if frame["type"] == "agent_chunk" and first is None:
                    first = time.monotonic() - sent
                elif frame["type"] == "turn_complete" and first is not None:
                    return first
                elif frame["type"] == "error":
                    raise BenchError(f"the edge answered a turn with {frame}")

    def report_level(self, level: dict[str, Any], connected: int) -> None:
        self.say(f"  {level['idle']} idle sessions ({connected} callers connected):")
        self.say(f"    sessions started a second (with the first answer): {level['starts_per_s']:.1f}")
        if level["cpu_ms"]:
            spent = ", ".join(f"{name} {ms:.1f} ms" for name, ms in level["cpu_ms"].items())
            self.say(f"    CPU per start: {spent}")
        for name, value in level["bytes"].items():
            shown = "n/a" if value is None else f"{value / 1024:,.1f} KB"
            self.say(f"    memory per idle session, {name:<10} {shown}")
        turns = level["turns"]
        if not turns.get("turns"):
            self.say(f"    {turns['callers']} active callers: no turn answered ({turns['failed']} failed)")
        else:
            self.say(
                f"    {turns['callers']} active callers: text → first chunk p50 {turns['p50_ms']:.0f} ms, "
                f"p95 {turns['p95_ms']:.0f} ms ({turns['turns']} turns, {turns['failed']} failed)"
            )

    # --- the mailbox designs ------------------------------------------------------------------

    async def designs(self, cluster: PrivateRabbitCluster | None) -> dict[str, Any]:
        self.say("")
        self.say("the mailbox designs, side by side on the same broker")
        run_id = designs.new_run_id()
        pids = await self.broker_pids()
        transport = await AmqpTransport.connect(self.rabbitmq_url, name=f"bench-scale-{run_id}")
        results: dict[str, Any] = {}
        try:
            edge = await transport.open_edge_queue(f"bench-scale-{run_id}", designs._ignore)
            starts = designs.PerSessionStarts(transport, edge, run_id)
            await asyncio.sleep(SETTLE_S)
            before = await asyncio.to_thread(rabbitmq_total, self.nodes)
            self.say(f"  per-session: starting {self.design_sessions} sessions' mailboxes and bindings")
            cost = await designs.measure_starts(starts, self.design_sessions, pids)
            await asyncio.sleep(SETTLE_S)
            after = await asyncio.to_thread(rabbitmq_total, self.nodes)
            per_session_kb = (
                None if before is None or after is None else (after - before) / self.design_sessions / 1024
            )
            results["per-session"] = {
                "starts_per_s": cost.per_s,
                "broker_cpu_ms": cost.broker_cpu_ms,
                "kb": per_session_kb,
            }
            await starts.tidy()
            await edge.cancel()

            before = await asyncio.to_thread(rabbitmq_total, self.nodes)
            partitioned = designs.PartitionedTopology(run_id)
            connection = await amqp_address.connect_robust(self.rabbitmq_url)
            async with connection:
                channel = await connection.channel()
                await partitioned.declare(channel, [])
                await asyncio.sleep(SETTLE_S)
                after = await asyncio.to_thread(rabbitmq_total, self.nodes)
                fixed_kb = None if before is None or after is None else (after - before) / 1024
                await partitioned.delete(channel)
                results["partitioned"] = {
                    "starts_per_s": None,
                    "broker_cpu_ms": 0.0,
                    "kb": 0.0,
                    "fixed_kb": fixed_kb,
                }

                sessions = [f"load-{run_id}-{i}" for i in range(LOAD_SESSIONS)]
                for topology in (
                    designs.PerSessionTopology(run_id, designs.mailbox_arguments(transport)),
                    designs.PartitionedTopology(run_id),
                ):
                    self.say(f"  {topology.name}: a control message to {LOAD_SESSIONS} sessions under load")
                    latency = await designs.control_latency(
                        connection,
                        topology,
                        sessions,
                        rate=LOAD_RATE,
                        work_ms=WORK_MS,
                        samples=self.samples,
                        sample_interval_s=SAMPLE_INTERVAL_S,
                    )
                    results[topology.name]["control"] = latency.summary()
            per_session_arguments = designs.mailbox_arguments(transport)
        finally:
            await transport.close()  # before a node is killed: nothing of the above to reconnect
        if cluster is not None:
            for name, arguments in (
                ("per-session", per_session_arguments),
                ("partitioned", designs.PARTITION_ARGUMENTS),
            ):
                results[name]["failover_s"] = await self.failover(cluster, run_id, name, arguments)
        self.report_designs(results)
        return results

    async def failover(
        self, cluster: PrivateRabbitCluster, run_id: str, design: str, arguments: dict[str, Any]
    ) -> float | None:
        """Kill the node holding a mailbox's leader (its master, for a mirrored classic queue) with
        a publisher and a consumer on the others; the node is started again afterwards."""
        queue = f"bench.scale.{run_id}.failover.{design}"
        connection = await amqp_address.connect_robust(cluster.url)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(queue, durable=True, arguments=arguments)
        await asyncio.sleep(SETTLE_S)  # the mirror synchronised, the quorum's members elected
        leader = await asyncio.to_thread(queue_leader, cluster.nodes[0].node, queue)
        victim = next((node for node in cluster.nodes if node.node == leader), None)
        if victim is None:
            self.say(
                f"  {design}: could not tell which node leads {queue} ({leader!r}); no failover measured"
            )
            return None
        others = ",".join(node.url for node in cluster.nodes if node is not victim)
        self.say(f"  {design}: SIGKILL the node leading its mailbox ({victim.node})")
        took = await designs.failover_time(others, queue, arguments, lambda: asyncio.to_thread(victim.kill))
        shown = "never" if took is None else f"{took:.2f} s"
        self.say(f"    the first message sent after the kill handled after {shown}")
        await asyncio.to_thread(victim.boot)
        return took

    def report_designs(self, results: dict[str, Any]) -> None:
        self.say("")
        self.say(
            f"  {'':<14} {'starts/s':>14} {'broker CPU/start':>17} {'KB/idle session':>16} "
            f"{'control p50/p99':>18} {'data carried':>13}"
        )
        for name, row in results.items():
            starts = "no broker work" if row["starts_per_s"] is None else f"{row['starts_per_s']:.0f}"
            cpu = "n/a" if row["broker_cpu_ms"] is None else f"{row['broker_cpu_ms']:.1f} ms"
            kb = "n/a" if row["kb"] is None else f"{row['kb']:.1f}"
            control = row.get("control", {})
            shown = f"{control['p50_ms']:.1f} / {control['p99_ms']:.1f} ms" if control.get("n") else "n/a"
            carried = f"{control['carried_per_s']:.0f}/s" if control else "n/a"
            self.say(f"  {name:<14} {starts:>14} {cpu:>17} {kb:>16} {shown:>18} {carried:>13}")
        for name, row in results.items():
            if "failover_s" in row:
                took = row["failover_s"]
                shown = "never (within 60 s)" if took is None else f"{took:.2f} s"
                met = verdict(took is not None and took <= TARGET_FAILOVER_S)
                self.say(
                    f"  {name}: failover after the leader's node was lost: {shown} (target ≤ 5 s: {met})"
                )
        fixed = results.get("partitioned", {}).get("fixed_kb")
        if fixed is not None and fixed < 0:  # the broker gave back more than they took meanwhile
            self.say("  (the partitions themselves: less than the broker's own churn here)")
        elif fixed is not None:
            queues = f"{designs.PARTITIONS} partitions of two quorum queues"
            self.say(f"  (the partitions themselves, {queues}: {fixed:,.0f} KB)")

    def verdicts(self, results: dict[str, Any]) -> None:
        self.say("")
        for level in results["levels"]:
            rate, rabbit = level["starts_per_s"], level["bytes"].get("rabbitmq")
            starts = f"{rate:.1f} starts/s (target ≥ 200: {verdict(rate >= TARGET_STARTS_PER_S)})"
            if rabbit is None:
                broker = "broker n/a"
            else:
                kb = rabbit / 1024
                broker = f"broker {kb:.0f} KB a session (target ≤ 30: {verdict(kb <= TARGET_BROKER_KB)})"
            self.say(f"  {level['idle']} idle: {starts}, {broker}")


async def run_scale_bench(
    levels: tuple[int, ...] = LEVELS,
    active: int = ACTIVE,
    active_s: float = ACTIVE_S,
    cluster: bool = False,
    mailboxes: str | None = None,
    with_designs: bool = True,
    concurrency: int = 20,
    design_sessions: int = DESIGN_SESSIONS,
    samples: int = SAMPLES,
    out: TextIO | None = None,
    llm: LLMChoice = "scripted",
) -> dict[str, Any]:
    if not levels or min(levels) < 1 or active < 0:
        raise ValueError("levels must be at least 1, active at least 0")
    bench = _ScaleBench(
        levels=levels,
        active=active,
        active_s=active_s,
        cluster=cluster,
        mailboxes=mailboxes or load(BrokerSettings).mailboxes,
        with_designs=with_designs,
        concurrency=concurrency,
        design_sessions=design_sessions,
        samples=samples,
        out=out if out is not None else sys.stdout,
        llm=llm,
    )
    return await bench.run()


def scale_main(**options: Any) -> int:
    """``bargein bench scale``: run the bench, print the report."""
    return run_main(lambda: run_scale_bench(**options), "scale")
