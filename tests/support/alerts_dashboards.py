"""What both halves of test_alerts_dashboards (tests/unit and tests/cluster) use."""

from __future__ import annotations

import json
import re

import dashboards.__main__ as dashboards_gen
from alerts.rules import alerts
from localkube.prometheus import Prometheus

# Series Prometheus makes itself, not the exporter.
PROMETHEUS_OWN = {"up", "scrape_duration_seconds"}


def dashboard_exprs() -> list[str]:
    exprs = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for text in dashboards_gen.render().values():
        walk(json.loads(text))
    return exprs


def all_exprs() -> list[str]:
    return [a.expr for a in alerts()] + dashboard_exprs()


def metric_names(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_strings)
    names = set(re.findall(r"\b([a-z_][a-z0-9_]*)\b(?=\s*(?:\{|\)|$|\s|>|<|/|\*|-|\+|offset))", without_ranges))
    return {n for n in names if n.startswith(("nws_", "process_")) or n in PROMETHEUS_OWN}


# $cluster: the value Grafana gives a variable whose query finds none (these series carry no cluster label).
VARIABLES = {"$__rate_interval": "1m", "$top": "10", "$summarizer": "pool", "$group": "a", "$namespace": ".*",
             "$resource": "cpu", "$kind": ".*", "$job": "node-workload-summary", "$cluster": ""}


def panels(dashboard: str) -> dict[str, list[str]]:
    """Panel title -> its queries, with the dashboard variables substituted."""
    def substitute(expr: str) -> str:
        for var, value in VARIABLES.items():
            expr = expr.replace(var, value)
        return expr

    data = json.loads(dashboards_gen.render()[dashboard])
    return {p["title"]: [substitute(t["expr"]) for t in p.get("targets", [])] for p in data["panels"]}


def result(prom: Prometheus, expr: str) -> dict[frozenset[tuple[str, str]], float]:
    return {frozenset(r["metric"].items()): float(r["value"][1]) for r in prom.query(expr)}
