"""The node-workload-summary process: one set of watches feeding the exporter and the reconciler."""
