"""Grafana dashboards generated with grafanalib from the exporter's metrics."""
