"""Every setting, from environment variables (NWS_*) and command-line flags (--*)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    """node-workload-summary: node-group and root-workload summaries for large clusters.

    Watches Nodes, Pods, their owners and the NodeSummarizer / WorkloadSummarizer objects once,
    and serves Prometheus metrics per node group and per root workload on /metrics (plus /healthz
    and /readyz). Each setting is a flag (--name) and an environment variable (NWS_NAME).
    """

    model_config = SettingsConfigDict(
        env_prefix="NWS_",
        cli_prog_name="node-workload-summary",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_enforce_required=False,
        extra="ignore",
    )

    kubeconfig: str | None = Field(None, description="Path to a kubeconfig (default: $KUBECONFIG, "
                                   "~/.kube/config, or the in-cluster service account).")
    context: str | None = Field(None, description="kubeconfig context to use (default: the current one).")
    listen_address: str = Field("0.0.0.0", description="Address of the HTTP server (/metrics, /healthz, /readyz).")
    port: int = Field(8080, ge=0, le=65535, description="Port of the HTTP server (0: pick a free one).")
    max_workload_series: int = Field(
        5000, ge=0, description="Cap on workloads with series of their own; the rest are summed into "
        "workload=\"other\" and counted in nws_workload_series_dropped_total.")
    workload_pod_labels: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Pod labels that name a workload where no ownerReference leads to "
        "a configured kind (e.g. volcano.sh/job-name, pod-group.scheduling.kubenexus.io/name). "
        "Comma-separated in the environment variable.")
    max_owner_depth: int = Field(10, ge=1, le=50, description="ownerReference hops followed from a pod.")
    page_size: int = Field(500, ge=1, description="Objects per page of the initial and recovery LISTs.")
    watch_timeout_min: int = Field(300, ge=1, description="Lower bound of the randomized watch timeoutSeconds.")
    watch_timeout_max: int = Field(600, ge=1, description="Upper bound of the randomized watch timeoutSeconds.")
    read_timeout: float = Field(
        180.0, gt=0, description="Seconds without any byte on a watch before the connection is "
        "considered dead and replaced (an idle watch gets a bookmark at most about 2 minutes apart).")
    exporter: bool = Field(True, description="Serve the metrics on /metrics (--no-exporter: only /healthz, /readyz).")
    reconciler: bool = Field(True, description="Maintain NodeSummary and WorkloadSummary objects and the "
                             "summarizers' status (--no-reconciler: metrics only).")
    leader_election: bool = Field(True, description="Write only while holding the Lease (needed with more "
                                  "than one replica).")
    lease_namespace: str | None = Field(None, description="Namespace of the Lease (default: the pod's own "
                                        "namespace in a cluster, else default).")
    lease_name: str = Field("node-workload-summary", description="Name of the Lease.")
    lease_duration: float = Field(15.0, gt=0, description="Seconds a lease lasts without renewal before "
                                  "another replica may take it.")
    renew_deadline: float = Field(10.0, gt=0, description="Seconds the leader keeps writing without a "
                                  "successful renewal.")
    retry_period: float = Field(2.0, gt=0, description="Seconds between lease acquire/renew attempts.")
    identity: str | None = Field(None, description="This replica's name in the Lease (default: $POD_NAME or "
                                 "the host name).")
    write_debounce: float = Field(1.0, ge=0, description="Minimum seconds between two writes of one summary "
                                  "object (the first change is written at once).")
    writes_per_second: float = Field(50.0, gt=0, description="Global limit on API writes per second.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")

    @field_validator("workload_pod_labels", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list):
            return [v.strip() for item in value for v in str(item).split(",") if v.strip()]
        return value
