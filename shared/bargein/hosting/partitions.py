"""A worker's share of a partitioned tier (``BARGEIN_MAILBOXES=partitioned``).

With partitioned mailboxes a session's messages wait in the partition its id hashes to
(:func:`bargein.wire.names.partition_of`), not in a queue of its own, so whoever consumes a
partition owns its sessions. A partition is held as a session is: a lease with an epoch in the state
store (:func:`~bargein.wire.names.partition_lease`), renewed every quarter of its life. Each worker
holds its share (the partitions over the live workers, rounded down or up): it takes free ones while
it has fewer, and hands the extra ones back when workers join. A dead worker's partition leases lapse
and the others take them; the broker's single active consumer keeps a worker that lost a partition
(paused past its lease, say) from consuming it beside its successor.

Sessions keep leases of their own, so fencing and checkpoints are as with a mailbox per session: a
partition's new owner takes each session's lease and checkpoint as it hears from the session
(:meth:`~bargein.hosting.host.SessionHost.deliver`), or at once for those its old owner had (the
worker's adoption, :mod:`bargein.hosting.worker`), resuming any turn it was running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass

from bargein import metrics
from bargein.errors import SettingsError
from bargein.hosting.host import SessionHost
from bargein.tasks import cancel_and_wait
from bargein.transport.abc import Renewal, StartHandler, Subscription
from bargein.wire.names import partition_lease, partition_of

log = logging.getLogger("bargein.hosting.partitions")

CONSUMING_CHECK_S = 0.1  # how soon a partition whose consumer stopped is consumed again


@dataclass
class _Held:
    epoch: int
    subscription: Subscription


class PartitionKeeper:
    """Holds ``count`` partitions' worth of this worker's share of ``host``'s tier: leases,
    consumers, hand-overs. ``on_start`` takes the session starts that come down its partitions."""

    def __init__(
        self,
        host: SessionHost,
        count: int,
        on_start: StartHandler,
        *,
        ttl_ms: int = 2_000,
        hand_over_s: float = 10.0,
    ) -> None:
        self.host = host
        self.count = count
        self.on_start = on_start
        self.ttl_ms = ttl_ms
        self.hand_over_s = hand_over_s
        self.held: dict[int, _Held] = {}
        self._task: asyncio.Task[None] | None = None
        # A stop waits for the keeper's round under way, and for a take from a dead worker under
        # way, rather than cancelling them: a consume cancelled on its way makes aiormq close the
        # channel, and with it every partition this worker consumes. (Two locks: a take from a dead
        # worker must not wait for a hand-over's turns to end.)
        self._round = asyncio.Lock()
        self._taking = asyncio.Lock()
        self._stopped = False
        self._failing = False
        self._restoring_until = 0.0  # (time.monotonic) Redis lost the leases: take none before

    def holds(self, session: str) -> bool:
        """Whether ``session``'s partition is this worker's."""
        return partition_of(session, self.count) in self.held

    def sessions_of(self, partition: int) -> list[str]:
        return [sid for sid in self.host.sessions if partition_of(sid, self.count) == partition]

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Check that the tier runs with the same number of partitions, take a first share, and
        keep the share up to date from now on."""
        tier = self.host.tier
        recorded = await self.host.store.claim_partition_count(tier, self.count)
        if recorded != self.count:
            raise SettingsError(
                f"BARGEIN_PARTITIONS={self.count}, but the {tier} tier runs with {recorded} "
                f"(every process must hash sessions alike: docs/operations.md, 'Partitioned mailboxes')"
            )
        await self.balance()
        self._task = asyncio.create_task(self._keep(), name=f"partitions:{tier}")

    async def _keep(self) -> None:
        """Balance every quarter of a lease's life; in between, consume again at once what stopped
        (the connection came back): what waits in a partition, an edge's request for chunks it
        missed say, must not wait for the next round."""
        loop = asyncio.get_running_loop()
        while True:
            next_round = loop.time() + self.ttl_ms / 4000
            while loop.time() < next_round:
                await asyncio.sleep(min(CONSUMING_CHECK_S, max(0.0, next_round - loop.time())))
                async with self._round:
                    if self._stopped:
                        return
                    with contextlib.suppress(Exception):  # the broker is still away: the round says so
                        await self._consume_again()
            async with self._round:
                if self._stopped:
                    return
                await self._balance_round()

    async def _balance_round(self) -> None:
        try:
            await self.balance()
        except Exception as exc:  # Redis away: say so once; the leases lapse if it lasts
            if not self._failing:
                log.warning("keeping partitions failed (%s: %s); retrying", type(exc).__name__, exc)
            self._failing = True
        else:
            if self._failing:
                log.info("keeping partitions works again")
            self._failing = False

    async def balance(self) -> None:
        """Renew what is held (letting go of what was lost), consume again what stopped, and move
        toward this worker's share: hand back extras, take free partitions."""
        host, tier = self.host, self.host.tier
        if self.held:
            asked = dict(self.held)  # (one taken from a dead worker meanwhile was not asked about)
            leases = {partition_lease(p): held.epoch for p, held in asked.items()}
            renewed = await host.store.renew_leases(tier, host.owner, leases, self.ttl_ms)
            if Renewal.RESTORED in renewed.values():
                self._redis_lost_data()
            for partition, held in asked.items():
                if self.held.get(partition) is held and not renewed[partition_lease(partition)]:
                    log.warning("partition %d of %s: its lease was lost; letting it go", partition, tier)
                    await self._let_go(partition, lost=True)
        await self._consume_again()
        if self._restoring:
            return
        fewest, most = await self._share()
        for partition in sorted(self.held, reverse=True)[: max(0, len(self.held) - most)]:
            await self._let_go(partition, lost=False)
        if len(self.held) < most:
            # short of the fewest: try every free one; else one at a time (the share rounded up is
            # more than the partitions left when they do not divide evenly)
            wanted = fewest - len(self.held) if len(self.held) < fewest else 1
            candidates = [p for p in range(self.count) if p not in self.held]
            random.shuffle(candidates)
            for partition in candidates if len(self.held) < fewest else candidates[:1]:
                if wanted <= 0:
                    break
                if await self._take(partition):
                    wanted -= 1

    async def _share(self) -> tuple[int, int]:
        """The fewest and the most partitions this worker should hold: the partitions over the live
        workers, rounded down and up."""
        workers = max(1, len(await self.host.store.live_workers(self.host.tier)))
        return self.count // workers, -(-self.count // workers)

    async def take_from_dead(self, dead: str) -> int:
        """Take the partitions of ``dead``, a worker whose heartbeat stopped, up to this worker's
        share, without waiting for their leases to lapse (twice the liveness TTL): its sessions
        then resume within about the liveness TTL, as with a mailbox per session. Measured
        before: 2.6 s from a kill to the first resumed chunk against 1.x per-session (the fault
        suite's two-second test, partitioned). How many were taken."""
        if self._stopped or self._restoring or not self.running:
            return 0
        most, taken = (await self._share())[1], 0
        for partition in range(self.count):
            if len(self.held) >= most:
                break
            if partition in self.held:
                continue
            async with self._taking:
                if self._stopped:
                    break
                if await self._take(partition, replacing=dead):
                    taken += 1
        return taken

    @property
    def _restoring(self) -> bool:
        """Within a lease's life of finding its own partition leases gone: take none, hand none back."""
        return time.monotonic() < self._restoring_until

    def _redis_lost_data(self) -> None:
        """A lease this worker renewed was gone (Redis restarted without persistence; or it
        lapsed, while Redis or the broker kept this worker's rounds from running): every
        worker's partition leases may have gone with it, and each holder takes its own back at its next
        renewal, within a quarter of a lease's life. Until a lease's life has passed, a partition
        that looks free is likely one of those: taking it would rob a live worker of its sessions,
        whose conversations only that worker still holds (measured: the fault suite's Redis restart
        with partitions lost a conversation in about one run of four when another worker, seeing
        too few heartbeats yet, took a share that was not free). So none is taken or handed back
        meanwhile."""
        if not self._restoring:
            log.warning(
                "%s %s: its partitions' leases were gone (Redis lost them, or they lapsed); taking "
                "none for %.1f s, their holders restoring them",
                self.host.tier,
                self.host.owner,
                self.ttl_ms / 1000,
            )
        self._restoring_until = time.monotonic() + self.ttl_ms / 1000

    async def _consume_again(self) -> None:
        """Consume again each held partition whose consumer stopped (the connection came back, or
        the broker cancelled it)."""
        host = self.host
        for partition, held in list(self.held.items()):
            if not held.subscription.alive and self.held.get(partition) is held:
                held.subscription = await host.transport.open_partition(
                    host.tier, partition, host.deliver, self.on_start
                )
                log.info("partition %d of %s: consuming it again", partition, host.tier)

    async def _take(self, partition: int, *, replacing: str | None = None) -> bool:
        """Take a free partition (or one ``replacing``, a dead worker, holds)."""
        host, tier = self.host, self.host.tier
        epoch = await host.store.acquire_lease(
            tier, partition_lease(partition), host.owner, self.ttl_ms, replacing=replacing
        )
        if epoch is None:
            return False
        try:
            subscription = await host.transport.open_partition(tier, partition, host.deliver, self.on_start)
        except BaseException:
            await host.store.release_lease(tier, partition_lease(partition), host.owner, epoch)
            raise
        self.held[partition] = _Held(epoch, subscription)
        metrics.count(tier, "partitions_taken")
        log.info("%s %s: took partition %d (epoch %d)", tier, host.owner, partition, epoch)
        return True

    async def _let_go(self, partition: int, *, lost: bool) -> None:
        """Hand a partition over: its turns may finish here first (``hand_over_s``, consuming on, so
        interrupts still reach them), then its sessions are checkpointed and released, and the
        partition with them. A lost one goes at once."""
        held = self.held[partition]
        host = self.host
        if not lost:
            for sid in self.sessions_of(partition):
                host.sessions[sid].runtime.hold()
            deadline = asyncio.get_running_loop().time() + self.hand_over_s

            def turns_under_way() -> bool:  # (a drain stopping the keeping waits for them itself)
                return not self._stopped and any(
                    host.sessions[sid].runtime.active_turns for sid in self.sessions_of(partition)
                )

            while asyncio.get_running_loop().time() < deadline and turns_under_way():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        del self.held[partition]
        await held.subscription.cancel()
        for sid in self.sessions_of(partition):
            await host.close(sid)
        if not lost:
            await host.store.release_lease(host.tier, partition_lease(partition), host.owner, held.epoch)
            metrics.count(host.tier, "partitions_handed_over")
            log.info("%s %s: handed partition %d over", host.tier, host.owner, partition)

    async def stop_keeping(self, *, graceful: bool = True) -> None:
        """Take no more partitions and give none back: what is held stays consumed (a drain's turns
        finish meanwhile, and interrupts still reach them). A round under way (a take, a hand-over)
        ends first, up to ``hand_over_s``: cut off inside a consume, it would close the channel every
        partition is consumed on. Not ``graceful`` (a kill, in tests): it is cut off where it is."""
        self._stopped = True
        if graceful:
            await self._let_the_round_end()
        await cancel_and_wait(self._task)
        self._task = None

    async def _let_the_round_end(self) -> None:
        """Wait until neither a round nor a take is under way (none starts once ``_stopped``)."""
        try:
            async with asyncio.timeout(self.hand_over_s), self._taking, self._round:
                pass
        except TimeoutError:
            log.warning(
                "%s %s: a round of keeping partitions did not end within %.0f s; stopping it where it is",
                self.host.tier,
                self.host.owner,
                self.hand_over_s,
            )

    async def release_all(self) -> None:
        """Stop consuming and give back every partition (its sessions are closed already: the end
        of a drain), so other workers take them at once rather than when the leases lapse."""
        await self.stop_keeping()
        for partition, held in list(self.held.items()):
            del self.held[partition]
            await held.subscription.cancel()
            with contextlib.suppress(Exception):  # Redis away: the lease lapses on its own
                await self.host.store.release_lease(
                    self.host.tier, partition_lease(partition), self.host.owner, held.epoch
                )

    async def abandon(self) -> None:
        """Stop as a killed process would: consumers gone, nothing released (tests)."""
        await self.stop_keeping(graceful=False)
        for held in self.held.values():
            await held.subscription.cancel()
        self.held.clear()
