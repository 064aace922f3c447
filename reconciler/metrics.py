"""The reconciler's own metrics: a prometheus_client collector, read at scrape time.

It reads only the writer's ``stats.writes`` / ``.errors`` (dict[str, int]), the summaries that
exist (plural -> the objects), the quota writes' counts, each controller's queue (client-go's
``workqueue_*``, labelled by the queue's name) and ``elector.is_leader`` (no elector: always
leader). Bounds: one series per write verb, per HTTP status seen, per summary kind, and the leader
gauge; per ClusterQueue named by a claim, one per result (four at most); the queues' five
families, one series (a histogram's buckets) per controller.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kubeindex.runtime.histogram import Histogram


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


class _Queue(Protocol):
    @property
    def name(self) -> str: ...
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


class _Elector(Protocol):
    @property
    def is_leader(self) -> bool: ...


class ReconcilerCollector(Collector):
    def __init__(self, stats: _Stats, queues: Iterable[_Queue], summaries: Mapping[str, Sized],
                 quota: _QuotaWrites, elector: _Elector | None = None) -> None:
        self.stats = stats
        self.queues = list(queues)
        self.summaries = summaries  # plural -> the objects
        self.quota = quota
        self.elector = elector

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
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
        for kind, objects in sorted(self.summaries.items()):
            summaries.add_metric([kind], len(objects))
        quota = CounterMetricFamily("nws_quota_writes", "Writes of a ClusterQueue's nominalQuota for the "
                                    "ClusterResourceClaims, by result: applied, conflict (409: read again), error, "
                                    "throttled (--quota-max-writes-per-hour).", labels=["cluster_queue", "result"])
        for (queue, result), n in sorted(self.quota.counts.items()):
            quota.add_metric([queue, result], n)
        yield from (writes, errors, leader, summaries, quota)
        yield from _queues(self.queues)


def _queues(queues: list[_Queue]) -> Iterator[Metric]:
    """The controllers' work queues, in client-go's workqueue_* shape, by the queue's name."""
    depth = GaugeMetricFamily("nws_workqueue_depth", "Keys of a controller's work queue waiting to be taken by a "
                              "worker.", labels=["name"])
    adds = CounterMetricFamily("nws_workqueue_adds", "Keys queued for a worker (each time one becomes due).",
                               labels=["name"])
    retries = CounterMetricFamily("nws_workqueue_retries", "Keys queued again with backoff after a failed write.",
                                  labels=["name"])
    waits = HistogramMetricFamily("nws_workqueue_queue_duration_seconds",
                                  "Seconds a key waited in the queue before a worker took it.", labels=["name"])
    works = HistogramMetricFamily("nws_workqueue_work_duration_seconds", "Seconds a worker took over a key: deciding "
                                  "and writing (the write rate limit's wait included).", labels=["name"])
    for queue in queues:
        depth.add_metric([queue.name], queue.depth)
        adds.add_metric([queue.name], queue.adds)
        retries.add_metric([queue.name], queue.retries)
        waits.add_metric([queue.name], queue.queue_duration.cumulative(), queue.queue_duration.sum)
        works.add_metric([queue.name], queue.work_duration.cumulative(), queue.work_duration.sum)
    yield from (depth, adds, retries, waits, works)
