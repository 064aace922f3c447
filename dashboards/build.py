"""The Grafana dashboards, written with grafanalib (modern panel types only; the Prometheus data
source is a dashboard variable). ``python -m dashboards`` writes dashboards/generated/*.json.

Many clusters, one Grafana (kubernetes-mixin's convention): every dashboard has a ``cluster``
variable, hidden unless ``Options.multi_cluster``, and every query selects ``cluster="$cluster"``.
With one cluster whose series have no such label, the variable finds no value and Grafana sets it
to "", which selects exactly the series without the label."""

from __future__ import annotations

from dataclasses import dataclass

from grafanalib.core import (
    BarGauge,
    Dashboard,
    GridPos,
    Stat,
    Table,
    Target,
    Template,
    Templating,
    Time,
    TimeSeries,
)

# Every cluster family is read through one(): the replicas' copies of each series folded into one
# (alerts/replicas.py), so every number is the same with 1, 2 or N replicas and through a rollout.
from alerts.replicas import CLUSTER, one
from alerts.rules import UNHEALTHY

DS = "${datasource}"
GROUP_SEL = 'summarizer=~"$summarizer", group=~"$group"'
HIDDEN = 2  # Grafana's hide: the variable and its label
BY_GROUP = "summarizer, group"
WORKLOAD = "namespace, workload, kind"
STACKED = {"mode": "normal"}
# One colour per node state, the same on every dashboard.
STATE_COLOURS = {"Ready": "green", "NotReady": "red", "Unknown": "dark-red", "Disrupting": "purple",
                 "Cordoned": "blue", "Degraded": "orange"}
STATE_OVERRIDES = [{"matcher": {"id": "byName", "options": state},
                    "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": colour}}]}
                   for state, colour in STATE_COLOURS.items()]


@dataclass(frozen=True)
class Options:
    cluster_label: str = CLUSTER  # kubernetes-mixin's clusterLabel
    multi_cluster: bool = False  # show the cluster variable (kubernetes-mixin's showMultiCluster)

    def sel(self, *matchers: str) -> str:
        """A selector on the dashboard's cluster, then ``matchers``."""
        return ", ".join((f'{self.cluster_label}="$cluster"', *matchers))

    def one(self, family: str, sel: str) -> str:
        return one(family, sel, self.cluster_label)

    def sum(self, family: str, sel: str, by: str = "") -> str:
        """The family summed (by ``by``) after folding the replicas' copies of each series into one."""
        return f"sum by ({by}) ({self.one(family, sel)})" if by else f"sum({self.one(family, sel)})"


def _datasource() -> Template:
    return Template(name="datasource", label="Data source", query="prometheus", type="datasource", default="Prometheus")


def _cluster(o: Options) -> Template:
    # Single choice, as in kubernetes-mixin: a sum over clusters would merge groups of the same name.
    return Template(name="cluster", label="Cluster", dataSource=DS, type="query", refresh=2, sort=1, default="",
                    query=f"label_values(nws_build_info, {o.cluster_label})",
                    hide=0 if o.multi_cluster else HIDDEN)


def _values(o: Options, family: str, label: str, *matchers: str) -> str:
    """The values of ``label`` in the dashboard's cluster."""
    return f"label_values({family}{{{o.sel(*matchers)}}}, {label})"


def _var(name: str, query: str, label: str, multi: bool = True) -> Template:
    return Template(name=name, label=label, dataSource=DS, query=query, type="query", refresh=2, sort=1,
                    includeAll=multi, multi=multi, default="$__all" if multi else "")


def _t(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series") -> Target:
    return Target(expr=expr, legendFormat=legend, refId=ref, datasource=DS, instant=instant, format=fmt)


def _pos(x: int, y: int, w: int, h: int) -> GridPos:
    return GridPos(h=h, w=w, x=x, y=y)


def _dashboard(o: Options, uid: str, title: str, panels: list, variables: list[Template],
               description: str) -> Dashboard:
    return Dashboard(
        uid=uid, title=title, description=description, tags=["node-workload-summary"], timezone="browser",
        time=Time("now-6h", "now"), refresh="30s", panels=panels,
        templating=Templating(list=[_datasource(), _cluster(o), *variables]),
    ).auto_panel_ids()


def _hurt_table(o: Options, title: str, pos: GridPos, sel: str, description: str, uses: str = "") -> Table:
    """Workloads with pods on nodes in a state other than Ready, sorted by pods on NotReady, Unknown
    or Disrupting nodes (the alert's states); ``uses`` (a workload query) keeps only its workloads."""
    only = f" and on ({WORKLOAD}) {uses}" if uses else ""
    hurt = o.sum("nws_workload_pods_by_node_state", sel, WORKLOAD)
    rows = f" and on ({WORKLOAD}) {hurt}{only}"
    targets = [
        _t(o.sum("nws_workload_pods_by_node_state", f'{sel}, state=~"{UNHEALTHY}"', WORKLOAD) + only,
           ref="A", instant=True, fmt="table"),
        _t(hurt + only, ref="B", instant=True, fmt="table"),
        _t(o.sum("nws_workload_nodes_unhealthy", sel, WORKLOAD) + rows, ref="C", instant=True, fmt="table"),
        _t(o.sum("nws_workload_pods", sel, WORKLOAD) + rows, ref="D", instant=True, fmt="table"),
    ]
    names = {"Value #A": "Pods on NotReady, Unknown, Disrupting nodes", "Value #B": "Pods on nodes not Ready",
             "Value #C": "Nodes not Ready", "Value #D": "Pods"}
    if uses:
        targets.append(_t(f"{uses} and on ({WORKLOAD}) {hurt}", ref="E", instant=True, fmt="table"))
        names["Value #E"] = "Nodes used in this group"
    return Table(
        title=title, description=description, dataSource=DS, gridPos=pos, targets=targets,
        transformations=[
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": names}},
            {"id": "sortBy", "options": {"sort": [{"field": names["Value #A"], "desc": True}]}},
        ],
    )


def _ratio(o: Options, num: str, den: str, sel: str, by: str) -> str:
    """Requested over allocatable of the resources in ``sel``, per ``by``."""
    return f"{o.sum(num, sel, by)} / {o.sum(den, sel, by)}"


def node_groups_overview(o: Options = Options()) -> Dashboard:
    by = BY_GROUP
    sel = o.sel('summarizer=~"$summarizer"')
    not_ready = f'{sel}, condition!="Ready"'
    cpu = f'{sel}, resource="cpu"'
    memory = f'{sel}, resource="memory"'
    accelerators = f'{sel}, resource=~"nvidia.com/gpu|google.com/tpu|amd.com/gpu"'
    panels = [
        Stat(title="Node groups", dataSource=DS, gridPos=_pos(0, 0, 4, 4),
             targets=[_t(f"count({o.one('nws_nodegroup_nodes', sel)})")]),
        Stat(title="Nodes", dataSource=DS, gridPos=_pos(4, 0, 4, 4),
             targets=[_t(o.sum("nws_nodegroup_nodes", sel))]),
        Stat(title="Not ready nodes", dataSource=DS, gridPos=_pos(8, 0, 4, 4), colorMode="background",
             thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
             targets=[_t(o.sum("nws_nodegroup_nodes_by_condition", not_ready))]),
        Stat(title="Cordoned nodes", dataSource=DS, gridPos=_pos(12, 0, 4, 4),
             targets=[_t(o.sum("nws_nodegroup_nodes_unschedulable", sel))]),
        Stat(title="Pending pods on groups", dataSource=DS, gridPos=_pos(16, 0, 4, 4),
             targets=[_t(o.sum("nws_nodegroup_pods", f'{sel}, phase="Pending"'))]),
        Stat(title="Running pods on groups", dataSource=DS, gridPos=_pos(20, 0, 4, 4),
             targets=[_t(o.sum("nws_nodegroup_pods", f'{sel}, phase="Running"'))]),
        Table(
            title="Node groups (sort by a column: NotReady first)", dataSource=DS, gridPos=_pos(0, 4, 24, 9),
            targets=[
                _t(o.sum("nws_nodegroup_nodes", sel, by), ref="A", instant=True, fmt="table"),
                _t(o.sum("nws_nodegroup_nodes_by_condition", not_ready, by), ref="B", instant=True, fmt="table"),
                _t(o.sum("nws_nodegroup_nodes_unschedulable", sel, by), ref="C", instant=True, fmt="table"),
                _t(_ratio(o, "nws_nodegroup_requested", "nws_nodegroup_allocatable", cpu, by), ref="D", instant=True,
                   fmt="table"),
                _t(o.sum("nws_nodegroup_pods", sel, by), ref="E", instant=True, fmt="table"),
                _t(o.sum("nws_nodegroup_nodes_by_state", f'{sel}, state="Disrupting"', by), ref="F", instant=True,
                   fmt="table"),
                _t(o.sum("nws_nodegroup_nodes_by_state", f'{sel}, state="Degraded"', by), ref="G", instant=True,
                   fmt="table"),
                _t(o.sum("nws_nodegroup_accelerators_unhealthy", sel, by), ref="H", instant=True, fmt="table"),
                _t(o.sum("nws_nodegroup_pods_with_unhealthy_devices", sel, by), ref="I", instant=True, fmt="table"),
            ],
            transformations=[
                {"id": "merge", "options": {}},
                {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": {
                    "Value #A": "Nodes", "Value #B": "Not ready", "Value #C": "Cordoned",
                    "Value #D": "CPU requested / allocatable", "Value #E": "Pods", "Value #F": "Disrupting",
                    "Value #G": "Degraded", "Value #H": "Unhealthy accelerators",
                    "Value #I": "Pods on unhealthy devices"}}},
                {"id": "sortBy", "options": {"sort": [{"field": "Not ready", "desc": True}]}},
            ],
            overrides=[{"matcher": {"id": "byName", "options": "CPU requested / allocatable"},
                        "properties": [{"id": "unit", "value": "percentunit"}]}],
        ),
        TimeSeries(title="Nodes per group", dataSource=DS, gridPos=_pos(0, 13, 12, 8), unit="short",
                   targets=[_t(o.sum("nws_nodegroup_nodes", sel, by), "{{summarizer}}/{{group}}")]),
        TimeSeries(title="Not ready nodes per group", dataSource=DS, gridPos=_pos(12, 13, 12, 8), unit="short",
                   targets=[_t(o.sum("nws_nodegroup_nodes_by_condition", not_ready, by), "{{summarizer}}/{{group}}")]),
        BarGauge(title="CPU requested / allocatable", dataSource=DS, gridPos=_pos(0, 21, 8, 8),
                 format="percentunit", min=0, max=1, displayMode="gradient", orientation="horizontal",
                 targets=[_t(_ratio(o, "nws_nodegroup_requested", "nws_nodegroup_allocatable", cpu, by), "{{group}}")]),
        BarGauge(title="Memory requested / allocatable", dataSource=DS, gridPos=_pos(8, 21, 8, 8),
                 format="percentunit", min=0, max=1, displayMode="gradient", orientation="horizontal",
                 targets=[_t(_ratio(o, "nws_nodegroup_requested", "nws_nodegroup_allocatable", memory, by),
                             "{{group}}")]),
        BarGauge(title="Accelerators requested / allocatable", dataSource=DS, gridPos=_pos(16, 21, 8, 8),
                 format="percentunit", min=0, max=1, displayMode="gradient", orientation="horizontal",
                 targets=[_t(_ratio(o, "nws_nodegroup_requested", "nws_nodegroup_allocatable", accelerators,
                                    f"{by}, resource"), "{{group}} {{resource}}")]),
        TimeSeries(title="Nodes by state (all selected groups)", dataSource=DS, gridPos=_pos(0, 29, 12, 8),
                   unit="short", stacking=STACKED, fillOpacity=30, overrides=STATE_OVERRIDES,
                   targets=[_t(o.sum("nws_nodegroup_nodes_by_state", sel, "state"), "{{state}}")]),
        BarGauge(title="Unhealthy accelerators per group (capacity - allocatable)", dataSource=DS,
                 gridPos=_pos(12, 29, 12, 8), displayMode="gradient", orientation="horizontal", min=0,
                 thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
                 targets=[_t(o.sum("nws_nodegroup_accelerators_unhealthy", sel, f"{by}, resource"),
                             "{{group}} {{resource}}")]),
        *kueue_panels(o, 37),
    ]
    return _dashboard(o, "nws-node-groups", "Node groups", panels,
                      [_var("summarizer", _values(o, "nws_nodegroup_nodes", "summarizer"), "Summarizer"),
                       _var("resource", _values(o, "nws_flavor_nominal_quota", "resource"), "Kueue resource",
                            multi=False)],
                      "Size, health and usage of every node group (node pool).")


def kueue_panels(o: Options, y: int) -> list:
    """Kueue flavors (empty without Kueue): nominal quota against the flavor's live allocatable; the
    queues that ClusterResourceClaims give quota: claimed against applied."""
    by, sel, one_resource = "flavor, resource", o.sel(), o.sel('resource="$resource"')
    claimed = o.sum("nws_queue_desired_quota", one_resource, "cluster_queue")
    return [
        TimeSeries(title="Kueue: nominal quota / Ready allocatable per flavor (above 100%: promised more than the "
                         "Ready nodes have)", dataSource=DS, gridPos=_pos(0, y, 12, 8), unit="percentunit",
                   thresholdsStyleMode="line",
                   thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
                   targets=[_t(_ratio(o, "nws_flavor_nominal_quota", "nws_flavor_ready_allocatable", sel, by),
                               "{{flavor}} {{resource}}")]),
        TimeSeries(title="Kueue: nominal quota, allocatable (all, Ready) and requested per flavor ($resource)",
                   dataSource=DS, gridPos=_pos(12, y, 12, 8), unit="short",
                   targets=[_t(o.sum("nws_flavor_allocatable", one_resource, "flavor"), "{{flavor}} allocatable", "A"),
                            _t(o.sum("nws_flavor_ready_allocatable", one_resource, "flavor"),
                               "{{flavor}} Ready allocatable", "D"),
                            _t(o.sum("nws_flavor_nominal_quota", one_resource, "flavor"), "{{flavor}} quota", "B"),
                            _t(o.sum("nws_flavor_requested", one_resource, "flavor"), "{{flavor}} requested", "C")]),
        TimeSeries(title="ClusterResourceClaims: claimed against applied quota per ClusterQueue ($resource)",
                   description="Claimed: what the ClusterResourceClaims give the queue (nws_queue_desired_quota); "
                               "applied: the nominalQuota in its spec. Apart with --quota-actuation=off (a dry run), "
                               "or while a write is throttled or refused.",
                   dataSource=DS, gridPos=_pos(0, y + 8, 24, 8), unit="short",
                   targets=[_t(claimed, "{{cluster_queue}} claimed", "A"),
                            _t(f"{o.sum('nws_queue_nominal_quota', one_resource, 'cluster_queue')} and on "
                               f"(cluster_queue) {claimed}", "{{cluster_queue}} applied", "B")]),
    ]


def node_group_detail(o: Options = Options()) -> Dashboard:
    sel = o.sel(GROUP_SEL)
    cpu, memory, extended = f'{sel}, resource="cpu"', f'{sel}, resource="memory"', f'{sel}, resource=~".+/.+"'
    panels = [
        Stat(title="Nodes", dataSource=DS, gridPos=_pos(0, 0, 4, 4), targets=[_t(o.sum("nws_nodegroup_nodes", sel))]),
        Stat(title="Ready", dataSource=DS, gridPos=_pos(4, 0, 4, 4),
             targets=[_t(o.sum("nws_nodegroup_nodes_by_condition", f'{sel}, condition="Ready"'))]),
        Stat(title="Not ready", dataSource=DS, gridPos=_pos(8, 0, 4, 4), colorMode="background",
             thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
             targets=[_t(o.sum("nws_nodegroup_nodes_by_condition", f'{sel}, condition!="Ready"'))]),
        Stat(title="Disrupting", dataSource=DS, gridPos=_pos(12, 0, 4, 4),
             targets=[_t(o.sum("nws_nodegroup_nodes_by_state", f'{sel}, state="Disrupting"'))]),
        Stat(title="Cordoned", dataSource=DS, gridPos=_pos(16, 0, 4, 4),
             targets=[_t(o.sum("nws_nodegroup_nodes_unschedulable", sel))]),
        Stat(title="Degraded", dataSource=DS, gridPos=_pos(20, 0, 4, 4), colorMode="background",
             thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}],
             targets=[_t(o.sum("nws_nodegroup_nodes_by_state", f'{sel}, state="Degraded"'))]),
        TimeSeries(title="Nodes by state", dataSource=DS, gridPos=_pos(0, 4, 12, 8), unit="short",
                   stacking=STACKED, fillOpacity=30, overrides=STATE_OVERRIDES,
                   targets=[_t(o.sum("nws_nodegroup_nodes_by_state", sel, "state"), "{{state}}")]),
        TimeSeries(title="Pods by phase", dataSource=DS, gridPos=_pos(12, 4, 12, 8), unit="short",
                   targets=[_t(o.sum("nws_nodegroup_pods", sel, "phase"), "{{phase}}")]),
        TimeSeries(title="CPU: allocatable and requested", dataSource=DS, gridPos=_pos(0, 12, 8, 8), unit="none",
                   targets=[_t(o.sum("nws_nodegroup_allocatable", cpu), "allocatable", "A"),
                            _t(o.sum("nws_nodegroup_requested", cpu), "requested", "B")]),
        TimeSeries(title="Memory: allocatable and requested", dataSource=DS, gridPos=_pos(8, 12, 8, 8), unit="bytes",
                   targets=[_t(o.sum("nws_nodegroup_allocatable", memory), "allocatable", "A"),
                            _t(o.sum("nws_nodegroup_requested", memory), "requested", "B")]),
        TimeSeries(title="Extended resources: allocatable and requested", dataSource=DS, gridPos=_pos(16, 12, 8, 8),
                   unit="short",
                   targets=[_t(o.sum("nws_nodegroup_allocatable", extended, "resource"), "{{resource}} allocatable",
                               "A"),
                            _t(o.sum("nws_nodegroup_requested", extended, "resource"), "{{resource}} requested", "B")]),
        TimeSeries(title="Unhealthy accelerators: of the nodes (capacity - allocatable), held by pods (device health)",
                   dataSource=DS, gridPos=_pos(0, 20, 8, 9), unit="short",
                   targets=[_t(o.sum("nws_nodegroup_accelerators_unhealthy", sel, "resource"), "{{resource}} nodes",
                               "A"),
                            _t(o.sum("nws_nodegroup_devices_unhealthy", sel, "resource"), "{{resource}} pods", "B")]),
        _hurt_table(o, "Workloads on this group hurt now", _pos(8, 20, 16, 9), o.sel(),
                    "Workloads with pods on this group and on nodes not Ready; pod and node counts cover all of "
                    "the workload's node groups.", uses=o.sum("nws_workload_nodes", sel, WORKLOAD)),
        Table(title="Workloads on this group (distinct nodes used)", dataSource=DS, gridPos=_pos(0, 29, 24, 9),
              targets=[_t(f"sort_desc({o.sum('nws_workload_nodes', sel, WORKLOAD)})", instant=True, fmt="table")],
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True},
                                                              "renameByName": {"Value": "Nodes"}}}]),
        TimeSeries(title="Karpenter rollout: nodes by NodeClaim state (NodeGroupRolloutStuck when it stops)",
                   dataSource=DS, gridPos=_pos(0, 38, 24, 8), unit="short", stacking=STACKED, fillOpacity=30,
                   targets=[_t(o.sum("nws_nodegroup_nodes_by_rollout", sel, "rollout"), "{{rollout}}")]),
    ]
    return _dashboard(o, "nws-node-group", "Node group detail", panels, [
        _var("summarizer", _values(o, "nws_nodegroup_nodes", "summarizer"), "Summarizer", multi=False),
        _var("group", _values(o, "nws_nodegroup_nodes", "group", 'summarizer="$summarizer"'), "Group", multi=False),
    ], "One node group: health, capacity against requests, and the workloads that use it.")


def workloads(o: Options = Options()) -> Dashboard:
    sel = o.sel('namespace=~"$namespace", kind=~"$kind"')
    top = f"topk($top, {o.sum('nws_workload_pods', sel, WORKLOAD)})"
    unhealthy = f'{sel}, state=~"{UNHEALTHY}"'
    broken = f'{sel}, state="Broken"'
    panels = [
        Stat(title="Workloads", dataSource=DS, gridPos=_pos(0, 0, 4, 4), targets=[_t(o.one("nws_workloads", o.sel()))]),
        Stat(title="Pods in workloads", dataSource=DS, gridPos=_pos(4, 0, 4, 4),
             targets=[_t(o.sum("nws_workload_pods", sel))]),
        Stat(title="Pending pods", dataSource=DS, gridPos=_pos(8, 0, 4, 4), colorMode="background",
             thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}],
             targets=[_t(o.sum("nws_workload_pods", f'{sel}, phase="Pending"'))]),
        Stat(title="Pods without a workload", dataSource=DS, gridPos=_pos(12, 0, 4, 4),
             targets=[_t(f"sum({o.one('nws_pods_without_workload', o.sel())})")]),
        Stat(title="Workloads on unhealthy nodes", dataSource=DS, gridPos=_pos(16, 0, 4, 4), colorMode="background",
             thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
             targets=[_t(f"count({o.sum('nws_workload_pods_by_node_state', unhealthy, WORKLOAD)}) or vector(0)")]),
        Stat(title="Pods on unhealthy nodes", dataSource=DS, gridPos=_pos(20, 0, 4, 4),
             targets=[_t(f"{o.sum('nws_workload_pods_by_node_state', unhealthy)} or vector(0)")]),
        BarGauge(title="Top $top workloads by pods", dataSource=DS, gridPos=_pos(0, 4, 12, 12), displayMode="basic",
                 orientation="horizontal", min=0,
                 targets=[_t(top, "{{namespace}}/{{workload}} ({{kind}})", instant=True)]),
        Table(title="Node groups each workload uses (distinct nodes)", dataSource=DS, gridPos=_pos(12, 4, 12, 12),
              targets=[_t(o.one("nws_workload_nodes", sel), instant=True, fmt="table")],
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True},
                                                              "renameByName": {"Value": "Nodes"}}}]),
        TimeSeries(title="Pods by workload", dataSource=DS, gridPos=_pos(0, 16, 12, 9), unit="short",
                   targets=[_t(top, "{{namespace}}/{{workload}}")]),
        TimeSeries(title="Pending and failed pods by workload", dataSource=DS, gridPos=_pos(12, 16, 12, 9),
                   unit="short",
                   targets=[_t(o.sum("nws_workload_pods", f'{sel}, phase=~"Pending|Failed"',
                                    "namespace, workload, phase") + " > 0", "{{namespace}}/{{workload}} {{phase}}")]),
        _hurt_table(o, "Workloads hurt now: pods on nodes not Ready", _pos(0, 25, 24, 9), sel,
                    "NotReady, Unknown and Disrupting nodes lose their pods (WorkloadOnUnhealthyNodes); Cordoned "
                    "and Degraded nodes still run them."),
        Table(title="Pods at risk of Karpenter's disruptions, by reason", dataSource=DS, gridPos=_pos(0, 34, 24, 9),
              description="Pods on nodes Karpenter is disrupting, or whose NodeClaim is Drifted, expiring or "
                          "Consolidatable: what its next disruptions hit (WorkloadSummary status.atRisk).",
              targets=[_t(f"sort_desc({o.sum('nws_workload_pods_at_risk', sel, WORKLOAD + ', reason')})",
                          instant=True, fmt="table")],
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True},
                                                              "renameByName": {"Value": "Pods"}}}]),
        Stat(title="Broken gangs", dataSource=DS, gridPos=_pos(0, 43, 6, 9), colorMode="background",
             description="Gangs (in-tree PodGroups, pod-label gangs, JobSets, LeaderWorkerSet groups) short of "
                         "ready members, with members lost, for longer than --gang-grace (WorkloadGangBroken).",
             thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
             targets=[_t(f"{o.sum('nws_workload_gangs', broken)} or vector(0)")]),
        TimeSeries(title="Gangs by state", dataSource=DS, gridPos=_pos(6, 43, 9, 9), unit="short",
                   targets=[_t(o.sum("nws_workload_gangs", sel, "state"), "{{state}}")]),
        Table(title="Which pool broke my job: members lost by node group and domain", dataSource=DS,
              gridPos=_pos(15, 43, 9, 9),
              description="Members the workloads' Broken gangs lost, by node group and domain (--gang-topology-label: "
                          "a rack, a block, a zone); WorkloadSummary status.worstGangs names the gangs.",
              targets=[_t(f"sort_desc({o.sum('nws_workload_gang_members_lost', sel, WORKLOAD + ', group, domain')})",
                          instant=True, fmt="table")],
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True},
                                                              "renameByName": {"Value": "Members lost"}}}]),
    ]
    top_n = Template(name="top", label="Top N", query="10,20,50", type="custom", default="10")
    return _dashboard(o, "nws-workloads", "Workloads", panels, [
        _var("namespace", _values(o, "nws_workload_pods", "namespace"), "Namespace"),
        _var("kind", _values(o, "nws_workload_pods", "kind"), "Kind"), top_n,
    ], "Root workloads (Deployments, JobSets, LeaderWorkerSets, ...): pods and the node groups they use.")


def exporter_health(o: Options = Options()) -> Dashboard:
    """The service's own metrics. The rule: what every replica sees alike (the cluster, its watch
    events) is read with max across replicas; what each replica does alone is shown per replica
    (sync lag, scrapes, memory, CPU) or summed (relists, writes: real API requests; Lease holders:
    1 when healthy)."""
    job = o.sel('job=~"$job"')
    panels = [
        Stat(title="Targets up", dataSource=DS, gridPos=_pos(0, 0, 6, 4), targets=[_t(f"sum(up{{{job}}})")]),
        Stat(title="Initial sync (slowest replica)", dataSource=DS, gridPos=_pos(6, 0, 6, 4), format="s",
             targets=[_t(f"max(nws_initial_sync_duration_seconds{{{job}}})")]),
        Stat(title="Replicas holding the Lease", dataSource=DS, gridPos=_pos(12, 0, 6, 4), colorMode="background",
             thresholds=[{"color": "red", "value": None}, {"color": "green", "value": 1}, {"color": "red", "value": 2}],
             targets=[_t(f"sum(nws_reconciler_leader{{{job}}})")]),
        Stat(title="Workloads folded into other", dataSource=DS, gridPos=_pos(18, 0, 6, 4),
             targets=[_t(o.one("nws_workload_series_overflow", job))]),
        TimeSeries(title="Watch events / s", dataSource=DS, gridPos=_pos(0, 4, 12, 8), unit="ops",
                   targets=[_t(f"max by (resource, type) (rate(nws_watch_events_total{{{job}}}[$__rate_interval]))",
                               "{{resource}} {{type}}")]),
        TimeSeries(title="Sync lag: seconds since the last event, per replica", dataSource=DS,
                   gridPos=_pos(12, 4, 12, 8), unit="s",
                   targets=[_t(f"max by (resource, instance) (nws_watch_last_event_age_seconds{{{job}}})",
                               "{{resource}} {{instance}}")]),
        TimeSeries(title="Relists and watch restarts (all replicas)", dataSource=DS, gridPos=_pos(0, 12, 12, 8),
                   unit="short",
                   targets=[_t(f"sum by (resource) (increase(nws_watch_relists_total{{{job}}}[$__rate_interval]))",
                               "relist {{resource}}", "A"),
                            _t(f"sum by (resource, reason) (increase(nws_watch_restarts_total{{{job}}}"
                               f"[$__rate_interval]))", "restart {{resource}} {{reason}}", "B")]),
        TimeSeries(title="Dropped workload series", dataSource=DS, gridPos=_pos(12, 12, 12, 8), unit="short",
                   targets=[_t(f"max(increase(nws_workload_series_dropped_total{{{job}}}[$__rate_interval]))",
                               "dropped", "A"),
                            _t(o.one("nws_workload_series_limit", job), "limit", "B")]),
        TimeSeries(title="Scrape: render time and duration", dataSource=DS, gridPos=_pos(0, 20, 12, 8), unit="s",
                   targets=[_t(f"max by (instance) (nws_scrape_render_seconds{{{job}}})", "render {{instance}}", "A"),
                            _t(f"max by (instance) (scrape_duration_seconds{{{job}}})", "scrape {{instance}}", "B")]),
        TimeSeries(title="Reconciler writes and errors / s (all replicas)", dataSource=DS,
                   gridPos=_pos(12, 20, 12, 8), unit="ops",
                   targets=[_t(f"sum by (verb) (rate(nws_reconciler_writes_total{{{job}}}[$__rate_interval]))",
                               "{{verb}}", "A"),
                            _t(f"sum by (code) (rate(nws_reconciler_write_errors_total{{{job}}}[$__rate_interval]))",
                               "error {{code}}", "B")]),
        TimeSeries(title="Memory (RSS)", dataSource=DS, gridPos=_pos(0, 28, 12, 8), unit="bytes",
                   targets=[_t(f"max by (instance) (process_resident_memory_bytes{{{job}}})", "{{instance}}")]),
        TimeSeries(title="CPU", dataSource=DS, gridPos=_pos(12, 28, 12, 8), unit="percentunit",
                   targets=[_t(f"max by (instance) (rate(process_cpu_seconds_total{{{job}}}[$__rate_interval]))",
                               "{{instance}}")]),
        *self_metrics_panels(job, 36),
    ]
    return _dashboard(o, "nws-health", "node-workload-summary health", panels,
                      [_var("job", _values(o, "nws_build_info", "job"), "Job")],
                      "Is the exporter keeping up: sync lag, events, relists, series caps, scrapes, writes, "
                      "the write queue, API requests.")


def _quantile(q: float, family: str, sel: str, by: str = "") -> str:
    """The ``q`` quantile of a histogram over all replicas' observations (per ``by``)."""
    return (f"histogram_quantile({q}, sum by ({by + ', ' if by else ''}le) "
            f"(rate({family}_bucket{{{sel}}}[$__rate_interval])))")


def self_metrics_panels(job: str, y: int) -> list:
    """The controllers' work queues and the API requests, in client-go's workqueue_* and
    rest_client_* shapes: depth per replica and controller (only the leader's queues fill), the
    rest per controller over all replicas (a follower's queues stay near empty; every replica's
    requests are real ones)."""
    queue, requests = "nws_workqueue", "nws_rest_client"
    waits, works = f"{queue}_queue_duration_seconds", f"{queue}_work_duration_seconds"
    return [
        TimeSeries(title="Work queues: keys waiting for a worker, per replica and controller", dataSource=DS,
                   gridPos=_pos(0, y, 8, 8), unit="short",
                   targets=[_t(f"max by (instance, name) ({queue}_depth{{{job}}})", "{{instance}} {{name}}")]),
        TimeSeries(title="Work queues: adds and retries / s, per controller", dataSource=DS, gridPos=_pos(8, y, 8, 8),
                   unit="ops",
                   targets=[_t(f"sum by (name) (rate({queue}_adds_total{{{job}}}[$__rate_interval]))",
                               "{{name}} adds", "A"),
                            _t(f"sum by (name) (rate({queue}_retries_total{{{job}}}[$__rate_interval]))",
                               "{{name}} retries", "B")]),
        TimeSeries(title="Work queues: time waiting and working (p50, p99), per controller", dataSource=DS,
                   description="Waiting: from queued to taken by a worker. Working: deciding and writing one key, "
                               "the wait for --writes-per-second included.",
                   gridPos=_pos(16, y, 8, 8), unit="s",
                   targets=[_t(_quantile(0.5, waits, job, "name"), "{{name}} waiting p50", "A"),
                            _t(_quantile(0.99, waits, job, "name"), "{{name}} waiting p99", "B"),
                            _t(_quantile(0.5, works, job, "name"), "{{name}} working p50", "C"),
                            _t(_quantile(0.99, works, job, "name"), "{{name}} working p99", "D")]),
        TimeSeries(title="API request latency p99 by verb and resource", dataSource=DS,
                   description="WATCH: until the API server answered (the stream then lasts minutes); LIST: the "
                               "whole response read.",
                   gridPos=_pos(0, y + 8, 12, 8), unit="s",
                   targets=[_t(_quantile(0.99, f"{requests}_request_duration_seconds", job, "verb, resource"),
                               "{{verb}} {{resource}}")]),
        TimeSeries(title="API requests / s by code and method", dataSource=DS,
                   description="<error>: no answer (connection refused, broken or silent past its timeout). A "
                               "410 Gone, a 404 of a kind not installed and a 409 of a raced write are expected "
                               "now and then.",
                   gridPos=_pos(12, y + 8, 12, 8), unit="ops",
                   targets=[_t(f"sum by (code, method) (rate({requests}_requests_total{{{job}}}[$__rate_interval]))",
                               "{{code}} {{method}}")]),
    ]


DASHBOARDS = {
    "node-groups.json": node_groups_overview,
    "node-group-detail.json": node_group_detail,
    "workloads.json": workloads,
    "health.json": exporter_health,
}

__all__ = ["DASHBOARDS"]
