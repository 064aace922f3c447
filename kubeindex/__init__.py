"""The cluster index: list/watch sources, typed projections and incremental aggregates that the
exporter and the reconciler both read (sources -> projections -> index -> aggregates).

Four layers, each importing only those listed before it (tests/unit/test_architecture.py holds them):
``runtime`` (time, backoff, logs, tasks), ``model`` (the projections and the index: no I/O),
``client`` (HTTP/1.1, TLS, protobuf: the only code that talks to the API server) and ``watch``
(reflectors, sources, discovery: the client feeding the model)."""
