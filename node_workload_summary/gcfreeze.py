"""Garbage collection for a large index that lives as long as the process.

Python's collector walks every tracked object on a full (generation 2) collection: at 150,000
pods that is over 500,000 objects (a PodEntry, an owner-graph Vertex and its Resolution per pod)
and 300 to 650 ms with the event loop stopped; at 60,000 pods about 150 ms. Nothing else the
service does stops the loop that long, and a full collection comes whenever the objects promoted
since the last one pass a quarter of the population, so it lands inside a node event's way to
/metrics now and then: the tail of the latency.

The index's objects do not form reference cycles (they point at each other by key, never by
reference), so they need no cycle collection at all. So:

- once the initial sync is complete: a full collection, then ``gc.freeze()``: everything alive
  moves to the permanent generation, which collections skip;
- after each later full collection (Python's own, it now walks only what came since the last
  freeze): freeze its survivors too. The full collections stay frequent but small (each walks
  what was promoted since the previous one);
- every ``full_every`` seconds (an hour): ``gc.unfreeze()``, a full collection over everything,
  freeze again. A frozen object is still freed when its last reference goes; only a reference
  cycle that was frozen while alive and dropped afterwards (an HTTP connection's objects, an
  exception's traceback) waits for this, so at most an hour of such garbage is held.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

log = logging.getLogger(__name__)
FULL_EVERY = 3600.0  # seconds between full collections over the frozen objects too
CHECK_EVERY = 1.0  # seconds between looks at whether Python ran a full collection


class Freezer:
    def __init__(self, full_every: float = FULL_EVERY, check_every: float = CHECK_EVERY) -> None:
        self.full_every = full_every
        self.check_every = check_every
        self.collected = False  # Python ran a full collection since the last freeze
        self.last_full_seconds = 0.0  # the pause of the last full collection made here
        self.refreezes = 0

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "stop" and info["generation"] == 2:
            self.collected = True

    def full(self) -> int:
        """A full collection over every object, frozen ones included; then freeze the survivors.
        Returns the number frozen."""
        started = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self.last_full_seconds = time.perf_counter() - started
        self.collected = False
        return gc.get_freeze_count()

    def step(self) -> None:
        """After a full collection of Python's own: freeze what it left (it walked it just now)."""
        if self.collected:
            self.collected = False
            gc.freeze()
            self.refreezes += 1

    async def run(self, ready: asyncio.Event) -> None:
        await ready.wait()
        frozen = self.full()
        log.info("initial sync complete: %d objects frozen out of garbage collection (full collection %.0f ms)",
                 frozen, self.last_full_seconds * 1000)
        gc.callbacks.append(self._on_gc)
        due = time.monotonic() + self.full_every
        try:
            while True:
                await asyncio.sleep(self.check_every)
                if time.monotonic() >= due:
                    frozen = self.full()
                    due = time.monotonic() + self.full_every
                    log.debug("full collection over %d objects in %.0f ms", frozen, self.last_full_seconds * 1000)
                else:
                    self.step()
        finally:
            gc.callbacks.remove(self._on_gc)
