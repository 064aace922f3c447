"""The keyed work queue (reconciler/workqueue.py): one key at a time, and its timing rules on a fake
clock: debounce, backoff, forget, the earlier due time; its own metrics (client-go's workqueue_*)."""

from __future__ import annotations

import asyncio

import pytest

from kubeindex.runtime.histogram import Histogram
from reconciler.workqueue import Pacing, WorkQueue
from tests.clock import FakeClock, settle


async def _due(q: WorkQueue[str], clock: FakeClock, key: str, by: float) -> float:
    """Seconds of fake time until ``key`` is handed out (stepping 0.1 s at a time, at most ``by``)."""
    started = clock.now
    getter = asyncio.ensure_future(q.get())
    await settle()
    while not getter.done():
        assert clock.now - started < by, f"{key} not handed out within {by} s"
        await clock.advance(0.1)
    assert getter.result() == key
    q.done(key)
    return round(clock.now - started, 6)


def test_debounce_holds_a_rewritten_key_and_merges_its_adds() -> None:
    async def main() -> tuple[float, float, int]:
        clock = FakeClock()
        q: WorkQueue[str] = WorkQueue(debounce=2.0, clock=clock)
        q.add("k")
        first = await _due(q, clock, "k", 1)  # the first change goes out at once
        q.wrote("k")
        for _ in range(5):
            q.add("k")  # a flapping object: one write after the debounce, not five
        second = await _due(q, clock, "k", 5)
        return first, second, len(q)

    assert asyncio.run(main()) == (0, 2.0, 0)


def test_a_delayed_add_holds_the_first_change_and_later_adds_do_not_push_it_off() -> None:
    """``Pacing(delay=...)``: a burst of changes is one write, ``delay`` after its first change (never
    later, however long the burst goes on), and the debounce after a write still holds."""
    async def main() -> tuple[float, float, float, int]:
        clock = FakeClock()
        q: WorkQueue[str] = WorkQueue(debounce=2.0, clock=clock)
        q.add("k", Pacing(delay=1.0))
        for _ in range(9):  # the burst goes on for 0.9 s
            await clock.advance(0.1)
            q.add("k", Pacing(delay=1.0))
        first = round(0.9 + await _due(q, clock, "k", 2), 6)  # from the burst's first add
        q.wrote("k")
        q.add("k", Pacing(delay=1.0))  # the debounce (2 s) is longer than the delay: it decides
        second = await _due(q, clock, "k", 5)
        await clock.advance(5)
        q.add("k", Pacing(delay=0.5))  # long after the debounce: the delay alone
        third = await _due(q, clock, "k", 5)
        return first, second, third, len(q)

    assert asyncio.run(main()) == (1.0, 2.0, 0.5, 0)


def test_a_change_of_less_weight_asks_a_longer_debounce_and_news_still_go_out_at_once() -> None:
    """``Pacing(debounce=5)`` waits 5 s from the last write, not the queue's 1 s; a plain add
    while it waits goes out at once (past the 1 s), and the longer wait it replaced is void."""
    async def main() -> tuple[float, float, int, float]:
        clock = FakeClock()
        q: WorkQueue[str] = WorkQueue(debounce=1.0, clock=clock)
        q.wrote("k")
        q.add("k", Pacing(debounce=5.0))
        slow = await _due(q, clock, "k", 10)  # 5 s after the write
        q.wrote("k")
        q.add("k", Pacing(debounce=5.0))
        await clock.advance(2)
        q.add("k")  # news: its 1 s debounce is over
        news = await _due(q, clock, "k", 1)
        q.wrote("k")
        await clock.advance(6)
        void = len(q)  # the wait the news replaced (due 5 s after the second write) handed out nothing
        q.add("k", Pacing(debounce=5.0))  # long after the last write: at once
        quiet = await _due(q, clock, "k", 1)
        return slow, news, void, quiet

    assert asyncio.run(main()) == (5.0, 0, 0, 0)


def test_changes_on_a_beat_fall_due_together_and_never_before_their_debounce() -> None:
    """``beat``: a key's time is rounded up to a whole multiple of the beat, so keys written at
    different times and changed at different times go out in one burst; the debounce still holds
    (rounding only ever waits longer). Without a beat each keeps its own time."""
    async def main() -> tuple[list[float], list[float]]:
        clock = FakeClock(start=1000.1)
        q: WorkQueue[str] = WorkQueue(debounce=1.0, clock=clock)
        q.wrote("a")
        await clock.advance(0.3)
        q.wrote("b")
        await clock.advance(0.4)
        q.wrote("c")
        for key in "abc":
            q.add(key, Pacing(debounce=5.0, beat=1.0))
        beat = sorted(q._waiting_at.values())
        q.clear()
        for key in "abc":
            q.wrote(key)  # at 1000.8, all three
        await clock.advance(0.2)
        q.add("a", Pacing(debounce=5.0))
        q.add("b", Pacing(delay=1.0, debounce=5.0))
        return beat, sorted(q._waiting_at.values())

    beat, own = asyncio.run(main())
    assert beat == [1006.0, 1006.0, 1006.0]  # written at 1000.1, 1000.4 and 1000.8: due at 1005.1 to 1005.8
    assert own == pytest.approx([1005.8, 1005.8])


def test_failures_grow_the_next_delay_up_to_the_cap_and_forget_resets_it() -> None:
    async def main() -> list[float]:
        clock = FakeClock()
        q: WorkQueue[str] = WorkQueue(debounce=0, base_delay=0.5, max_delay=3.0, clock=clock)
        delays = []
        for _ in range(5):
            q.retry("k")
            delays.append(await _due(q, clock, "k", 10))
        q.forget("k")
        q.retry("k")
        delays.append(await _due(q, clock, "k", 10))
        return delays

    assert asyncio.run(main()) == [0.5, 1.0, 2.0, 3.0, 3.0, 0.5]


def test_retry_now_makes_the_keys_in_backoff_due_and_keeps_their_failures() -> None:
    """The API server answers again (the manager's retry_now): what failed while it was away is
    tried at once, not after backoffs grown meanwhile; failing again, a key backs off from where
    it was. Keys waiting for anything else (a delayed add) keep their time."""
    async def main() -> list[float]:
        clock = FakeClock()
        q: WorkQueue[str] = WorkQueue(debounce=0, base_delay=1.0, max_delay=60.0, clock=clock)
        for _ in range(4):
            q.retry("k")
            await _due(q, clock, "k", 20)  # 1, 2, 4, 8 s
        q.retry("k")  # due in 16 s
        q.add_after("later", 5.0)
        await clock.advance(1)
        q.retry_now()
        due = [await _due(q, clock, "k", 1)]
        due.append(await _due(q, clock, "later", 5))
        q.retry("k")  # its sixth failure: 32 s
        due.append(await _due(q, clock, "k", 40))
        return due

    now, later, again = asyncio.run(main())
    assert (now, later) == (0, 4.0)
    assert again == pytest.approx(32.0, abs=0.11)  # the fake clock steps 0.1 s at a time


def test_the_earlier_due_time_wins() -> None:
    async def main() -> tuple[float, float]:
        clock = FakeClock()
        q: WorkQueue[str] = WorkQueue(debounce=5.0, base_delay=1.0, clock=clock)
        for key in ("a", "b"):
            q.add(key)
            await _due(q, clock, key, 1)
            q.wrote(key)  # an add now waits until the debounce is over: 5 s
        q.add("a")
        q.retry("a")  # due in 1 s: earlier, so it wins
        q.retry("b")
        q.add("b")  # due in 5 s: later, so the retry's time stays
        return await _due(q, clock, "a", 6), await _due(q, clock, "b", 6)

    a, b = asyncio.run(main())
    assert a == 1.0
    assert b == 0  # due at the same moment as "a": handed out right after it


def test_a_key_added_while_processed_is_queued_again_after_done() -> None:
    async def main() -> list[str]:
        clock = FakeClock()
        q: WorkQueue[str] = WorkQueue(debounce=0, clock=clock)
        q.add("k")
        key = await q.get()
        q.add("k")  # changed while a worker has it: not handed to a second worker
        getter = asyncio.ensure_future(q.get())
        await settle()
        handed = [key] + ([getter.result()] if getter.done() else [])
        q.done("k")
        await settle()
        return handed + ([getter.result()] if getter.done() else [])

    assert asyncio.run(main()) == ["k", "k"]


def test_clear_drops_waiting_keys() -> None:
    async def main() -> str:
        clock = FakeClock()
        q: WorkQueue[str] = WorkQueue(debounce=0, clock=clock)
        q.add("a")
        q.retry("b")
        q.clear()
        assert len(q) == 0
        q.add("c")
        return await q.get()

    assert asyncio.run(main()) == "c"


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

    assert asyncio.run(main()) == ["a", "b", "a"]


def _observed(histogram: Histogram) -> list[tuple[str, int]]:
    """The buckets that hold an observation: (le, observations in that bucket alone)."""
    out, below = [], 0
    for le, total in histogram.cumulative():
        if total > below:
            out.append((le, total - below))
        below = total
    return out


def test_metrics_count_adds_retries_depth_and_time_waiting_and_working() -> None:
    """client-go's semantics: an add is counted when a key becomes queued (not again while it is),
    a retry's backoff and a debounce are not in the depth until due, the wait runs from queued (or
    due) to taken, the work from taken to done."""
    async def main() -> None:
        clock = FakeClock()
        q: WorkQueue[str] = WorkQueue(debounce=2.0, base_delay=1.0, clock=clock)
        q.add("a")
        q.add("a")  # already queued: not counted
        q.add("b")
        assert (q.adds, q.depth, q.retries) == (2, 2, 0)
        await clock.advance(0.5)
        assert await q.get() == "a"  # waited 0.5 s
        assert q.depth == 1
        q.add("a")  # changed while a worker has it: queued again after done, counted now
        assert (q.adds, q.depth) == (3, 2)
        await clock.advance(0.03)
        q.wrote("a")
        q.done("a")  # worked 0.03 s
        assert await q.get() == "b" and await q.get() == "a"  # b waited 0.53 s, a 0.03 s
        q.done("b")
        q.retry("a")  # due in 1 s: not in the depth until then
        q.done("a")
        assert (q.retries, q.depth, q.adds) == (1, 0, 3)
        getter = asyncio.ensure_future(q.get())
        while not getter.done():
            await clock.advance(0.1)
        assert getter.result() == "a" and q.adds == 4  # due after its backoff, then taken at once
        q.wrote("a")
        q.done("a")
        q.add("a")  # debounced for 2 s: counted when due, not before
        assert (q.adds, q.depth) == (4, 0)
        await clock.advance(2.0)
        assert await q.get() == "a" and q.adds == 5
        q.done("a")
        assert q.depth == 0
        assert q.queue_duration.count == 5 and q.work_duration.count == 5
        assert _observed(q.queue_duration) == [("0.001", 2), ("0.05", 1), ("0.5", 1), ("1.0", 1)]
        assert _observed(q.work_duration) == [("0.001", 4), ("0.05", 1)]
        assert round(q.queue_duration.sum, 6) == round(0.5 + 0.53 + 0.03, 6)

    asyncio.run(main())


def test_clear_keeps_no_wait_times_for_keys_it_dropped() -> None:
    async def main() -> None:
        clock = FakeClock()
        q: WorkQueue[str] = WorkQueue(debounce=0, clock=clock)
        for key in ("a", "b"):
            q.add(key)
        taken = await q.get()
        q.clear()  # leadership lost: "b" dropped, "a" finishes
        await clock.advance(5)
        q.done(taken)
        q.add("c")
        assert await q.get() == "c"
        assert q.depth == 0 and q.queue_duration.count == 2  # "a" and "c", both at once
        assert q.queue_duration.sum == 0 and q.work_duration.sum == 5

    asyncio.run(main())


def test_idle_workers_share_one_timer_and_a_ready_key_wakes_one_of_them() -> None:
    """Eight workers wait while keys wait for their debounce: one sleep on the clock stands for all
    of them (not one per worker, re-made on every change), and each key made ready is taken by
    exactly one worker."""
    async def main() -> tuple[int, int, list[str]]:
        clock = FakeClock()
        q: WorkQueue[str] = WorkQueue(debounce=2.0, clock=clock)
        for key in ("a", "b", "c"):
            q.wrote(key)
            q.add(key)  # each waits 2 s
        taken: list[str] = []

        async def worker() -> None:
            while True:
                taken.append(await q.get())

        workers = [asyncio.ensure_future(worker()) for _ in range(8)]
        await settle()
        sleepers = clock.sleepers
        q.add("d")  # ready now: one worker takes it, the other seven stay parked
        await settle()
        after_add = clock.sleepers
        await clock.advance(2.0)
        for w in workers:
            w.cancel()
        return sleepers, after_add, taken

    sleepers, after_add, taken = asyncio.run(main())
    assert (sleepers, after_add) == (1, 1)
    assert taken == ["d", "a", "b", "c"]
