"""The reconciler's leadership handling, without a cluster: nothing here reaches an API server."""

from __future__ import annotations

import asyncio
import time

import pytest
from kubernetes import client

from kubeindex.api import ApiClient, Connection
from kubeindex.index import ClusterIndex
from kubeindex.sources import Sources
from reconciler.controller import Reconciler, ReconcilerSettings
from reconciler.leader import LeaderElector, LeaseSettings


def _reconciler(relist_timeout: float) -> tuple[Reconciler, LeaderElector]:
    api = ApiClient(Connection("https://127.0.0.1:1", False, client.Configuration()))
    elector = LeaderElector(api, LeaseSettings("default", identity="me"))
    sources = Sources(api, ClusterIndex())
    settings = ReconcilerSettings(relist_timeout=relist_timeout)
    return Reconciler(api, sources.index, sources, elector, settings), elector


def _lead(elector: LeaderElector) -> None:
    elector._last_renew = time.monotonic()
    elector._set(True)


def test_a_stalled_relist_holds_a_new_leaders_writes_only_until_the_bound(caplog: pytest.LogCaptureFixture) -> None:
    """A relist that never completes (a WatchList whose initial-events-end bookmark does not come)
    delays the first write of a new leader by relist_timeout, not for ever; the log names it."""

    async def main() -> tuple[bool, float, bool]:
        reconciler, elector = _reconciler(relist_timeout=0.3)
        stalled = reconciler.reflectors[0]
        stalled.connected = True  # in contact, but its LIST never completes
        _lead(elector)
        started = time.monotonic()
        assert not reconciler.leading  # not before the relists (or the bound)
        while not reconciler.leading and time.monotonic() - started < 5:
            await asyncio.sleep(0.02)
        waited = time.monotonic() - started
        relist_still_pending = stalled._relist_requested.is_set()  # the relist itself goes on
        await reconciler.api.close()
        return reconciler.leading, waited, relist_still_pending

    leading, waited, pending = asyncio.run(main())
    assert leading
    assert 0.3 <= waited < 2
    assert pending
    assert "still relisting: own-nodesummaries" in caplog.text


def test_a_new_leader_writes_at_once_when_every_relist_is_done() -> None:
    """Watches out of contact have nothing fresher to give: their relists return at once."""

    async def main() -> float:
        reconciler, elector = _reconciler(relist_timeout=30)
        _lead(elector)
        started = time.monotonic()
        while not reconciler.leading and time.monotonic() - started < 5:
            await asyncio.sleep(0.01)
        await reconciler.api.close()
        return time.monotonic() - started

    assert asyncio.run(main()) < 1


def test_losing_the_lease_stops_the_writes_at_once() -> None:
    async def main() -> tuple[bool, bool]:
        reconciler, elector = _reconciler(relist_timeout=30)
        _lead(elector)
        while not reconciler.leading:
            await asyncio.sleep(0.01)
        before = reconciler.leading
        elector._set(False)
        await reconciler.api.close()
        return before, reconciler.leading

    assert asyncio.run(main()) == (True, False)


def test_the_reconcilers_watches_are_the_sources() -> None:
    """Run, stopped and relisted by the sources, and in their stats (the nws_watch_* metrics);
    not part of the index's readiness, but of the reconciler's."""

    async def main() -> None:
        reconciler, _ = _reconciler(relist_timeout=30)
        sources = reconciler.sources
        names = ["own-nodesummaries", "own-workloadsummaries"]
        assert [r.name for r in sources.watches()] == names and list(sources.stats) == names
        assert not [p for p in sources.sync_problems() if p.startswith("own-")]
        assert [p.split(":")[0] for p in reconciler.not_ready() if p.startswith("own-")] == names
        with pytest.raises(ValueError):
            sources.add_watch(reconciler.reflectors[0])
        await reconciler.api.close()

    asyncio.run(main())
