"""The garbage collection policy: the index's objects frozen once synced, Python's own full
collections followed by a freeze, a full collection over everything now and then; and the
premise: the index's objects form no reference cycles."""

from __future__ import annotations

import argparse
import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from bench.index_events import build
from node_workload_summary.gcfreeze import Freezer


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()  # the rest of the test session collects as usual


def test_the_index_makes_no_reference_cycles() -> None:
    """What freezing relies on: objects of the index dropped after a freeze are freed by their
    reference counts (a cycle among them would wait for the hourly full collection)."""
    index, pods, lines = build(argparse.Namespace(pods=3000, nodes=100, workloads=60, events=12000))
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        for line in lines:
            pods._handle(line)
        for key in list(index.pods)[:1000]:
            index.delete_pod(key)
        for w in range(30):
            index.delete_owner(("apps", "ReplicaSet"), f"bench/app-{w}-abc123")
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()


def test_frozen_once_synced_then_after_each_full_collection() -> None:
    async def scenario() -> None:
        ready = asyncio.Event()
        freezer = Freezer(full_every=3600, check_every=0.01)
        task = asyncio.create_task(freezer.run(ready))
        await asyncio.sleep(0.05)
        assert gc.get_freeze_count() == 0  # nothing before the initial sync
        ready.set()
        await asyncio.sleep(0.05)
        frozen = gc.get_freeze_count()
        assert frozen > 1000 and freezer.last_full_seconds > 0
        kept = [[i] for i in range(5000)]  # new long-lived objects
        gc.collect()  # as Python's own full collection would
        await asyncio.sleep(0.05)
        assert freezer.refreezes == 1 and gc.get_freeze_count() >= frozen + len(kept)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert freezer._on_gc not in gc.callbacks

    asyncio.run(scenario())


def test_full_collection_reaches_frozen_garbage() -> None:
    """A cycle frozen while alive and dropped later is freed by the periodic full collection."""
    class Node:
        other: Node

    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    gc.freeze()
    del a, b
    gc.collect()
    assert alive() is not None  # frozen: no collection sees it
    Freezer().full()
    assert alive() is None
