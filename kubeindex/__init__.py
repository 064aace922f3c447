"""The cluster index: list/watch sources, typed projections and incremental aggregates that the
exporter and the reconciler both read (sources -> projections -> index -> aggregates)."""
