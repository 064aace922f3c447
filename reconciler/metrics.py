"""The reconciler's own metrics: a prometheus_client collector, read at scrape time.

It reads only ``reconciler.stats.writes`` / ``.errors`` (dict[str, int]), ``reconciler.actual``
(plural -> the summary objects that exist), ``reconciler.queue`` (the write queue's own counts,
client-go's ``workqueue_*``) and ``elector.is_leader`` (no elector: always leader).
Bounds: one series per write verb, per HTTP status seen, per summary kind, and the leader gauge;
per ClusterQueue named by a claim, one per result (four at most); the queue's five families
without labels.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sized
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kubeindex.histogram import Histogram


# Read-only members (properties): the collector reads them, so a reconciler's own, more precise
# types (WriteStats, dict[str, dict[str, Summary]]) fit.
class _Stats(Protocol):
    @property
    def writes(self) -> Mapping[str, int]: ...
    @property
    def errors(self) -> Mapping[str, int]: ...


class _QuotaWrites(Protocol):
    @property
    def counts(self) -> Mapping[tuple[str, str], int]: ...  # (ClusterQueue, result) -> attempts


class _Claims(Protocol):
    @property
    def writes(self) -> _QuotaWrites: ...


class _Queue(Protocol):
    @property
    def depth(self) -> int: ...
    @property
    def adds(self) -> int: ...
    @property
    def retries(self) -> int: ...
    @property
    def queue_duration(self) -> Histogram: ...
    @property
    def work_duration(self) -> Histogram: ...


class _Reconciler(Protocol):
    @property
    def stats(self) -> _Stats: ...
    @property
    def queue(self) -> _Queue: ...
    @property
    def claims(self) -> _Claims: ...
    @property
    def actual(self) -> Mapping[str, Sized]: ...  # plural -> the objects


class _Elector(Protocol):
    @property
    def is_leader(self) -> bool: ...


class ReconcilerCollector(Collector):
    def __init__(self, reconciler: _Reconciler, elector: _Elector | None = None) -> None:
        self.reconciler = reconciler
        self.elector = elector

    def collect(self) -> Iterator[Metric]:
        stats = self.reconciler.stats
        writes = CounterMetricFamily("nws_reconciler_writes", "Successful API writes of the reconciler, by verb.",
                                     labels=["verb"])
        for verb, n in sorted(stats.writes.items()):
            writes.add_metric([verb], n)
        errors = CounterMetricFamily("nws_reconciler_write_errors",
                                     "Failed API writes of the reconciler, by HTTP status.", labels=["code"])
        for code, n in sorted(stats.errors.items()):
            errors.add_metric([code], n)
        leader = GaugeMetricFamily("nws_reconciler_leader", "1 while this replica holds the lease and writes.")
        leader.add_metric([], int(self.elector.is_leader if self.elector is not None else True))
        summaries = GaugeMetricFamily("nws_reconciler_summaries", "Summary objects that exist, by kind.",
                                      labels=["kind"])
        for kind, objects in sorted(self.reconciler.actual.items()):
            summaries.add_metric([kind], len(objects))
        quota = CounterMetricFamily("nws_quota_writes", "Writes of a ClusterQueue's nominalQuota for the "
                                    "ClusterResourceClaims, by result: applied, conflict (409: read again), error, "
                                    "throttled (--quota-max-writes-per-hour).", labels=["cluster_queue", "result"])
        for (queue, result), n in sorted(self.reconciler.claims.writes.counts.items()):
            quota.add_metric([queue, result], n)
        yield from (writes, errors, leader, summaries, quota)
        yield from _queue(self.reconciler.queue)


def _queue(queue: _Queue) -> Iterator[Metric]:
    """The write queue, in client-go's workqueue_* shape."""
    depth = GaugeMetricFamily("nws_workqueue_depth", "Keys of the write queue waiting to be taken by a worker.")
    depth.add_metric([], queue.depth)
    adds = CounterMetricFamily("nws_workqueue_adds", "Keys queued for a worker (each time one becomes due).")
    adds.add_metric([], queue.adds)
    retries = CounterMetricFamily("nws_workqueue_retries", "Keys queued again with backoff after a failed write.")
    retries.add_metric([], queue.retries)
    yield from (depth, adds, retries)
    for name, help_, histogram in (
            ("nws_workqueue_queue_duration_seconds", "Seconds a key waited in the queue before a worker took it.",
             queue.queue_duration),
            ("nws_workqueue_work_duration_seconds", "Seconds a worker took over a key: deciding and writing "
             "(the write rate limit's wait included).", queue.work_duration)):
        family = HistogramMetricFamily(name, help_)
        family.add_metric([], histogram.cumulative(), histogram.sum)
        yield family
