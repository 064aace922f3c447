"""Reconciler: NodeSummary and WorkloadSummary objects from the cluster index's aggregates."""
