"""`kubectl nws` (node_workload_summary/kubectl.py): its printing and flags, as pure logic. The
plugin as kubectl runs it, against a control plane: tests/cluster/test_kubectl_plugin.py."""

from __future__ import annotations

import json

import pytest
import yaml

from kubeindex.model.objects import API_VERSION
from node_workload_summary import kubectl as nws


def test_render_aligns_as_kubectl_does() -> None:
    """The README's `kubectl get nodesummaries` (real kubectl output): the same cells, the same text."""
    headers = ["NAME", "NODES", "READY", "NOT READY", "CPU", "MEMORY", "GPU", "UNHEALTHY", "AGE"]
    rows = [["gke-nodepool-cpu", "4", "4", "0", "128", "512Gi", "", "4", "83s"],
            ["gke-nodepool-gpu", "4", "4", "0", "128", "512Gi", "32", "0", "83s"]]
    assert nws.render(headers, rows) == (
        "NAME               NODES   READY   NOT READY   CPU   MEMORY   GPU   UNHEALTHY   AGE\n"
        "gke-nodepool-cpu   4       4       0           128   512Gi          4           83s\n"
        "gke-nodepool-gpu   4       4       0           128   512Gi    32    0           83s\n")
    # tabwriter's minimum width (6) for narrow columns, no padding after the last, --no-headers.
    assert nws.render(["A", "B"], [["x", "y"]]) == "A     B\nx     y\n"
    assert nws.render(None, [["x", ""], ["long-name", "1"]]) == "x           \nlong-name   1\n"
    assert nws.render(["A"], []) == "A\n"


def test_table_columns_wide_and_cells() -> None:
    table = {"columnDefinitions": [{"name": "Name", "priority": 0}, {"name": "N_PODS", "priority": 0},
                                   {"name": "Placement", "priority": 1}, {"name": "Age"}],
             "rows": [{"cells": ["web", 8, "a=1", "5s"]}, {"cells": ["job", 2.0, None, True]}]}
    assert nws.table_columns(table, wide=False) == (["NAME", "N_PODS", "AGE"], [["web", "8", "5s"],
                                                                             ["job", "2", "true"]])
    assert nws.table_columns(table, wide=True)[0] == ["NAME", "N_PODS", "PLACEMENT", "AGE"]
    assert nws.table_columns(table, wide=True)[1][1] == ["job", "2", "", "true"]
    assert nws.cell_text(1.5) == "1.5" and nws.cell_text(None) == "" and nws.cell_text(False) == "false"


def test_flags_go_before_or_after_the_command() -> None:
    args = nws.parse(["workloads", "-A", "-o", "wide", "--context", "prod", "--kubeconfig", "/k"])
    assert (args.command, args.all_namespaces, args.output, args.context, args.kubeconfig) == \
        ("workloads", True, "wide", "prod", "/k")
    args = nws.parse(["--context", "prod", "-n", "ml", "workloads"])  # before: not reset by the subcommand
    assert (args.context, args.namespace, args.all_namespaces, args.output) == ("prod", "ml", False, "")
    args = nws.parse(["impact", "node/n1", "--no-headers", "-oyaml"])
    assert (args.command, args.target, args.no_headers, args.output) == ("impact", "node/n1", True, "yaml")
    with pytest.raises(SystemExit):
        nws.parse(["workloads", "-o", "custom-columns=X"])
    with pytest.raises(SystemExit):
        nws.parse(["impact"])


def test_help_names_the_commands_and_kubectls_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        nws.parse(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for word in ("workloads", "pools", "impact", "--context", "--kubeconfig", "--all-namespaces", "--namespace",
                 "--output", "kubectl nws impact pool/", "kubectl get wls -A", "kubectl get nws -A"):
        assert word in text, word


def test_impact_targets_and_pools() -> None:
    assert nws.parse_target("pool/gpu") == ("pool", "gpu")
    assert nws.parse_target("nodesummary/gke-nodepool-gpu") == ("pool", "gke-nodepool-gpu")
    assert nws.parse_target("node/n-1") == ("node", "n-1") == nws.parse_target("no/n-1")
    for bad in ("gpu", "pod/x", "pool/", "node/a/b"):
        with pytest.raises(nws.Failed, match="pool/NAME"):
            nws.parse_target(bad)
    summaries = [{"metadata": {"name": "np-gpu"}, "spec": {"selector": {"matchLabels": {"pool": "gpu"}}}},
                 {"metadata": {"name": "zone-a"}, "spec": {"selector": {"matchLabels": {"zone": "a"}}}},
                 {"metadata": {"name": "gpu"}, "spec": {"selector": {"matchLabels": {"rack": "gpu"}}}}]
    assert nws.pools_of(summaries, "gpu") == ["gpu"]  # a NodeSummary's name first
    assert nws.pools_of(summaries, "a") == ["zone-a"]  # else the label value
    assert nws.pools_of(summaries, "b") == []
    assert nws.pools_of_node(summaries, {"pool": "gpu", "zone": "a"}) == ["np-gpu", "zone-a"]
    assert nws.pools_of_node(summaries, {"pool": "cpu"}) == []


def _summary(namespace: str, name: str, refs: list[dict], pods: int = 1, unhealthy: int = 0) -> dict:
    return {"metadata": {"namespace": namespace, "name": name},
            "status": {"podCount": pods, "shortType": "deploy", "podsOnUnhealthyNodes": unhealthy,
                       "nodeSummaryRefs": refs}}


def test_impact_orders_by_unhealthy_nodes_then_nodes() -> None:
    items = [_summary("a", "small", [{"name": "p", "nodeCount": 1}]),
             _summary("a", "big", [{"name": "p", "nodeCount": 5}, {"name": "q", "nodeCount": 1}], pods=9),
             _summary("b", "hurt", [{"name": "p", "nodeCount": 2, "unhealthyNodeCount": 1}], unhealthy=3),
             _summary("b", "elsewhere", [{"name": "q", "nodeCount": 4}])]
    hits = nws.impacted(items, ["p"])
    assert [h[0]["metadata"]["name"] for h in hits] == ["hurt", "big", "small"]
    headers, rows = nws.impact_rows(hits, wide=False)
    assert headers == nws.IMPACT_HEADERS
    assert rows[0] == ["b", "hurt", "deploy", "p", "2", "1", "1", "3"]
    assert rows[1] == ["a", "big", "deploy", "p", "5", "0", "9", "0"]
    assert len(nws.impact_rows(hits, wide=True)[0]) == len(nws.IMPACT_HEADERS) + 2


def test_lists_print_as_kubectls() -> None:
    listed = nws.as_list([{"metadata": {"name": "x"}}], nws.WORKLOADS)
    assert listed == {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
                      "items": [{"apiVersion": API_VERSION, "kind": "WorkloadSummary", "metadata": {"name": "x"}}]}
    assert yaml.safe_load(nws.dump(listed, "yaml")) == json.loads(nws.dump(listed, "json")) == listed
    assert nws.object_name(nws.POOLS, "p") == "nodesummary.ux.sean.example.com/p"
    assert nws.nothing_found("ml") == "No resources found in ml namespace."
    assert nws.nothing_found("") == "No resources found"
