"""The service's own logs and metrics, from the real process on a real control plane: with
--log-format=json every line it writes is one JSON object (ts, level, logger, msg, and the
structured fields of the lines about a resource or an object), and a scrape shows the write
queue (nws_workqueue_*) and the API requests (nws_rest_client_*) under bounded labels."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from demo.workloads import deployment_chain, node_summarizer, workload_summarizer
from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import WORKLOAD_SUMMARIES
from localkube.cluster import LocalCluster
from localkube.service import Samples, Service, select, value, wait_for
from tests.kube import create_node, create_pod, get_object

FAST_LEASE = ("--lease-duration=4", "--renew-deadline=3", "--retry-period=1")


LEASE = "self-observability"


NS = "default"


KEYS = {"ts", "level", "logger", "msg", "resource", "namespace", "name", "error", "stacktrace", "kind", "group",
        "reason"}


LEVELS = {"debug", "info", "warn", "error"}


PLURAL = re.compile(r"^[a-z0-9]+(\.[a-z0-9.-]+)?$")  # a plural, with its group: never a path or a name


@pytest.fixture(scope="module")
def leader(cluster: LocalCluster) -> Iterator[Service]:
    """A replica that leads and writes: a NodeSummary for pool a, a WorkloadSummary for web."""
    node_summarizer(cluster, "pool", "pool")
    workload_summarizer(cluster, "apps", [("apps", "Deployment")])
    create_node(cluster, "obs-1", {"pool": "a"})
    _, rs = deployment_chain(cluster, NS, "web")
    create_pod(cluster, NS, "web-1", node="obs-1", owner=rs)
    svc = Service(cluster, ("--log-format=json", "--identity=obs", f"--lease-name={LEASE}", *FAST_LEASE)).start()
    wait_for(lambda: get_object(cluster, WORKLOAD_SUMMARIES.path(NS, "web")), timeout=30)
    yield svc
    svc.stop()


def lines(svc: Service) -> list[dict[str, object]]:
    """Every line the process wrote, each parsed as one JSON object and checked for its keys."""
    parsed = []
    for line in svc.log_text().splitlines():
        obj = json.loads(line)  # fails on any line that is not one JSON object
        assert isinstance(obj, dict), line
        assert {"ts", "level", "logger", "msg"} <= obj.keys() <= KEYS, line
        ts = datetime.fromisoformat(str(obj["ts"]))
        assert str(obj["ts"]).endswith("Z") and ts.utcoffset() == timedelta(0), line
        assert obj["level"] in LEVELS and all(isinstance(v, str) and v for v in obj.values()), line
        parsed.append(obj)
    return parsed


def test_every_line_is_one_json_object_with_the_fields_of_its_resource(cluster: LocalCluster,
                                                                       leader: Service) -> None:
    logged = lines(leader)
    [serving] = [o for o in logged if " serving on " in str(o["msg"])]
    assert serving["logger"] == "node-workload-summary" and serving["level"] == "info"
    [won] = [o for o in logged if "acquired leadership" in str(o["msg"])]
    assert (won["logger"], won["resource"], won["namespace"], won["name"]) == (
        "reconciler.leader", "leases.coordination.k8s.io", "default", LEASE)
    # The owner kinds the Deployment's pods lead to, each watch named as in nws_watch_*.
    watching = {o["resource"] for o in logged if str(o["msg"]).startswith("watching ")}
    assert {"replicasets.apps", "deployments.apps"} <= watching, watching
    # A replica that cannot write its Lease: the error, and the object it is about.
    lost = Service(cluster, ("--log-format=json", "--identity=lost", "--lease-namespace=nowhere",
                             f"--lease-name={LEASE}", "--no-exporter", *FAST_LEASE)).start()
    try:
        wait_for(lambda: any(o.get("namespace") == "nowhere" and "error" in o for o in lines(lost)), timeout=15)
    finally:
        lost.stop()
    logged = lines(lost)  # the shutdown's lines too
    [failed] = [o for o in logged if o.get("namespace") == "nowhere" and "error" in o]
    assert (failed["level"], failed["logger"], failed["resource"], failed["name"]) == (
        "warn", "reconciler.leader", "leases.coordination.k8s.io", LEASE)
    assert 'namespaces "nowhere" not found' in str(failed["error"]) and str(failed["error"]) in str(failed["msg"])
    assert any(o["msg"] == "shutting down" for o in logged)


def _count(samples: Samples, family: str, **labels: str) -> float:
    return sum(select(samples, family, **labels).values())


def test_a_scrape_shows_the_write_queue_and_the_api_requests(cluster: LocalCluster, leader: Service) -> None:
    samples = leader.scrape()
    # Each controller's queue, by name: the summaries and the summarizers' status were queued,
    # taken and written.
    names = ("summaries", "summarizers", "clusterresourceclaims", "clusterqueues")
    assert {dict(k)["name"] for k in select(samples, "nws_workqueue_depth")} == set(names)
    assert {dict(k)["name"] for k in select(samples, "nws_workqueue_retries_total")} == set(names)
    adds = {name: value(samples, "nws_workqueue_adds_total", name=name) or 0 for name in names}
    assert adds["summaries"] >= 2 and adds["summarizers"] >= 2, adds  # NodeSummary, WorkloadSummary; each summarizer
    for family in ("nws_workqueue_queue_duration_seconds", "nws_workqueue_work_duration_seconds"):
        for name in names:
            count = value(samples, f"{family}_count", name=name) or 0
            assert 0 < count <= adds[name] or count == adds[name] == 0, (family, name)
            assert value(samples, f"{family}_bucket", le="+Inf", name=name) == count, (family, name)
    # The API requests: the watches' LIST or WATCH, the summaries' apply (PATCH), the Lease.
    durations = "nws_rest_client_request_duration_seconds"
    pairs = {(dict(k)["verb"], dict(k)["resource"]) for k in select(samples, f"{durations}_count")}
    assert {("WATCH", "pods"), ("WATCH", "nodes"), ("PATCH", f"nodesummaries.{API_VERSION.split('/')[0]}"),
            ("PATCH", f"workloadsummaries.{API_VERSION.split('/')[0]}")} <= pairs, pairs
    assert {verb for verb, resource in pairs if resource == "leases.coordination.k8s.io"} >= {"GET", "POST"}, pairs
    resources = {resource for _, resource in pairs}
    assert all(PLURAL.match(r) for r in resources - {""}), resources  # plurals: no object's name, no path
    assert not resources & {"obs-1", "web", "web-1", "pool-a", LEASE}, resources
    assert _count(samples, f"{durations}_bucket", verb="PATCH", le="+Inf") == _count(
        samples, f"{durations}_count", verb="PATCH")
    requests = "nws_rest_client_requests_total"
    codes = {(dict(k)["code"], dict(k)["method"]) for k in select(samples, requests)}
    assert {("200", "GET"), ("200", "PATCH")} <= codes, codes  # applies answer 200 (201 when created)
    assert _count(samples, requests) == _count(samples, f"{durations}_count") > 0  # each request in both
