"""The one backoff formula, and its caps: how long to wait before trying again after an error."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

BACKOFF_CAP = 10.0  # seconds: the longest wait after an error that should pass on its own
SLOW_BACKOFF_CAP = 60.0  # seconds: after answers that repeat until someone acts (RBAC, a CRD), and writes


def backoff(attempt: int, base: float = 0.25, cap: float = BACKOFF_CAP) -> float:
    """``base`` doubling per attempt, capped at ``cap``."""
    return min(cap, base * 2**attempt)


async def sleep_jittered(attempt: int, base: float = 0.25, cap: float = BACKOFF_CAP,
                         sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
    """Exponential backoff with full jitter (``sleep``: a Clock's, in tests)."""
    await sleep(random.uniform(0, backoff(attempt, base, cap)))
