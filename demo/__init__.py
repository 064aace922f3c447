"""The local demo: a control plane with node pools and workloads, the service and Prometheus."""
