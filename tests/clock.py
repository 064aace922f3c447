"""A fake Clock (kubeindex/runtime/clock.py) that tests step, as client-go's fake clock: time moves only
by ``advance``, and each sleeper wakes once the clock has passed its deadline."""

from __future__ import annotations

import asyncio
import heapq

EPOCH = 1_800_000_000.0  # the fake wall time at monotonic 0


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._serial = 0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        """Wall time, stepped with the monotonic one."""
        return EPOCH + self.now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._serial += 1
        heapq.heappush(self._sleepers, (self.now + seconds, self._serial, future))
        await future

    @property
    def sleepers(self) -> int:
        """Sleeps under way (cancelled ones excluded)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    async def advance(self, seconds: float) -> None:
        """Move time on, waking every sleeper due by then, and let the woken tasks run."""
        self.now += seconds
        while self._sleepers and self._sleepers[0][0] <= self.now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
        await settle()


async def settle(rounds: int = 20) -> None:
    """Let every runnable task run until it waits again."""
    for _ in range(rounds):
        await asyncio.sleep(0)
