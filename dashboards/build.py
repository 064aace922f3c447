"""The Grafana dashboards, written with grafanalib (modern panel types only; the Prometheus data
source is a dashboard variable). ``python -m dashboards`` writes dashboards/generated/*.json."""

from __future__ import annotations

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

DS = "${datasource}"
GROUP_SEL = 'summarizer=~"$summarizer", group=~"$group"'


def _datasource() -> Template:
    return Template(name="datasource", label="Data source", query="prometheus", type="datasource", default="Prometheus")


def _var(name: str, query: str, label: str, multi: bool = True) -> Template:
    return Template(name=name, label=label, dataSource=DS, query=query, type="query", refresh=2, sort=1,
                    includeAll=multi, multi=multi, default="$__all" if multi else "")


def _t(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series") -> Target:
    return Target(expr=expr, legendFormat=legend, refId=ref, datasource=DS, instant=instant, format=fmt)


def _pos(x: int, y: int, w: int, h: int) -> GridPos:
    return GridPos(h=h, w=w, x=x, y=y)


def _dashboard(uid: str, title: str, panels: list, variables: list[Template], description: str) -> Dashboard:
    return Dashboard(
        uid=uid, title=title, description=description, tags=["node-workload-summary"], timezone="browser",
        time=Time("now-6h", "now"), refresh="30s", panels=panels,
        templating=Templating(list=[_datasource(), *variables]),
    ).auto_panel_ids()


def node_groups_overview() -> Dashboard:
    by = "summarizer, group"
    panels = [
        Stat(title="Node groups", dataSource=DS, gridPos=_pos(0, 0, 4, 4),
             targets=[_t('count(nws_nodegroup_nodes{summarizer=~"$summarizer"})')]),
        Stat(title="Nodes", dataSource=DS, gridPos=_pos(4, 0, 4, 4),
             targets=[_t('sum(nws_nodegroup_nodes{summarizer=~"$summarizer"})')]),
        Stat(title="Not ready nodes", dataSource=DS, gridPos=_pos(8, 0, 4, 4), colorMode="background",
             thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
             targets=[_t('sum(nws_nodegroup_nodes_by_condition{summarizer=~"$summarizer", condition!="Ready"})')]),
        Stat(title="Cordoned nodes", dataSource=DS, gridPos=_pos(12, 0, 4, 4),
             targets=[_t('sum(nws_nodegroup_nodes_unschedulable{summarizer=~"$summarizer"})')]),
        Stat(title="Pending pods on groups", dataSource=DS, gridPos=_pos(16, 0, 4, 4),
             targets=[_t('sum(nws_nodegroup_pods{summarizer=~"$summarizer", phase="Pending"})')]),
        Stat(title="Running pods on groups", dataSource=DS, gridPos=_pos(20, 0, 4, 4),
             targets=[_t('sum(nws_nodegroup_pods{summarizer=~"$summarizer", phase="Running"})')]),
        Table(
            title="Node groups (sort by a column: NotReady first)", dataSource=DS, gridPos=_pos(0, 4, 24, 9),
            targets=[
                _t(f'sum by ({by}) (nws_nodegroup_nodes{{summarizer=~"$summarizer"}})', ref="A", instant=True,
                   fmt="table"),
                _t(f'sum by ({by}) (nws_nodegroup_nodes_by_condition{{summarizer=~"$summarizer", condition!="Ready"}})',
                   ref="B", instant=True, fmt="table"),
                _t(f'sum by ({by}) (nws_nodegroup_nodes_unschedulable{{summarizer=~"$summarizer"}})', ref="C",
                   instant=True, fmt="table"),
                _t(f'sum by ({by}) (nws_nodegroup_requested{{summarizer=~"$summarizer", resource="cpu"}})'
                   f' / sum by ({by}) (nws_nodegroup_allocatable{{summarizer=~"$summarizer", resource="cpu"}})',
                   ref="D", instant=True, fmt="table"),
                _t(f'sum by ({by}) (nws_nodegroup_pods{{summarizer=~"$summarizer"}})', ref="E", instant=True,
                   fmt="table"),
            ],
            transformations=[
                {"id": "merge", "options": {}},
                {"id": "organize", "options": {"excludeByName": {"Time": True}, "renameByName": {
                    "Value #A": "Nodes", "Value #B": "Not ready", "Value #C": "Cordoned",
                    "Value #D": "CPU requested / allocatable", "Value #E": "Pods"}}},
                {"id": "sortBy", "options": {"sort": [{"field": "Not ready", "desc": True}]}},
            ],
            overrides=[{"matcher": {"id": "byName", "options": "CPU requested / allocatable"},
                        "properties": [{"id": "unit", "value": "percentunit"}]}],
        ),
        TimeSeries(title="Nodes per group", dataSource=DS, gridPos=_pos(0, 13, 12, 8), unit="short",
                   targets=[_t(f'sum by ({by}) (nws_nodegroup_nodes{{summarizer=~"$summarizer"}})',
                               "{{summarizer}}/{{group}}")]),
        TimeSeries(title="Not ready nodes per group", dataSource=DS, gridPos=_pos(12, 13, 12, 8), unit="short",
                   targets=[_t(f'sum by ({by}) (nws_nodegroup_nodes_by_condition{{summarizer=~"$summarizer", '
                               f'condition!="Ready"}})', "{{summarizer}}/{{group}}")]),
        BarGauge(title="CPU requested / allocatable", dataSource=DS, gridPos=_pos(0, 21, 8, 8),
                 format="percentunit", min=0, max=1, displayMode="gradient", orientation="horizontal",
                 targets=[_t(f'sum by ({by}) (nws_nodegroup_requested{{summarizer=~"$summarizer", resource="cpu"}})'
                             f' / sum by ({by}) (nws_nodegroup_allocatable{{summarizer=~"$summarizer", '
                             f'resource="cpu"}})', "{{group}}")]),
        BarGauge(title="Memory requested / allocatable", dataSource=DS, gridPos=_pos(8, 21, 8, 8),
                 format="percentunit", min=0, max=1, displayMode="gradient", orientation="horizontal",
                 targets=[_t(f'sum by ({by}) (nws_nodegroup_requested{{summarizer=~"$summarizer", '
                             f'resource="memory"}}) / sum by ({by}) (nws_nodegroup_allocatable{{summarizer=~'
                             f'"$summarizer", resource="memory"}})', "{{group}}")]),
        BarGauge(title="Accelerators requested / allocatable", dataSource=DS, gridPos=_pos(16, 21, 8, 8),
                 format="percentunit", min=0, max=1, displayMode="gradient", orientation="horizontal",
                 targets=[_t(f'sum by ({by}, resource) (nws_nodegroup_requested{{summarizer=~"$summarizer", '
                             f'resource=~"nvidia.com/gpu|google.com/tpu|amd.com/gpu"}}) / sum by ({by}, resource) '
                             f'(nws_nodegroup_allocatable{{summarizer=~"$summarizer", '
                             f'resource=~"nvidia.com/gpu|google.com/tpu|amd.com/gpu"}})', "{{group}} {{resource}}")]),
    ]
    return _dashboard("nws-node-groups", "Node groups", panels,
                      [_var("summarizer", "label_values(nws_nodegroup_nodes, summarizer)", "Summarizer")],
                      "Size, health and usage of every node group (node pool).")


def node_group_detail() -> Dashboard:
    panels = [
        Stat(title="Nodes", dataSource=DS, gridPos=_pos(0, 0, 6, 4),
             targets=[_t(f"sum(nws_nodegroup_nodes{{{GROUP_SEL}}})")]),
        Stat(title="Ready", dataSource=DS, gridPos=_pos(6, 0, 6, 4),
             targets=[_t(f'sum(nws_nodegroup_nodes_by_condition{{{GROUP_SEL}, condition="Ready"}})')]),
        Stat(title="Not ready", dataSource=DS, gridPos=_pos(12, 0, 6, 4), colorMode="background",
             thresholds=[{"color": "green", "value": None}, {"color": "red", "value": 1}],
             targets=[_t(f'sum(nws_nodegroup_nodes_by_condition{{{GROUP_SEL}, condition!="Ready"}})')]),
        Stat(title="Cordoned", dataSource=DS, gridPos=_pos(18, 0, 6, 4),
             targets=[_t(f"sum(nws_nodegroup_nodes_unschedulable{{{GROUP_SEL}}})")]),
        TimeSeries(title="Nodes by condition", dataSource=DS, gridPos=_pos(0, 4, 12, 8), unit="short",
                   stacking={"mode": "normal"}, fillOpacity=30,
                   targets=[_t(f"sum by (condition) (nws_nodegroup_nodes_by_condition{{{GROUP_SEL}}})",
                               "{{condition}}")]),
        TimeSeries(title="Pods by phase", dataSource=DS, gridPos=_pos(12, 4, 12, 8), unit="short",
                   targets=[_t(f"sum by (phase) (nws_nodegroup_pods{{{GROUP_SEL}}})", "{{phase}}")]),
        TimeSeries(title="CPU: allocatable and requested", dataSource=DS, gridPos=_pos(0, 12, 8, 8), unit="none",
                   targets=[_t(f'sum(nws_nodegroup_allocatable{{{GROUP_SEL}, resource="cpu"}})', "allocatable", "A"),
                            _t(f'sum(nws_nodegroup_requested{{{GROUP_SEL}, resource="cpu"}})', "requested", "B")]),
        TimeSeries(title="Memory: allocatable and requested", dataSource=DS, gridPos=_pos(8, 12, 8, 8), unit="bytes",
                   targets=[_t(f'sum(nws_nodegroup_allocatable{{{GROUP_SEL}, resource="memory"}})', "allocatable", "A"),
                            _t(f'sum(nws_nodegroup_requested{{{GROUP_SEL}, resource="memory"}})', "requested", "B")]),
        TimeSeries(title="Extended resources: allocatable and requested", dataSource=DS, gridPos=_pos(16, 12, 8, 8),
                   unit="short",
                   targets=[_t(f'sum by (resource) (nws_nodegroup_allocatable{{{GROUP_SEL}, resource=~".+/.+"}})',
                               "{{resource}} allocatable", "A"),
                            _t(f'sum by (resource) (nws_nodegroup_requested{{{GROUP_SEL}, resource=~".+/.+"}})',
                               "{{resource}} requested", "B")]),
        Table(title="Workloads on this group (distinct nodes used)", dataSource=DS, gridPos=_pos(0, 20, 24, 9),
              targets=[_t(f"sort_desc(sum by (namespace, workload, kind) (nws_workload_nodes{{{GROUP_SEL}}}))",
                          instant=True, fmt="table")],
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True},
                                                              "renameByName": {"Value": "Nodes"}}}]),
    ]
    return _dashboard("nws-node-group", "Node group detail", panels, [
        _var("summarizer", "label_values(nws_nodegroup_nodes, summarizer)", "Summarizer", multi=False),
        _var("group", 'label_values(nws_nodegroup_nodes{summarizer="$summarizer"}, group)', "Group", multi=False),
    ], "One node group: health, capacity against requests, and the workloads that use it.")


def workloads() -> Dashboard:
    sel = 'namespace=~"$namespace", kind=~"$kind"'
    panels = [
        Stat(title="Workloads", dataSource=DS, gridPos=_pos(0, 0, 6, 4), targets=[_t("max(nws_workloads)")]),
        Stat(title="Pods in workloads", dataSource=DS, gridPos=_pos(6, 0, 6, 4),
             targets=[_t(f"sum(nws_workload_pods{{{sel}}})")]),
        Stat(title="Pending pods", dataSource=DS, gridPos=_pos(12, 0, 6, 4), colorMode="background",
             thresholds=[{"color": "green", "value": None}, {"color": "orange", "value": 1}],
             targets=[_t(f'sum(nws_workload_pods{{{sel}, phase="Pending"}})')]),
        Stat(title="Pods without a workload", dataSource=DS, gridPos=_pos(18, 0, 6, 4),
             targets=[_t("sum(nws_pods_without_workload)")]),
        BarGauge(title="Top $top workloads by pods", dataSource=DS, gridPos=_pos(0, 4, 12, 12), displayMode="basic",
                 orientation="horizontal", min=0,
                 targets=[_t(f"topk($top, sum by (namespace, workload, kind) (nws_workload_pods{{{sel}}}))",
                             "{{namespace}}/{{workload}} ({{kind}})", instant=True)]),
        Table(title="Node groups each workload uses (distinct nodes)", dataSource=DS, gridPos=_pos(12, 4, 12, 12),
              targets=[_t(f"sum by (namespace, workload, kind, summarizer, group) (nws_workload_nodes{{{sel}}})",
                          instant=True, fmt="table")],
              transformations=[{"id": "organize", "options": {"excludeByName": {"Time": True},
                                                              "renameByName": {"Value": "Nodes"}}}]),
        TimeSeries(title="Pods by workload", dataSource=DS, gridPos=_pos(0, 16, 12, 9), unit="short",
                   targets=[_t(f"topk($top, sum by (namespace, workload, kind) (nws_workload_pods{{{sel}}}))",
                               "{{namespace}}/{{workload}}")]),
        TimeSeries(title="Pending and failed pods by workload", dataSource=DS, gridPos=_pos(12, 16, 12, 9),
                   unit="short",
                   targets=[_t(f'sum by (namespace, workload, phase) (nws_workload_pods{{{sel}, '
                               f'phase=~"Pending|Failed"}}) > 0', "{{namespace}}/{{workload}} {{phase}}")]),
    ]
    top = Template(name="top", label="Top N", query="10,20,50", type="custom", default="10")
    return _dashboard("nws-workloads", "Workloads", panels, [
        _var("namespace", "label_values(nws_workload_pods, namespace)", "Namespace"),
        _var("kind", "label_values(nws_workload_pods, kind)", "Kind"), top,
    ], "Root workloads (Deployments, JobSets, LeaderWorkerSets, ...): pods and the node groups they use.")


def exporter_health() -> Dashboard:
    job = 'job=~"$job"'
    panels = [
        Stat(title="Targets up", dataSource=DS, gridPos=_pos(0, 0, 6, 4), targets=[_t(f"sum(up{{{job}}})")]),
        Stat(title="Initial sync", dataSource=DS, gridPos=_pos(6, 0, 6, 4), format="s",
             targets=[_t(f"max(nws_initial_sync_duration_seconds{{{job}}})")]),
        Stat(title="Leader", dataSource=DS, gridPos=_pos(12, 0, 6, 4),
             targets=[_t(f"max by (instance) (nws_reconciler_leader{{{job}}})", "{{instance}}")]),
        Stat(title="Workloads folded into other", dataSource=DS, gridPos=_pos(18, 0, 6, 4),
             targets=[_t(f"max(nws_workload_series_overflow{{{job}}})")]),
        TimeSeries(title="Watch events / s", dataSource=DS, gridPos=_pos(0, 4, 12, 8), unit="ops",
                   targets=[_t(f"sum by (resource, type) (rate(nws_watch_events_total{{{job}}}[$__rate_interval]))",
                               "{{resource}} {{type}}")]),
        TimeSeries(title="Sync lag: seconds since the last event", dataSource=DS, gridPos=_pos(12, 4, 12, 8), unit="s",
                   targets=[_t(f"max by (resource) (nws_watch_last_event_age_seconds{{{job}}})", "{{resource}}")]),
        TimeSeries(title="Relists and watch restarts", dataSource=DS, gridPos=_pos(0, 12, 12, 8), unit="short",
                   targets=[_t(f"sum by (resource) (increase(nws_watch_relists_total{{{job}}}[$__rate_interval]))",
                               "relist {{resource}}", "A"),
                            _t(f"sum by (resource, reason) (increase(nws_watch_restarts_total{{{job}}}"
                               f"[$__rate_interval]))", "restart {{resource}} {{reason}}", "B")]),
        TimeSeries(title="Dropped workload series", dataSource=DS, gridPos=_pos(12, 12, 12, 8), unit="short",
                   targets=[_t(f"sum(increase(nws_workload_series_dropped_total{{{job}}}[$__rate_interval]))",
                               "dropped", "A"),
                            _t(f"max(nws_workload_series_limit{{{job}}})", "limit", "B")]),
        TimeSeries(title="Scrape: render time and duration", dataSource=DS, gridPos=_pos(0, 20, 12, 8), unit="s",
                   targets=[_t(f"max by (instance) (nws_scrape_render_seconds{{{job}}})", "render {{instance}}", "A"),
                            _t(f"max by (instance) (scrape_duration_seconds{{{job}}})", "scrape {{instance}}", "B")]),
        TimeSeries(title="Reconciler writes and errors / s", dataSource=DS, gridPos=_pos(12, 20, 12, 8), unit="ops",
                   targets=[_t(f"sum by (verb) (rate(nws_reconciler_writes_total{{{job}}}[$__rate_interval]))",
                               "{{verb}}", "A"),
                            _t(f"sum by (code) (rate(nws_reconciler_write_errors_total{{{job}}}[$__rate_interval]))",
                               "error {{code}}", "B")]),
        TimeSeries(title="Memory (RSS)", dataSource=DS, gridPos=_pos(0, 28, 12, 8), unit="bytes",
                   targets=[_t(f"process_resident_memory_bytes{{{job}}}", "{{instance}}")]),
        TimeSeries(title="CPU", dataSource=DS, gridPos=_pos(12, 28, 12, 8), unit="percentunit",
                   targets=[_t(f"rate(process_cpu_seconds_total{{{job}}}[$__rate_interval])", "{{instance}}")]),
    ]
    return _dashboard("nws-health", "node-workload-summary health", panels,
                      [_var("job", "label_values(nws_build_info, job)", "Job")],
                      "Is the exporter keeping up: sync lag, events, relists, series caps, scrapes, writes.")


DASHBOARDS = {
    "node-groups.json": node_groups_overview,
    "node-group-detail.json": node_group_detail,
    "workloads.json": workloads,
    "health.json": exporter_health,
}

__all__ = ["DASHBOARDS"]
