"""A real Kubernetes control plane on loopback, built from pinned Go modules, for tests, the demo
and benchmarks."""
