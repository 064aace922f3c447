"""Every setting, from environment variables (NWS_*) and command-line flags (--*).

Settings that cannot work are refused here, before anything starts, one line per problem."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Literal, TypeAlias

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError
from typing_extensions import TypeAliasType

from exporter.auth import CACHE_SIZE, CACHE_TTL, DENIED_TTL, REVIEW_BURST, REVIEWS_PER_SECOND
from exporter.metrics import MAX_NODEGROUP_SERIES, MAX_WORKLOAD_SERIES
from kubeindex.model.gangs import GANG_GRACE, TOPOLOGY_LABEL
from kubeindex.model.index import ACCELERATOR_RESOURCES, DISRUPTION_TAINTS, MAX_OWNER_DEPTH, PROBLEM_CONDITIONS
from kubeindex.model.karpenter import EXPIRY_HORIZON
from kubeindex.watch.fleet import MEMBER_GRACE
from kubeindex.watch.reflector import Encoding, InitialList, WatchSettings
from kubeindex.watch.sources import SYNC_GRACE
from reconciler.claims import ClaimSettings
from reconciler.leader import LeaseSettings
from reconciler.manager import ReconcilerSettings

from .logs import LogFormat

ENV_PREFIX = "NWS_"
# The defaults live in the settings objects the flags feed; the flags read them from there.
WATCH, LEASE, WRITES, QUOTA = WatchSettings(), LeaseSettings(namespace=""), ReconcilerSettings(), ClaimSettings()
MIN_SECONDS = 1.0
JITTER_FACTOR = 1.2  # client-go's leader election refuses renewDeadline <= 1.2 x retryPeriod
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

# Named types: --help shows these names instead of Python's (`SECONDS`, not `float`). mypy takes a
# TypeAliasType only under its own variable's name (two of these share one), so it reads the plain
# types of the first branch; pydantic, at run time, the named ones.
if TYPE_CHECKING:
    FilePath: TypeAlias = str
    Name: TypeAlias = str
    Address: TypeAlias = str
    Port: TypeAlias = int
    Count: TypeAlias = int
    Seconds: TypeAlias = float
    WholeSeconds: TypeAlias = int
    Rate: TypeAlias = float
    Labels: TypeAlias = list[str]
    Taints: TypeAlias = list[str]
    Conditions: TypeAlias = list[str]
    ResourceNames: TypeAlias = list[str]
    LabelKey: TypeAlias = str
else:
    FilePath = TypeAliasType("PATH", str)
    Name = TypeAliasType("NAME", str)
    Address = TypeAliasType("ADDRESS", str)
    Port = TypeAliasType("PORT", int)
    Count = TypeAliasType("N", int)
    Seconds = TypeAliasType("SECONDS", float)
    WholeSeconds = TypeAliasType("SECONDS", int)
    Rate = TypeAliasType("PER_SECOND", float)
    Labels = TypeAliasType("LABELS", list[str])
    Taints = TypeAliasType("TAINTS", list[str])
    Conditions = TypeAliasType("CONDITIONS", list[str])
    ResourceNames = TypeAliasType("RESOURCES", list[str])
    LabelKey = TypeAliasType("LABEL", str)


_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


class Settings(BaseSettings):
    """node-workload-summary: node-group and root-workload summaries for large clusters.

    Watches Nodes, Pods, their owners and the NodeSummarizer / WorkloadSummarizer objects once,
    and serves Prometheus metrics per node group and per root workload on /metrics (plus /healthz
    and /readyz). Each setting is a flag (--name) and an environment variable (NWS_NAME).
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        cli_prog_name="node-workload-summary",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_enforce_required=False,
        cli_hide_none_type=True,
        cli_show_env_vars=True,
        cli_exit_on_error=False,  # a command line it cannot parse: load() says so in one line, not the usage
        extra="ignore",
    )

    kubeconfig: FilePath | None = Field(None, description="Path to a kubeconfig. Unset: $KUBECONFIG, then the "
                                        "in-cluster service account, then ~/.kube/config.")
    context: Name | None = Field(None, description="kubeconfig context to use. Unset: the current one.")
    listen_address: Address = Field("0.0.0.0", description="Address of the HTTP servers (/metrics, /healthz, /readyz).")
    port: Port = Field(8080, ge=0, le=65535, description="Port of the HTTP server (0: pick a free one): /metrics, "
                       "and /healthz and /readyz unless --probe-port is set.")
    probe_port: Port | None = Field(None, ge=0, le=65535, description="Serve /healthz and /readyz on this port "
                                    "instead, plain HTTP without authentication (needed with --metrics-secure). "
                                    "Unset: on --port.")
    max_workload_series: Count = Field(
        MAX_WORKLOAD_SERIES, ge=0, description="Cap on workloads with series of their own; the rest are summed into "
        "workload=\"other\" and counted in nws_workload_series_dropped_total.")
    max_nodegroup_series: Count = Field(
        MAX_NODEGROUP_SERIES, ge=0, description="Cap on node groups with series of their own, per "
        "NodeSummarizer; the rest are summed into group=\"other\" and counted in "
        "nws_nodegroup_series_dropped_total.")
    workload_pod_labels: Annotated[Labels, NoDecode] = Field(
        [], description="Deprecated: list the keys in a WorkloadSummarizer's spec.podLabelWorkloads instead. "
        "Pod labels that name a workload where no ownerReference leads to a configured kind "
        "(e.g. volcano.sh/job-name), in the metrics only (no WorkloadSummary): a JSON list or a comma list; "
        "the flag may also be repeated.")
    disruption_taints: Annotated[Taints, NoDecode] = Field(
        list(DISRUPTION_TAINTS), description="Node taints that make a node Disrupting (unless NotReady or Unknown): "
        "a key (any effect) or key:Effect; a JSON list or a comma list.")
    problem_conditions: Annotated[Conditions, NoDecode] = Field(
        list(PROBLEM_CONDITIONS), description="Node condition types (node-problem-detector's by default) that make "
        "a Ready node Degraded while True: a JSON list or a comma list.")
    accelerator_resources: Annotated[ResourceNames, NoDecode] = Field(
        list(ACCELERATOR_RESOURCES), description="Accelerator resources, names or prefixes ending in *: a Ready node "
        "with allocatable below capacity for one of them is Degraded, the difference counted in "
        "nws_nodegroup_accelerators_unhealthy; a JSON list or a comma list.")
    nodeclaim_expiry_horizon: Seconds = Field(
        EXPIRY_HORIZON, ge=0, description="Seconds before a Karpenter NodeClaim expires (creationTimestamp + "
        "spec.expireAfter) from which its node counts as a disruption candidate (Expiring): its pods are at risk.")
    gang_grace: Seconds = Field(
        GANG_GRACE, ge=0, description="Seconds a gang short of ready members, with members lost (on a node "
        "not Ready, or Running but not Ready), stays Pending before it is Broken (a member's restart within it is no "
        "break): docs/gangs.md.")
    gang_topology_label: LabelKey = Field(
        TOPOLOGY_LABEL, description="Node label whose value names where a broken gang's "
        "members were lost, besides its node groups (a rack or block label, say): docs/gangs.md.")
    max_owner_depth: Count = Field(MAX_OWNER_DEPTH, ge=1, le=50, description="ownerReference hops followed from a pod.")
    page_size: Count = Field(WATCH.page_size, ge=0, description=(
        "Objects per page of the initial and recovery LISTs; 0: 20000 from a server that serves every page from "
        "its watch cache (Kubernetes 1.34+, which walks its cache from each page's start: few large pages cost "
        "it least, and pods and nodes are read as the page comes, never held whole), 500 from an older one "
        "(whose pages after the first come from etcd)."))
    initial_list: InitialList = Field(
        WATCH.initial_list, description="How the initial state (and every relist after 410 Gone) is read: watchlist (a "
        "streaming WatchList, consistent), list (paged LISTs, consistent), cache (resourceVersion=0: any age, "
        "unpaginated; for comparison only), auto (list from Kubernetes 1.34+, which serves every page from its "
        "watch cache; else watchlist, or list with a server that refuses it).")
    encoding: Encoding = Field(
        WATCH.encoding, description="How pods and nodes are read: protobuf (under a third of the API server's CPU "
        "for JSON, and fewer bytes) or json. Other kinds are always JSON.")
    watch_timeout_min: WholeSeconds = Field(WATCH.timeout_min, ge=1, description="Lower bound of the randomized watch "
                                            "timeoutSeconds.")
    watch_timeout_max: WholeSeconds = Field(WATCH.timeout_max, ge=1, description="Upper bound of the randomized watch "
                                            "timeoutSeconds (at least --watch-timeout-min).")
    read_timeout: Seconds = Field(
        WATCH.read_timeout, gt=0, description="Seconds without any byte on a watch before the connection is "
        "considered dead and replaced (an idle watch gets a bookmark at most about 2 minutes apart).")
    watch_gather: Seconds = Field(
        WATCH.gather, ge=0, le=1, description="Seconds a watch leaves its connection unread after reading events, "
        "so that under churn one wake-up reads every event of that time in one pass. What the service shows "
        "lags by at most this much. An event after a quiet spell is read at once, and every node event. 0: each "
        "event as it comes.")
    sync_loss_grace: Seconds = Field(
        SYNC_GRACE, gt=0, description="Seconds a watch may stay unable to reach the API server before /readyz "
        "fails and the replica gives up the Lease.")
    exporter: bool = Field(True, description="Serve the metrics on /metrics (--no-exporter: only /healthz, /readyz).")
    reconciler: bool = Field(True, description="Maintain NodeSummary and WorkloadSummary objects and the "
                             "summarizers' status (--no-reconciler: metrics only).")
    leader_election: bool = Field(True, description="Write only while holding the Lease (needed with more "
                                  "than one replica).")
    lease_namespace: Name | None = Field(None, description="Namespace of the Lease. Unset: the pod's own "
                                         "namespace in a cluster, else default.")
    lease_name: Name = Field(LEASE.name, description="Name of the Lease.")
    lease_duration: WholeSeconds = Field(
        int(LEASE.lease_duration), description="Whole seconds (at least 1) a lease lasts without renewal before "
        "another replica may take it.")
    renew_deadline: Seconds = Field(
        LEASE.renew_deadline, description="Seconds (at least 1, less than --lease-duration) the leader keeps "
        "writing without a successful renewal.")
    retry_period: Seconds = Field(
        LEASE.retry_period, description="Seconds (at least 1, less than --renew-deadline / 1.2) between lease "
        "acquire/renew attempts.")
    identity: Name | None = Field(None, description="This replica's name in the Lease. Unset: $POD_NAME or "
                                  "the host name.")
    write_debounce: Seconds = Field(
        WRITES.debounce, ge=0, description="Minimum seconds between two writes of one summary object. A "
        "NodeSummary's first change is written at once; a WorkloadSummary's waits this long too, so a burst of pod "
        "changes is one write. Writes for pod changes alone fall on whole multiples of it, many in one burst.")
    pod_write_debounce: Seconds = Field(
        WRITES.pod_debounce, ge=0, description="Minimum seconds between two writes of a summary whose pods alone "
        "changed (a NodeSummary's pod counts and requests, a WorkloadSummary's pod counts: under churn they change "
        "all the time); never less than --write-debounce. A node's change (a WorkloadSummary's: a node of its pods "
        "changing state) waits --write-debounce only.")
    writes_per_second: Rate = Field(WRITES.writes_per_second, gt=0,
                                    description="Global limit on API writes per second.")
    quota_settle: Seconds = Field(
        QUOTA.settle, ge=0, description="Seconds a change of a flavor's capacity must last before the "
        "ClusterResourceClaims on it follow it (both directions).")
    quota_actuation: Literal["on", "off"] = Field(
        "on" if QUOTA.actuation else "off", description="on: write the ClusterQueues' nominalQuota that the "
        "ClusterResourceClaims assign (the RBAC must grant patch on clusterqueues); off: a dry run, the claims' "
        "status and the metrics show what each queue would get. Off by default: quota changes admission "
        "cluster-wide, so an administrator opts in.")
    quota_max_writes_per_hour: Count = Field(
        QUOTA.max_writes_per_hour, ge=1, description="Writes of one ClusterQueue's quota allowed per hour; "
        "more wait, counted in nws_quota_writes_total{result=\"throttled\"}.")
    karpenter_events: Literal["on", "off"] = Field(
        "off", description="on: read Karpenter's DisruptionBlocked Events on Nodes (list and watch Events in "
        "namespace default) for the nodes it may not disrupt and why (NodeSummary blockedNodeCount and blockers), "
        "and record an Event on a WorkloadSummary, in its namespace, when Karpenter disrupts its nodes or the "
        "workload blocks a disruption (create and patch Events in every namespace: deploy/with-karpenter-events/).")
    fleet: bool = Field(False, description="A fleet hub: read the capacity of MultiKueue's member clusters "
                        "(each MultiKueueCluster's kubeconfig Secret in --fleet-namespace) for the "
                        "ClusterResourceClaims that name them, and create a claim for each member flavor. The "
                        "RBAC must grant get on those Secrets (the chart's fleet.hub).")
    fleet_namespace: Name = Field("kueue-system", min_length=1, description="Where the MultiKueueClusters' "
                                 "kubeconfig Secrets are: Kueue's own namespace.")
    member_grace: Seconds = Field(MEMBER_GRACE, ge=0, description="Seconds a member cluster may be out of contact "
                                  "before its capacity counts as gone (then --quota-settle and each claim's "
                                  "overAllocation policy apply): a shorter outage changes no quota.")
    metrics_secure: bool = Field(False, description="Serve /metrics over HTTPS to callers whose bearer token "
                                 "passes a TokenReview and a SubjectAccessReview for get on /metrics (needs "
                                 "--probe-port).")
    metrics_cert_file: FilePath | None = Field(None, description="PEM certificate (chain) for --metrics-secure, "
                                               "reloaded when it changes. Unset: a self-signed certificate "
                                               "made at start (needs the openssl command).")
    metrics_key_file: FilePath | None = Field(None, description="PEM private key of --metrics-cert-file.")
    metrics_auth_cache_ttl: Seconds = Field(CACHE_TTL, ge=0, description="Seconds an authentication and "
                                            "authorization decision for a token is reused, a denial at most "
                                            f"{DENIED_TTL:g} s (0: not cached; concurrent requests with one token "
                                            "still share one review).")
    metrics_auth_cache_size: Count = Field(CACHE_SIZE, ge=1, description="Tokens whose decision is cached, allowed "
                                           "and denied ones apart (up to this many each, so denials never push a "
                                           "reader out); the least recently used is dropped beyond this.")
    metrics_auth_reviews_per_second: Rate = Field(
        REVIEWS_PER_SECOND, gt=0, description="Token reviews (a TokenReview, then a SubjectAccessReview) a second "
        "for tokens /metrics has no decision for; beyond it and its burst a request is answered 429 with "
        "Retry-After and no review is sent. A cached decision is never limited, nor a token allowed before "
        "whose decision expired, so a flood of made-up tokens refuses no known reader; one source address may "
        "spend a quarter of it.")
    metrics_auth_review_burst: Count = Field(REVIEW_BURST, ge=1, description="Token reviews that may be sent at "
                                             "once after a quiet spell (the burst of "
                                             "--metrics-auth-reviews-per-second).")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level (any case).")
    log_format: LogFormat = Field("text", description="text: a line a person reads; json: one JSON object per "
                                  "line (ts, level, logger, msg and the line's fields: resource, namespace, "
                                  "name, error), as controller-runtime writes them.")
    version: bool = Field(False, description="Print the version, the source revision and Python's version, "
                          "then exit.")

    @field_validator("gang_topology_label")
    @classmethod
    def _label_key(cls, value: str) -> str:
        """apimachinery's qualified name: an optional DNS subdomain prefix (at most 253) and '/', then
        a name of at most 63 letters, digits, '-', '_' and '.', beginning and ending alphanumeric."""
        prefix, _, name = value.rpartition("/")
        if not (_QUALIFIED_NAME.fullmatch(name) and len(name) <= 63
                and (not _ or (_DNS_SUBDOMAIN.fullmatch(prefix) and len(prefix) <= 253))):
            raise ValueError(f"not a label key (e.g. topology.kubernetes.io/zone): {value!r}")
        return value

    @field_validator("workload_pod_labels", "disruption_taints", "problem_conditions", "accelerator_resources",
                     mode="before")
    @classmethod
    def _label_list(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if not text.startswith("["):
            return [label.strip() for label in text.split(",") if label.strip()]
        try:
            labels = json.loads(text)
        except ValueError:
            labels = None
        if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
            raise ValueError(f"not a JSON list of strings (got {value!r}); write [\"a\",\"b\"] or a,b")
        return [label.strip() for label in labels if label.strip()]

    @field_validator("disruption_taints")
    @classmethod
    def _taint_effects(cls, taints: list[str]) -> list[str]:
        for taint in taints:
            key, colon, effect = taint.partition(":")
            if not key or (colon and effect not in TAINT_EFFECTS):
                raise ValueError(f"{taint!r} is not a taint key or key:Effect (an effect is one of "
                                 f"{', '.join(TAINT_EFFECTS)})")
        return taints

    @field_validator("accelerator_resources")
    @classmethod
    def _prefix_patterns(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if "*" in pattern[:-1] or pattern == "*":
                raise ValueError(f"{pattern!r}: a resource name, or a prefix followed by one * at the end")
        return patterns

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("lease_duration", mode="before")
    @classmethod
    def _whole_seconds(cls, value: object) -> object:
        # Lease.spec.leaseDurationSeconds is an integer: 0.5 would become 0, which the API server refuses.
        try:
            seconds = float(value)  # type: ignore[arg-type]  # whatever came: float() says if it is a number
        except (TypeError, ValueError):
            return value  # not a number: the type check says so
        _at_least_a_second(seconds)
        if not seconds.is_integer():
            raise ValueError(f"must be a whole number of seconds, as the Lease stores it (got {seconds:g})")
        return int(seconds)

    @field_validator("renew_deadline")
    @classmethod
    def _renew_within_lease(cls, value: float, info: ValidationInfo) -> float:
        _at_least_a_second(value)
        lease = info.data.get("lease_duration")
        if lease is not None and value >= lease:
            raise ValueError(f"must be shorter than --lease-duration (got {value:g} s, lease {lease} s)")
        return value

    @field_validator("retry_period")
    @classmethod
    def _retry_within_renew(cls, value: float, info: ValidationInfo) -> float:
        _at_least_a_second(value)
        renew = info.data.get("renew_deadline")
        if renew is not None and value * JITTER_FACTOR >= renew:
            raise ValueError(f"must be below --renew-deadline / {JITTER_FACTOR} so a renewal can be retried in "
                             f"time (got {value:g} s, renew deadline {renew:g} s)")
        return value

    @field_validator("probe_port")
    @classmethod
    def _probe_port_apart(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and value == info.data.get("port"):
            raise ValueError(f"must differ from --port (got {value})")
        return value

    @field_validator("metrics_secure")
    @classmethod
    def _probes_without_token(cls, value: bool, info: ValidationInfo) -> bool:
        # The kubelet's probes carry no token: they need a plain port of their own.
        if value and info.data.get("probe_port") is None and "probe_port" not in _failed(info):
            raise ValueError("needs --probe-port, so that /healthz and /readyz answer without a token")
        return value

    @field_validator("metrics_key_file")
    @classmethod
    def _cert_and_key(cls, value: str | None, info: ValidationInfo) -> str | None:
        cert = info.data.get("metrics_cert_file")
        if (cert is None) != (value is None):
            raise ValueError("--metrics-cert-file and --metrics-key-file go together (got only "
                             f"{'--metrics-cert-file' if value is None else '--metrics-key-file'})")
        if value is not None and info.data.get("metrics_secure") is False:
            raise ValueError("a certificate is only used with --metrics-secure")
        return value

    @field_validator("watch_timeout_max")
    @classmethod
    def _max_not_below_min(cls, value: int, info: ValidationInfo) -> int:
        low = info.data.get("watch_timeout_min")
        if low is not None and value < low:
            raise ValueError(f"must not be below --watch-timeout-min (got {value}, min {low})")
        return value


def _failed(info: ValidationInfo) -> set[str]:
    """Fields declared before this one that did not validate (absent from ``info.data``)."""
    return set(Settings.model_fields).difference(info.data) - {info.field_name or ""}


def _at_least_a_second(seconds: float) -> None:
    if not seconds >= MIN_SECONDS:  # also refuses NaN
        raise ValueError(f"must be at least {MIN_SECONDS:g} s (got {seconds:g})")


class InvalidSettings(Exception):
    """Settings that cannot work; ``problems`` has one line each, naming the flag."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class UsageError(InvalidSettings):
    """A command line that does not parse: an unknown flag, a flag without its value, an argument
    that is no flag. One problem, said as kubectl says it (``unknown flag: --foo``)."""


def load(argv: Sequence[str]) -> Settings:
    """Settings from these arguments and the environment, or InvalidSettings (UsageError: the
    command line itself does not parse)."""
    try:
        # A BaseSettings argument, not a field: mypy's view of a model's __init__ has the fields only.
        return Settings(_cli_parse_args=list(argv))  # type: ignore[call-arg]
    except ValidationError as err:
        raise InvalidSettings([_problem(error, argv) for error in err.errors()]) from None
    except SettingsError as err:
        raise UsageError([_usage_problem(str(err))]) from None


def _usage_problem(message: str) -> str:
    """argparse's complaint (through pydantic-settings), in kubectl's words."""
    message = message.removeprefix("error parsing CLI: ")
    if message.startswith("unrecognized arguments: "):
        words = message.removeprefix("unrecognized arguments: ").split()
        flags = [word.split("=", 1)[0] for word in words if word.startswith("-")]
        if not flags:
            return f"unexpected argument {words[0]!r}: every setting is a flag (--name=value)"
        return f"unknown flag{'s' if len(flags) > 1 else ''}: {', '.join(flags)}"
    return message.removeprefix("argument ")


def _problem(error: ErrorDetails, argv: Sequence[str]) -> str:
    """One line for one error, naming the flag (and the variable, when the value came from there)."""
    name = str(error["loc"][0]) if error["loc"] else ""
    flag = "--" + name.replace("_", "-")
    env = ENV_PREFIX + name.upper()
    from_env = env in os.environ and not any(arg == flag or arg.startswith(flag + "=") for arg in argv)
    if error["type"] == "value_error":  # ours: the message already shows what it got
        return f"{flag}: {error['ctx']['error']}" + (f" (from {env})" if from_env else "")
    return f"{flag}: {error['msg']} (got {error['input']!r}" + (f" from {env})" if from_env else ")")
