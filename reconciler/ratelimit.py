"""The token bucket every write of the reconciler takes a token from (``--writes-per-second``)."""

from __future__ import annotations

import asyncio
import time


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up: a quiet period buys a burst, never more."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    async def take(self) -> None:
        """Wait until a token is there, and take it."""
        while True:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await asyncio.sleep((1 - self.tokens) / self.rate)
