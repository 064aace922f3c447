"""One policy for repeating problems in the log: say a problem when it appears (or its reason
changes), then at most every LOG_EVERY seconds while it persists, and say when it is over."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

LOG_EVERY = 300.0  # seconds between two log lines of one persisting failure


class ThrottledLog:
    def __init__(self, logger: logging.Logger, every: float = LOG_EVERY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.logger = logger
        self.every = every
        self.clock = clock
        self._said: dict[str, tuple[str, float]] = {}  # topic -> (reason, when) last logged

    def __call__(self, topic: str, reason: str, level: int, message: str, *args: object,
                 exc_info: BaseException | bool | None = None, extra: Mapping[str, object] | None = None) -> bool:
        """Log ``message`` unless ``reason`` was said on ``topic`` within ``every`` seconds;
        True when it was logged. ``extra``: the line's structured fields (logfields.py)."""
        now = self.clock()
        last = self._said.get(topic)
        if last is not None and last[0] == reason and now - last[1] < self.every:
            return False
        self._said[topic] = (reason, now)
        self.logger.log(level, message, *args, exc_info=exc_info, extra=extra)
        return True

    def clear(self, topic: str) -> bool:
        """The problem on ``topic`` is over; True when it had been logged (worth saying so)."""
        return self._said.pop(topic, None) is not None
