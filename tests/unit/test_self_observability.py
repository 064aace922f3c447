"""The service's own logs and metrics. Here, what needs no cluster; the scenarios against one:
tests/cluster/test_self_observability.py."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import pytest

from kubeindex.client.api import NO_ANSWER, Forbidden, RequestMetrics, path_fields
from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import LEASES, NODE_SUMMARIES, PODS, SECRETS, WORKLOAD_SUMMARIES
from kubeindex.runtime.logfields import FIELDS, fields, key_fields
from node_workload_summary.logs import TEXT, JsonFormatter


def _record(extra: Mapping[str, object] | None = None, exc: BaseException | None = None) -> logging.LogRecord:
    logger = logging.getLogger("kubeindex.watch.reflector")
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logger.makeRecord(logger.name, logging.WARNING, __file__, 1, "%s: LIST %s: %s", (
        "pods", PODS.path(), "403 Forbidden"), exc_info, extra=extra)


def test_json_lines_carry_the_fields_and_text_lines_stay_as_they_were() -> None:
    extra = fields("pods", error=Forbidden(403, "Forbidden", "pods is forbidden"))
    line = json.loads(JsonFormatter().format(_record(extra)))
    assert line.pop("ts").endswith("Z")
    assert line == {"level": "warn", "logger": "kubeindex.watch.reflector",
                    "msg": "pods: LIST /api/v1/pods: 403 Forbidden", "resource": "pods",
                    "error": "403 Forbidden: pods is forbidden"}
    text = logging.Formatter(TEXT).format(_record(extra))
    assert text.endswith(" WARNING kubeindex.watch.reflector: pods: LIST /api/v1/pods: 403 Forbidden")


def test_an_object_key_or_path_gives_namespace_and_name_and_a_traceback_stays_on_one_line() -> None:
    assert key_fields("pods", "team-a/web-1", KeyError("x")) == {FIELDS: {
        "resource": "pods", "namespace": "team-a", "name": "web-1", "error": "KeyError('x')"}}
    assert path_fields(NODE_SUMMARIES.path(name="pool-a", subresource="status")) == {FIELDS: {
        "resource": f"nodesummaries.{API_VERSION.split('/')[0]}", "name": "pool-a"}}
    try:
        raise RuntimeError("a bug")
    except RuntimeError as err:
        formatted = JsonFormatter().format(_record(key_fields("pods", "a/b"), err))
    assert "\n" not in formatted
    line = json.loads(formatted)
    assert line["error"] == "RuntimeError('a bug')" and line["stacktrace"].startswith("Traceback")
    assert (line["namespace"], line["name"]) == ("a", "b")


@pytest.mark.parametrize(("method", "path", "params", "verb", "resource"), [
    ("GET", PODS.path(), {"limit": "500"}, "LIST", "pods"),
    ("GET", PODS.path(), {"watch": "1"}, "WATCH", "pods"),
    ("GET", "/apis/apps/v1/replicasets", {"watch": "1", "sendInitialEvents": "true"}, "WATCH", "replicasets.apps"),
    ("GET", LEASES.path("ns", "l"), None, "GET", "leases.coordination.k8s.io"),
    ("PUT", LEASES.path("ns", "l"), None, "PUT", "leases.coordination.k8s.io"),
    ("PATCH", WORKLOAD_SUMMARIES.path("ns", "web", "status"), {}, "PATCH", WORKLOAD_SUMMARIES.name),
    ("GET", SECRETS.path("ns", "member"), None, "GET", "secrets"),
    ("GET", "/api/v1/namespaces/ns", None, "GET", "namespaces"),
    ("GET", "/apis/apps/v1", None, "GET", ""),  # discovery
    ("GET", "/version", None, "GET", ""),
])
def test_requests_are_labelled_by_verb_and_resource_never_by_name(
        method: str, path: str, params: dict[str, str] | None, verb: str, resource: str) -> None:
    metrics = RequestMetrics()
    metrics.observe(method, path, params, "200", 0.03)
    metrics.observe(method, path, params, NO_ANSWER, 120.0)
    [(key, histogram)] = metrics.durations.items()
    assert key == (verb, resource)
    assert histogram.count == 2 and histogram.cumulative()[3:4] == [("0.25", 1)] and histogram.counts[-1] == 1
    assert metrics.requests == {("200", method): 1, (NO_ANSWER, method): 1}
