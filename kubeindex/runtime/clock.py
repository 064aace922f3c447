"""Time, injectable: the work queue, the reflector and the elector take a Clock, so tests step a
fake one instead of sleeping (client-go's clock.Clock)."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float:
        """Wall time, seconds since the epoch: what another process's clock is compared with (a
        watch's last event, in its age on /metrics)."""
        ...

    async def sleep(self, seconds: float) -> None: ...


class RealClock:
    time = staticmethod(time.time)  # the builtin itself: a watch reads it for every event

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


REAL = RealClock()
