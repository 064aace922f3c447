"""One series per group, whatever the number of replicas.

Every replica serves the same cluster metrics, and Prometheus keeps one series per replica, each
with the labels of its target (`instance`, `pod`, `job`, `namespace`, `service`, `endpoint`,
`container`), which change whenever a pod is replaced. So every dashboard query and alert reads a
cluster family as ``max by (<the family's own labels>)`` first: replicas agree, so max (not sum)
gives the single-replica answer for 1, 2 or N replicas and through a rollout, and it ignores any
label a scrape configuration adds. Sums across groups come after that.

Every fold also keeps the cluster label (``cluster`` unless told otherwise; kubernetes-mixin's
convention): a fleet Prometheus, Thanos or Mimir holds many clusters' copies of each group, and a
rule evaluated there must stay per cluster. A single cluster whose series have no such label
groups by an empty value, which changes nothing.

Assumed: the scrape keeps the exporter's own `namespace` label (`honorLabels: true` in the
ServiceMonitor); otherwise Prometheus renames it `exported_namespace` and the target's namespace
takes its place.

Per-replica families (watch ages, the Lease, render time, process metrics, write counters) are
not listed here: they are read per replica, or summed where a total makes sense.
"""

from __future__ import annotations

# A family's own labels, as in docs/metrics.md; a test checks them against a real scrape.
LABELS: dict[str, tuple[str, ...]] = {
    "nws_nodegroup_nodes": ("summarizer", "group"),
    "nws_nodegroup_nodes_by_condition": ("summarizer", "group", "condition"),
    "nws_nodegroup_nodes_unschedulable": ("summarizer", "group"),
    "nws_nodegroup_nodes_by_state": ("summarizer", "group", "state"),
    "nws_nodegroup_accelerators_unhealthy": ("summarizer", "group", "resource"),
    "nws_nodegroup_pods_with_unhealthy_devices": ("summarizer", "group"),
    "nws_nodegroup_devices_unhealthy": ("summarizer", "group", "resource"),
    "nws_nodegroup_allocatable": ("summarizer", "group", "resource"),
    "nws_nodegroup_capacity": ("summarizer", "group", "resource"),
    "nws_nodegroup_pods": ("summarizer", "group", "phase"),
    "nws_nodegroup_requested": ("summarizer", "group", "resource"),
    "nws_nodegroup_nodes_by_rollout": ("summarizer", "group", "rollout"),
    "nws_nodegroup_rollout_changed_timestamp_seconds": ("summarizer", "group"),
    "nws_nodegroups": ("summarizer",),
    "nws_workload_pods": ("namespace", "workload", "kind", "phase"),
    "nws_workload_nodes": ("namespace", "workload", "kind", "summarizer", "group"),
    "nws_workload_pods_by_node_state": ("namespace", "workload", "kind", "state"),
    "nws_workload_nodes_unhealthy": ("namespace", "workload", "kind"),
    "nws_workload_pods_with_unhealthy_devices": ("namespace", "workload", "kind"),
    "nws_workload_devices_unhealthy": ("namespace", "workload", "kind", "resource"),
    "nws_workload_pods_at_risk": ("namespace", "workload", "kind", "reason"),
    "nws_workload_gangs": ("namespace", "workload", "kind", "state"),
    "nws_workload_gang_members": ("namespace", "workload", "kind", "state"),
    "nws_workload_gang_members_lost": ("namespace", "workload", "kind", "summarizer", "group", "domain"),
    "nws_workloads": (),
    "nws_workload_series_limit": (),
    "nws_workload_series_overflow": (),
    "nws_pods_without_workload": ("reason",),
    "nws_kind_not_served": ("group", "kind"),
    "nws_flavor_allocatable": ("flavor", "resource"),
    "nws_flavor_ready_allocatable": ("flavor", "resource"),
    "nws_flavor_nodes_by_state": ("flavor", "state"),
    "nws_flavor_nominal_quota": ("flavor", "resource"),
    "nws_flavor_requested": ("flavor", "resource"),
    "nws_claim_info": ("claim", "flavor", "resource", "member", "over_allocation"),
    "nws_claim_nominal": ("claim", "resource"),
    "nws_claim_assigned": ("claim", "resource"),
    "nws_claim_shortfall": ("claim", "resource"),
    "nws_queue_desired_quota": ("cluster_queue", "flavor", "resource"),
    "nws_queue_nominal_quota": ("cluster_queue", "flavor", "resource"),
}


CLUSTER = "cluster"  # the label naming the cluster in a fleet's series (external label or relabel)


def by(family: str, cluster: str = CLUSTER) -> str:
    """``max by (cluster, ...)`` with the family's own labels."""
    return f"max by ({', '.join((cluster, *LABELS[family]))})"


def one(family: str, selector: str = "", cluster: str = CLUSTER) -> str:
    """``family{selector}`` with one series per group and cluster: the replicas' copies folded into one."""
    series = f"{family}{{{selector}}}" if selector else family
    return f"{by(family, cluster)} ({series})"
