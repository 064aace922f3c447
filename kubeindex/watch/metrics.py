"""The watches' own metrics: a prometheus_client collector over Sources, read at scrape time;
the API requests' (``nws_rest_client_*``), and the fleet's.

Bounds: one series per watched resource (and event type or restart reason), one per configured
or referenced kind that is not served, not allowed, or served at no version known; a histogram
per (verb, resource) requested and a count per (code, HTTP method) answered.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Set
from typing import TYPE_CHECKING, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ..runtime.histogram import Histogram
    from .reflector import SourceStats


# What the collector reads of Sources, read-only (properties), so Sources' own types fit.
class _Sources(Protocol):
    @property
    def stats(self) -> Mapping[str, SourceStats]: ...
    @property
    def sync_seconds(self) -> float | None: ...
    @property
    def missing_kinds(self) -> Set[tuple[str, str]]: ...  # (group, kind)
    @property
    def forbidden_kinds(self) -> Set[tuple[str, str]]: ...
    @property
    def unknown_versions(self) -> Mapping[tuple[str, str], tuple[str, ...]]: ...  # (group, kind) -> served


class SourcesCollector(Collector):
    def __init__(self, sources: _Sources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        sources = self.sources
        stats = sources.stats
        events = CounterMetricFamily("nws_watch_events", "Watch events received, by resource and event type.",
                                     labels=["resource", "type"])
        relists = CounterMetricFamily("nws_watch_relists", "Full LISTs (initial, after 410 Gone), by resource.",
                                      labels=["resource"])
        restarts = CounterMetricFamily("nws_watch_restarts",
                                       "Watch restarts by resource and reason (gone, timeout, ...).",
                                       labels=["resource", "reason"])
        age = GaugeMetricFamily("nws_watch_last_event_age_seconds",
                                "Seconds since the last event or list page, by resource.", labels=["resource"])
        objects = GaugeMetricFamily("nws_watch_objects", "Objects currently known, by resource.", labels=["resource"])
        synced = GaugeMetricFamily("nws_watch_synced", "1 once the resource's initial LIST completed.",
                                   labels=["resource"])
        handler_errors = CounterMetricFamily("nws_watch_handler_errors",
                                             "Objects the index failed to take (retried by the next relist).",
                                             labels=["resource"])
        now = time.time()
        for resource, s in stats.items():
            for kind, n in sorted(s.events.items()):
                events.add_metric([resource, kind], n)
            relists.add_metric([resource], s.relists)
            for reason, n in sorted(s.restarts.items()):
                restarts.add_metric([resource, reason], n)
            if s.last_event:
                age.add_metric([resource], round(now - s.last_event, 3))
            objects.add_metric([resource], s.objects)
            synced.add_metric([resource], int(s.synced))
            handler_errors.add_metric([resource], s.handler_errors)
        yield from (events, relists, restarts, age, objects, synced, handler_errors)
        sync = GaugeMetricFamily("nws_initial_sync_duration_seconds",
                                 "Seconds from start until every watch had listed.")
        if sources.sync_seconds is not None:
            sync.add_metric([], round(sources.sync_seconds, 3))
        yield sync
        yield _kinds("nws_kind_not_served", "1 for each configured or referenced kind the API does not serve.",
                     sources.missing_kinds)
        yield _kinds("nws_kind_forbidden",
                     "1 for each configured or referenced kind this service may not list or watch.",
                     sources.forbidden_kinds)
        unknown = GaugeMetricFamily("nws_kind_version_unknown", "1 for each kind served only at versions this "
                                    "service does not read (served: those versions), e.g. a Kueue newer than it.",
                                    labels=["group", "kind", "served"])
        for (group, kind), versions in sorted(sources.unknown_versions.items()):
            unknown.add_metric([group, kind, ",".join(versions)], 1)
        yield unknown


def _kinds(name: str, help_: str, kinds: Iterable[tuple[str, str]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_, labels=["group", "kind"])
    for group, kind in sorted(kinds):
        family.add_metric([group, kind], 1)
    return family


class _Fleet(Protocol):
    @property
    def specs(self) -> Mapping[str, object]: ...
    def problem(self, name: str) -> object | None: ...


class FleetCollector(Collector):
    """A fleet hub's members (kubeindex/watch/fleet.py): one series per MultiKueueCluster."""

    def __init__(self, fleet: _Fleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("nws_fleet_member_up", "1 while the hub reads a member cluster's capacity from its "
                               "watches (in contact, or out of contact within --member-grace); 0 while connecting "
                               "or unreachable (see the claims' Ready condition).", labels=["member"])
        for name in sorted(self.fleet.specs):
            up.add_metric([name], int(self.fleet.problem(name) is None))
        yield up


class _Requests(Protocol):
    @property
    def durations(self) -> Mapping[tuple[str, str], Histogram]: ...  # (verb, resource)
    @property
    def requests(self) -> Mapping[tuple[str, str], int]: ...  # (code, method)


class RequestCollector(Collector):
    """The API requests (kubeindex/client/api.py's RequestMetrics), in client-go's rest_client_* shape."""

    def __init__(self, metrics: _Requests) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        durations = HistogramMetricFamily(
            "nws_rest_client_request_duration_seconds", "API request latency in seconds, by verb (the HTTP method, "
            "or LIST, WATCH: until the server answered) and resource.", labels=["verb", "resource"])
        for (verb, resource), histogram in sorted(self.metrics.durations.items()):
            durations.add_metric([verb, resource], histogram.cumulative(), histogram.sum)
        requests = CounterMetricFamily("nws_rest_client_requests", "API requests by status code (<error>: no "
                                       "answer) and HTTP method.", labels=["code", "method"])
        for (code, method), n in sorted(self.metrics.requests.items()):
            requests.add_metric([code, method], n)
        yield from (durations, requests)
