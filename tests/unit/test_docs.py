"""docs/ documents every metric family and every setting the code has."""

from __future__ import annotations

import re
from types import SimpleNamespace

import prometheus_client

from exporter.auth import AuthCollector, Authorizer
from exporter.metrics import Renderer
from kubeindex.client.api import RequestMetrics
from kubeindex.model.index import ClusterIndex
from kubeindex.model.resources import PODS
from kubeindex.watch.metrics import FleetCollector, RequestCollector, SourcesCollector
from kubeindex.watch.reflector import SourceStats
from node_workload_summary.settings import Settings
from reconciler.metrics import ReconcilerCollector
from reconciler.workqueue import WorkQueue
from tests.paths import ROOT

METRICS = (ROOT / "docs" / "metrics.md").read_text()
SETTINGS = (ROOT / "docs" / "settings.md").read_text()


def exposed_families() -> set[str]:
    """Every nws_ family a scrape shows: the renderer's tables and its own families, and the
    collectors main.py registers (sources, API requests, fleet, reconciler and its write queue,
    the /metrics authorizer), each fed enough to show everything."""
    registry = prometheus_client.CollectorRegistry()
    sources = SimpleNamespace(stats={"pods": SourceStats()}, sync_seconds=1.0, missing_kinds={("x.io", "X")},
                              forbidden_kinds={("y.io", "Y")}, unknown_versions={("z.io", "Z"): ("v9",)})
    reconciler = ReconcilerCollector(SimpleNamespace(writes={"apply": 1}, errors={"409": 1}), [WorkQueue[str]()],
                                     {"nodesummaries": {}}, SimpleNamespace(counts={("q", "applied"): 1}))
    requests = RequestMetrics()
    requests.observe("GET", PODS.path(), None, "200", 0.01)
    registry.register(SourcesCollector(sources))
    registry.register(RequestCollector(requests))
    registry.register(FleetCollector(SimpleNamespace(specs={"a": None}, problem=lambda name: None)))
    registry.register(reconciler)
    registry.register(AuthCollector(Authorizer(SimpleNamespace())))
    text = Renderer(ClusterIndex(), 10, registry=registry).render().decode()
    return set(re.findall(r"^# TYPE (nws_\w+) ", text, re.M))


def test_every_metric_family_is_documented() -> None:
    families = exposed_families()
    assert len(families) > 30
    for name in families:
        assert f"`{name}`" in METRICS, name


def test_every_documented_family_exists() -> None:
    documented = set(re.findall(r"^\| `(nws_\w+)` \|", METRICS, re.M))
    assert documented == exposed_families()


def test_every_setting_is_documented() -> None:
    for name in Settings.model_fields:
        assert f"`--{name.replace('_', '-')}`" in SETTINGS and f"`NWS_{name.upper()}`" in SETTINGS, name
