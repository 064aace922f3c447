"""Prometheus exporter: bounded-cardinality gauges per node group and per root workload."""
