"""The alert rules, in one place: a plain Prometheus rules file and a PrometheusRule object are
both generated from ALERTS below (``python -m alerts``), and so is the chart's copy
(``chart_rules``). Thresholds and durations are parameters, so tests and the demo can render the
same rules with short durations, and the chart's values can tune them without a fork.

Every aggregation keeps the cluster label (``Thresholds.cluster``): rules evaluated over many
clusters at once (Thanos Ruler, Mimir, a federating Prometheus) fire per cluster."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from .replicas import CLUSTER, by, one

# Every rule names its runbook in an annotation a person reads, ``runbook``: docs/runbooks.md and the
# anchor of its section. A runbook_url, a link, only where docs/runbooks.md is served: this base,
# then ``#`` and the anchor. None by default: no repository address exists yet, and a placeholder
# link is worse than none. Set it (``python -m alerts --runbook-base-url``, the chart's
# ``prometheusRule.runbookBaseUrl``, which a release sets to its tag's), e.g. to a fork's
# docs/runbooks.md as its host renders it.
RUNBOOK_BASE_URL: str | None = None
RUNBOOKS = "docs/runbooks.md"

T = TypeVar("T")


def tunable(default: T, alert: str, key: str) -> T:
    """A setting of one alert, named ``key`` under that alert in the chart's
    ``prometheusRule.overrides`` (``for`` for its duration)."""
    return field(default=default, metadata={"alert": alert, "key": key})


@dataclass(frozen=True)
class Thresholds:
    not_ready_fraction: float = tunable(0.2, "NodeGroupNotReady", "fraction")  # of NotReady/Unknown nodes
    not_ready_for: str = tunable("10m", "NodeGroupNotReady", "for")
    down_for: str = tunable("3m", "NodeGroupDown", "for")
    # NodeGroupShrunk: lost more than this fraction against an hour ago
    shrink_fraction: float = tunable(0.3, "NodeGroupShrunk", "fraction")
    shrink_for: str = tunable("5m", "NodeGroupShrunk", "for")
    pending_for: str = tunable("15m", "WorkloadPodsPending", "for")
    failed_for: str = tunable("5m", "WorkloadPodsFailed", "for")
    # WorkloadOnUnhealthyNodes: pods on NotReady/Unknown/Disrupting nodes; critical from this fraction of its pods
    unhealthy_for: str = tunable("5m", "WorkloadOnUnhealthyNodes", "for")
    unhealthy_critical_fraction: float = tunable(0.5, "WorkloadOnUnhealthyNodes", "criticalFraction")
    # WorkloadGangBroken: the service already waited --gang-grace before calling a gang Broken
    gang_broken_for: str = tunable("1m", "WorkloadGangBroken", "for")
    accelerators_unhealthy_for: str = tunable("10m", "NodeGroupAcceleratorsUnhealthy", "for")
    disrupting_for: str = tunable("5m", "NodeGroupDisrupting", "for")
    # NodeGroupRolloutStuck: Karpenter's drifted or disrupting nodes remain, and none came or went for these seconds
    rollout_stuck_after: int = tunable(3600, "NodeGroupRolloutStuck", "afterSeconds")
    rollout_stuck_for: str = tunable("5m", "NodeGroupRolloutStuck", "for")
    # KueueQuotaExceedsCapacity: nominal quota above the Ready nodes' allocatable (a flavor no claim governs)
    quota_exceeds_for: str = tunable("10m", "KueueQuotaExceedsCapacity", "for")
    # KueueCapacityUnassigned: the Ready nodes' allocatable in no quota, above this fraction (no claim governs it)
    unassigned_fraction: float = tunable(0.2, "KueueCapacityUnassigned", "fraction")
    unassigned_for: str = tunable("30m", "KueueCapacityUnassigned", "for")
    # ClusterResourceClaimOverAllocated: assignments above settled capacity
    claim_over_allocated_for: str = tunable("5m", "ClusterResourceClaimOverAllocated", "for")
    exporter_down_for: str = tunable("5m", "NodeWorkloadSummaryDown", "for")
    stale_seconds: int = tunable(600, "NodeWorkloadSummaryWatchStale", "staleSeconds")  # no event or bookmark
    stale_for: str = tunable("5m", "NodeWorkloadSummaryWatchStale", "for")
    series_cap_for: str = tunable("15m", "NodeWorkloadSummarySeriesCapReached", "for")
    write_errors_per_second: float = tunable(0.1, "NodeWorkloadSummaryWriteErrors", "errorsPerSecond")
    write_errors_for: str = tunable("15m", "NodeWorkloadSummaryWriteErrors", "for")
    no_leader_for: str = tunable("5m", "NodeWorkloadSummaryNoLeader", "for")
    job: str = "node-workload-summary"  # the scrape job of the exporter
    cluster: str = CLUSTER  # the label naming the cluster, kept by every aggregation

    def settings(self) -> dict[str, dict[str, Any]]:
        """alert -> its settings' values (the chart's ``prometheusRule.overrides`` shape)."""
        out: dict[str, dict[str, Any]] = {}
        for f in fields(self):
            if f.metadata:
                out.setdefault(f.metadata["alert"], {})[f.metadata["key"]] = getattr(self, f.name)
        return out

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any]]) -> Thresholds:
        """These thresholds with ``overrides`` (alert -> setting -> value, as the chart's values) in place."""
        names = {(f.metadata["alert"], f.metadata["key"]): f.name for f in fields(self) if f.metadata}
        settings = self.settings()
        changes: dict[str, Any] = {}
        for alert, values in overrides.items():
            if alert not in settings:
                raise ValueError(f"overrides.{alert}: no such alert ({', '.join(sorted(settings))})")
            for key, value in values.items():
                if (alert, key) not in names:
                    raise ValueError(f"overrides.{alert}.{key}: no such setting ({', '.join(sorted(settings[alert]))})")
                changes[names[alert, key]] = value
        return replace(self, **changes)


class Marker(str):
    """A setting left for the chart to fill in: ``${Alert.key}``, or ``${Alert.key|percent}`` where
    the rules show it as a percentage (``f"{x:.0%}"``). templates/_alertrules.tpl replaces both."""

    def __new__(cls, name: str) -> Marker:
        return super().__new__(cls, "${" + name + "}")

    def __format__(self, spec: str) -> str:
        if spec == "":
            return str(self)
        if spec == ".0%":
            return str(self)[:-1] + "|percent}"
        raise ValueError(f"{self}: the chart fills in no format {spec!r}")


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    duration: str
    severity: str
    summary: str
    description: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def anchor(self) -> str:
        """Its section's anchor in docs/runbooks.md (``## <name>``)."""
        return self.name.lower()

    def rule(self, runbook_base_url: str | None = RUNBOOK_BASE_URL, extra_labels: Mapping[str, str] | None = None,
             ) -> dict[str, Any]:
        """The rule; ``runbook`` always names its section of docs/runbooks.md, ``runbook_url`` links
        to it only under a ``runbook_base_url``."""
        annotations = {"summary": self.summary, "description": self.description,
                       "runbook": f"{RUNBOOKS}#{self.anchor}"}
        if runbook_base_url:
            annotations["runbook_url"] = f"{runbook_base_url}#{self.anchor}"
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": str(self.duration),  # a plain str where it is a Marker: yaml.safe_dump takes no subclass
            "labels": {"severity": self.severity, **self.labels, **(extra_labels or {})},
            "annotations": annotations,
        }


# The replica an alert is about: its pod where the scrape adds one, else its scrape address.
REPLICA = "{{ if $labels.pod }}{{ $labels.pod }}{{ else }}{{ $labels.instance }}{{ end }}"
# Node states whose pods are lost or being evicted; Cordoned and Degraded nodes still run theirs.
UNHEALTHY = "NotReady|Unknown|Disrupting"
FINISHED = "Succeeded|Failed"  # pod phases that hold no node


def alerts(t: Thresholds = Thresholds()) -> list[Alert]:
    c = t.cluster
    group, workload = f"{c}, summarizer, group", f"{c}, namespace, workload, kind"

    def total(labels: str, family: str, selector: str) -> str:
        return f"sum by ({labels}) ({one(family, selector, c)})"

    def workload_pods(phase: str) -> str:
        return one("nws_workload_pods", f'phase="{phase}", workload!="other"', c)

    nodes = one("nws_nodegroup_nodes", cluster=c)
    # The group's size in the hour before, across replicas: a replaced pod's series still counts.
    past = f"{by('nws_nodegroup_nodes', c)} (max_over_time(nws_nodegroup_nodes[1h] offset 5m))"
    not_ready = total(group, "nws_nodegroup_nodes_by_condition", 'condition!="Ready"')
    ready = total(group, "nws_nodegroup_nodes_by_condition", 'condition="Ready"')
    # A workload's pods on unhealthy nodes, and its pods that hold a node or wait for one: neither
    # counts a finished pod (Succeeded, Failed), which holds no node.
    on_unhealthy = total(workload, "nws_workload_pods_by_node_state", f'state=~"{UNHEALTHY}", workload!="other"')
    pods = total(workload, "nws_workload_pods", f'phase!~"{FINISHED}", workload!="other"')
    disrupting = total(group, "nws_nodegroup_nodes_by_state", 'state="Disrupting"')
    broken_gangs = total(workload, "nws_workload_gangs", 'state="Broken", workload!="other"')
    # A rollout's nodes not yet replaced: Karpenter's drifted ones and those it is disrupting; stuck
    # while none came or went (a node replaced, or one more drifted) for the threshold.
    unreplaced = total(group, "nws_nodegroup_nodes_by_rollout", 'rollout=~"Drifted|Disrupting"')
    moved = one("nws_nodegroup_rollout_changed_timestamp_seconds", cluster=c)
    up = f'up{{job="{t.job}"}}'
    # Quota is measured against the allocatable of the flavor's Ready nodes, as the claims measure
    # capacity; a flavor's resource a ClusterResourceClaim sets is judged by the claim's alert alone.
    quota, capacity = one("nws_flavor_nominal_quota", cluster=c), one("nws_flavor_ready_allocatable", cluster=c)
    claims = one("nws_claim_info", cluster=c)
    unclaimed = f"unless on ({c}, flavor, resource) {claims}"
    # The claim's flavor and policy beside its shortfall (topk: one series per claim while replicas
    # disagree); a shortfall alone while no replica says them yet (a rollout from an older version).
    shortfall = f"({one('nws_claim_shortfall', cluster=c)} > 0)"
    policy = (f"{shortfall} * on ({c}, claim) group_left (flavor, over_allocation) topk by ({c}, claim) (1, {claims})"
              f" or ({shortfall} unless on ({c}, claim) {claims})")
    return [
        Alert(
            "NodeGroupNotReady",
            f"{not_ready} / {nodes} > {t.not_ready_fraction}",
            t.not_ready_for, "warning",
            "Node group {{ $labels.group }} has NotReady nodes",
            "{{ $value | humanizePercentage }} of the nodes of node group {{ $labels.group }} (summarizer "
            "{{ $labels.summarizer }}) are NotReady or Unknown.",
        ),
        Alert(
            "NodeGroupDown",
            f"{nodes} > 0 and {ready} == 0",
            t.down_for, "critical",
            "Every node of node group {{ $labels.group }} is NotReady",
            "All {{ $value }} nodes of node group {{ $labels.group }} (summarizer {{ $labels.summarizer }}) "
            "are NotReady or Unknown: nothing can run there.",
        ),
        Alert(
            "NodeGroupShrunk",
            f"({past} - {nodes}) / {past} > {t.shrink_fraction}"
            f" or ({past} unless {nodes}) / {past}",  # the whole group went away
            t.shrink_for, "warning",
            "Node group {{ $labels.group }} lost nodes",
            "Node group {{ $labels.group }} (summarizer {{ $labels.summarizer }}) has lost "
            "{{ $value | humanizePercentage }} of its nodes against its size in the past hour.",
        ),
        Alert(
            "WorkloadPodsPending",
            f'{workload_pods("Pending")} > 0',
            t.pending_for, "warning",
            "{{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.workload }} has Pending pods",
            "{{ $value }} pods of {{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.workload }} have been "
            "Pending (unscheduled or not started) for " + t.pending_for + ".",
        ),
        Alert(
            "WorkloadPodsFailed",
            f'{workload_pods("Failed")} > 0',
            t.failed_for, "warning",
            "{{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.workload }} has Failed pods",
            "{{ $value }} pods of {{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.workload }} are in "
            "phase Failed.",
        ),
        Alert(
            "WorkloadOnUnhealthyNodes",
            f"{on_unhealthy} > 0",
            t.unhealthy_for, "warning",
            "{{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.workload }} has pods on unhealthy nodes",
            "{{ $value }} pods of {{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.workload }} run on "
            "NotReady, Unknown or Disrupting nodes.",
        ),
        Alert(
            # The same name, critical: Alertmanager's usual inhibition (critical mutes warning of the
            # same alertname and labels) leaves one notification per workload.
            "WorkloadOnUnhealthyNodes",
            f"({on_unhealthy} > 0) >= {t.unhealthy_critical_fraction} * {pods}",
            t.unhealthy_for, "critical",
            "{{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.workload }} has at least "
            + f"{t.unhealthy_critical_fraction:.0%} of its pods on unhealthy nodes",
            "{{ $value }} pods of {{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.workload }} run on "
            "NotReady, Unknown or Disrupting nodes: at least " + f"{t.unhealthy_critical_fraction:.0%}"
            " of its pods.",
        ),
        Alert(
            "WorkloadGangBroken",
            f"{broken_gangs} > 0",
            t.gang_broken_for, "critical",
            "{{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.workload }} has a broken gang",
            "{{ $value }} gangs of {{ $labels.kind }} {{ $labels.namespace }}/{{ $labels.workload }} have been "
            "short of ready members, with members lost on nodes not Ready or crashed, for longer than the service's "
            "--gang-grace: the job cannot make progress. Where the members were lost (node group, rack): the "
            "WorkloadSummary's status.worstGangs, and nws_workload_gang_members_lost.",
        ),
        Alert(
            "NodeGroupAcceleratorsUnhealthy",
            f"{one('nws_nodegroup_accelerators_unhealthy', cluster=c)} > 0",
            t.accelerators_unhealthy_for, "warning",
            "Node group {{ $labels.group }} has unhealthy {{ $labels.resource }}",
            "{{ $value }} {{ $labels.resource }} of node group {{ $labels.group }} (summarizer "
            "{{ $labels.summarizer }}) are unhealthy: their nodes' allocatable is below their capacity.",
        ),
        Alert(
            "NodeGroupDisrupting",
            f"{disrupting} > 0",
            t.disrupting_for, "info",
            "Node group {{ $labels.group }} has nodes being disrupted",
            "{{ $value }} nodes of node group {{ $labels.group }} (summarizer {{ $labels.summarizer }}) carry a "
            "disruption taint (Karpenter, the cluster autoscaler, an impending termination): their pods are "
            "being evicted.",
        ),
        Alert(
            "NodeGroupRolloutStuck",
            f"{unreplaced} > 0 and on ({group}) time() - {moved} > {t.rollout_stuck_after}",
            t.rollout_stuck_for, "warning",
            "Karpenter's rollout of node group {{ $labels.group }} is stuck",
            "{{ $value }} nodes of node group {{ $labels.group }} (summarizer {{ $labels.summarizer }}) are drifted "
            "or being disrupted by Karpenter, and none has been replaced (nor one more drifted) for "
            + f"{t.rollout_stuck_after}" + " seconds: a disruption budget, a karpenter.sh/do-not-disrupt pod or a "
            "PDB holds it, or a drain does not end.",
        ),
        Alert(
            "KueueQuotaExceedsCapacity",
            f"({quota} - {capacity} > 0) {unclaimed}",  # the value: how much more is promised than the nodes have
            t.quota_exceeds_for, "warning",
            "Kueue quota for {{ $labels.resource }} of flavor {{ $labels.flavor }} exceeds its Ready nodes",
            "The ClusterQueues' nominal quota for {{ $labels.resource }} in flavor {{ $labels.flavor }} is "
            "{{ $value | humanize }} more than the allocatable of the flavor's Ready nodes, and no "
            "ClusterResourceClaim sets it: Kueue admits workloads that cannot all run (nodes "
            "NotReady or gone, or quota raised?).",
        ),
        Alert(
            "KueueCapacityUnassigned",
            f"(({capacity} - {quota}) / {capacity} > {t.unassigned_fraction}) {unclaimed}",
            t.unassigned_for, "info",
            "Capacity of flavor {{ $labels.flavor }} ({{ $labels.resource }}) is in no Kueue quota",
            "{{ $value | humanizePercentage }} of the allocatable {{ $labels.resource }} of the Ready nodes of "
            "flavor {{ $labels.flavor }} is in no ClusterQueue's nominal quota, and no ClusterResourceClaim "
            "sets it: Kueue admits no workload onto it (nodes added or back, or quota lowered?).",
        ),
        Alert(
            "ClusterResourceClaimOverAllocated",
            # the value: how much more is assigned than there is
            policy,
            t.claim_over_allocated_for, "warning",
            "ClusterResourceClaim {{ $labels.claim }} assigns more {{ $labels.resource }} than its flavor has",
            "The assignments of ClusterResourceClaim {{ $labels.claim }} ask {{ $value | humanize }} more "
            "{{ $labels.resource }} than the settled capacity of the Ready nodes of flavor {{ $labels.flavor }} "
            "(nodes NotReady or gone, or assignments raised?): "
            '{{ if eq $labels.over_allocation "Hold" }}Hold keeps the quota last applied, so Kueue admits '
            "more than the nodes can run{{ else }}under Scale the claim's quota shrinks to what there is "
            "(written to the ClusterQueues with --quota-actuation=on){{ end }}.",
        ),
        Alert(
            "NodeWorkloadSummaryDown",
            # Every target of a cluster down, or none at all (a cluster that is not discovered is not seen).
            f"max by ({c}) ({up}) == 0 or absent({up})",
            t.exporter_down_for, "critical",
            "node-workload-summary is not scraped",
            f'No target of job {t.job} is up: node-group and workload metrics and alerts are blind.',
        ),
        Alert(
            # Per replica, named: a stale replica's old numbers can win the replicas' max in every query.
            "NodeWorkloadSummaryWatchStale",
            f'nws_watch_last_event_age_seconds{{resource=~"nodes|pods"}} > {t.stale_seconds}',
            t.stale_for, "warning",
            "node-workload-summary's {{ $labels.resource }} watch is stale on " + REPLICA,
            "Replica " + REPLICA + " has had no event or bookmark on its {{ $labels.resource }} watch for "
            "{{ $value | humanizeDuration }} (API server unreachable or hung?): its metrics may be out of date.",
        ),
        Alert(
            "NodeWorkloadSummarySeriesCapReached",
            f"{one('nws_workload_series_overflow', cluster=c)} > 0",
            t.series_cap_for, "info",
            "Workload series cap reached",
            "{{ $value }} workloads are folded into workload=\"other\": raise --max-workload-series.",
        ),
        Alert(
            "NodeWorkloadSummaryWriteErrors",
            f"sum by ({c}) (rate(nws_reconciler_write_errors_total[5m])) > {t.write_errors_per_second}",
            t.write_errors_for, "warning",
            "node-workload-summary cannot write summaries",
            "The reconciler fails {{ $value | humanize }} writes per second: check its log and RBAC.",
        ),
        Alert(
            "NodeWorkloadSummaryNoLeader",
            f"sum by ({c}) (nws_reconciler_leader) < 1",  # one replica holds the Lease at a time
            t.no_leader_for, "warning",
            "No node-workload-summary replica holds the Lease",
            "No replica has been the reconciler's leader for " + t.no_leader_for + ": NodeSummary and "
            "WorkloadSummary objects are not updated (the metrics are).",
        ),
    ]


def rules_file(t: Thresholds = Thresholds(), runbook_base_url: str | None = RUNBOOK_BASE_URL,
               disabled: Iterable[str] = (), additional_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The rules file: every alert but those ``disabled`` (by name), each with ``additional_labels``
    (which may not replace a rule's own, such as severity), its runbook's section, and a link to it
    under ``runbook_base_url`` if one is given."""
    rules, extra, left_out = alerts(t), dict(additional_labels or {}), set(disabled)
    names = sorted({a.name for a in rules})
    if unknown := left_out - set(names):
        raise ValueError(f"disabled: no such alert {', '.join(sorted(unknown))} ({', '.join(names)})")
    if own := sorted({k for a in rules for k in a.rule()["labels"]} & extra.keys()):
        raise ValueError(f"additionalRuleLabels: {', '.join(own)} is set by the rules themselves")
    return {"groups": [{"name": "node-workload-summary",
                        "rules": [a.rule(runbook_base_url, extra) for a in rules if a.name not in left_out]}]}


def prometheus_rule(t: Thresholds = Thresholds(), namespace: str = "node-workload-summary",
                    runbook_base_url: str | None = RUNBOOK_BASE_URL) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "node-workload-summary", "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "node-workload-summary", "role": "alert-rules"}},
        "spec": rules_file(t, runbook_base_url),
    }


def chart_rules() -> dict[str, Any]:
    """The chart's copy of the rules (its files/alert-rules.yaml, written by deploy/render.py):
    ``defaults``, every alert's settings (``Thresholds().settings()``), and ``spec``, the rules file
    with each setting left as its Marker and the runbook base as ``${runbookBaseUrl}``. The chart
    fills them in from its values, or the defaults, and drops each runbook_url when
    prometheusRule.runbookBaseUrl is empty: so its rules are these rules, tuned."""
    markers: dict[str, Any] = {f.name: Marker(f"{f.metadata['alert']}.{f.metadata['key']}")
                               for f in fields(Thresholds) if f.metadata}
    return {"defaults": Thresholds().settings(),
            "spec": rules_file(replace(Thresholds(), **markers), runbook_base_url=Marker("runbookBaseUrl"))}
