"""The domain model: typed projections of the API objects, quantities, the owner graph, the
index and its incremental aggregates. Pure data and arithmetic: no I/O, no client."""
