"""The token bucket, as client-go's QPS and burst: the reconciler's writes wait for a token
(``--writes-per-second``), Events pass one per object, and /metrics refuses a token review beyond
one (``--metrics-auth-reviews-per-second``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up: a quiet period buys a burst, never more."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst = rate, burst
        self.clock = clock
        self.tokens = float(burst)
        self.stamp = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.stamp) * self.rate)
        self.stamp = now

    def try_take(self) -> bool:
        """Take a token if one is there (client-go's TryAccept); False, and nothing taken, if not."""
        self._refill()
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def delay(self) -> float:
        """Seconds until a token is there (0: one is there now)."""
        self._refill()
        return max(0.0, (1 - self.tokens) / self.rate)

    async def take(self) -> None:
        """Wait until a token is there, and take it."""
        while not self.try_take():
            await asyncio.sleep(self.delay())
