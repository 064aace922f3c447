"""The keyed work queue (reconciler/workqueue.py): one key at a time, debounce, backoff, clear."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from reconciler.workqueue import WorkQueue

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def test_queue_dedupes_and_never_hands_a_key_to_two_workers() -> None:
    async def main() -> list[str]:
        q: WorkQueue[str] = WorkQueue(debounce=0)
        for key in ("a", "b", "a"):
            q.add(key)
        first = await q.get()
        q.add(first)  # added while processing: queued again only after done
        second = await q.get()
        assert second != first
        q.done(second)
        q.done(first)
        third = await q.get()
        q.done(third)
        return [first, second, third]

    assert run(main()) == ["a", "b", "a"]


def test_queue_debounce_and_backoff() -> None:
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue(debounce=0.3, base_delay=0.1)
        q.add("k")
        assert await q.get() == "k"
        q.wrote("k")
        q.done("k")
        started = time.monotonic()
        for _ in range(5):
            q.add("k")  # a flapping object: one more write after the debounce, not five
        assert await q.get() == "k"
        assert time.monotonic() - started >= 0.25
        q.done("k")
        assert len(q) == 0
        q.retry("k")
        q.retry("k")  # the earlier due time wins; failures grow the next delay
        assert await asyncio.wait_for(q.get(), 1) == "k"
        q.done("k")

    run(main())


def test_queue_clear_drops_waiting_keys() -> None:
    async def main() -> None:
        q: WorkQueue[str] = WorkQueue(debounce=0)
        q.add("a")
        q.retry("b")
        q.clear()
        assert len(q) == 0
        q.add("c")
        assert await q.get() == "c"

    run(main())
