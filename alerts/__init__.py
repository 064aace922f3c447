"""Prometheus alert rules generated from one source (plain rules file and PrometheusRule)."""
