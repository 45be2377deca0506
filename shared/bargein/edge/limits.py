"""What one connection may send: enough for any caller, too little to slow anyone else down.

Every text turn, stop and hang-up a client sends becomes messages on the bus and work for the
session's owner, which shares its process (and the broker) with other sessions. A client that sends
10,000 stops at once would delay everyone; so each connection has a budget, refilled steadily, and
what is over it is refused with one ``rate_limited`` frame (at most one a second, so the refusal
itself cannot flood). Delivery reports (``played``) are cheap and coalesced, and are not limited.
Audio has a budget of its own, in bytes: a multiple of real time, with two-second bursts.
"""

from __future__ import annotations

import time

from aiolimiter import AsyncLimiter

from bargein.agent.events import SAMPLE_RATE, SAMPLE_WIDTH
from bargein.settings import BroadcastSettings

AUDIO_BURST_S = 2.0
TELL_EVERY_S = 1.0


class ClientLimits:
    def __init__(self, settings: BroadcastSettings, max_frame_bytes: int) -> None:
        burst = settings.client_burst
        self._messages = AsyncLimiter(burst, burst / settings.client_messages_per_s)
        audio_bytes = SAMPLE_RATE * SAMPLE_WIDTH * settings.client_audio_realtime * AUDIO_BURST_S
        self._audio = AsyncLimiter(max(audio_bytes, max_frame_bytes), AUDIO_BURST_S)
        self._told_at = -TELL_EVERY_S

    async def message(self) -> bool:
        """Whether one more message fits the budget (taking it from the budget if so)."""
        return await self._take(self._messages, 1)

    async def audio(self, size: int) -> bool:
        return await self._take(self._audio, size)

    @staticmethod
    async def _take(limiter: AsyncLimiter, amount: float) -> bool:
        if not limiter.has_capacity(amount):
            return False
        await limiter.acquire(amount)  # has capacity: returns at once
        return True

    def should_tell(self) -> bool:
        """Whether to send a ``rate_limited`` frame now (at most one a second)."""
        now = time.monotonic()
        if now - self._told_at < TELL_EVERY_S:
            return False
        self._told_at = now
        return True
