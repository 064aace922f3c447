"""bench/ksm.py's pure parts, with no kube-state-metrics build and no cluster: the PromQL of both
sides evaluated by promtool on fixed series (one small cluster seen by two replicas of ours and
by KSM), the row-by-row agreement check on fixed Prometheus answers, the report, and the count of
a family that tells localkube/ksm.py's KSM has every object."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from alerts.replicas import LABELS
from bench.ksm import (
    KSM_FAMILIES_READ,
    Question,
    agreement,
    count_series,
    ksm_label,
    markdown,
    not_ready_nodes,
    questions,
    ratios,
    rows,
    summarise,
)
from localkube.ksm import family_count

POOL = "label_cloud_google_com_gke_nodepool"

# A small cluster: pool-a holds n1 (Ready) and n2 (NotReady), pool-b n3 (Unknown) and n4 (Ready).
# Deployment web (ReplicaSet web-abc) has pods on n1, n2, n3; StatefulSet db two pods on n4;
# Job batch one pod on n1.
NODES = {"n1": ("pool-a", "true"), "n2": ("pool-a", "false"), "n3": ("pool-b", "unknown"), "n4": ("pool-b", "true")}
PODS = {"web-1": ("ReplicaSet", "web-abc", "n1"), "web-2": ("ReplicaSet", "web-abc", "n2"),
        "web-3": ("ReplicaSet", "web-abc", "n3"), "db-0": ("StatefulSet", "db", "n4"),
        "db-1": ("StatefulSet", "db", "n4"), "batch-x": ("Job", "batch", "n1")}
KINDS = {"web": "Deployment", "db": "StatefulSet", "batch": "Job"}
NOT_READY = {"pool-a": 1, "pool-b": 1}
PODS_PER_WORKLOAD = {"web": 3, "db": 2, "batch": 1}
NODES_PER_WORKLOAD_POOL = {("web", "pool-a"): 2, ("web", "pool-b"): 1, ("db", "pool-b"): 1, ("batch", "pool-a"): 1}


def _ksm_series() -> list[dict]:
    series = []
    for node, (pool, ready) in NODES.items():
        series.append({"series": f'kube_node_labels{{node="{node}",{POOL}="{pool}"}}', "values": "1x5"})
        for status in ("true", "false", "unknown"):
            series.append({"series": f'kube_node_status_condition{{node="{node}",condition="Ready",status="{status}"}}',
                           "values": f"{int(status == ready)}x5"})
    for pod, (kind, owner, node) in PODS.items():
        series.append({"series": f'kube_pod_owner{{namespace="bench",pod="{pod}",owner_kind="{kind}",'
                                 f'owner_name="{owner}",owner_is_controller="true"}}', "values": "1x5"})
        series.append({"series": f'kube_pod_info{{namespace="bench",pod="{pod}",node="{node}",'
                                 f'created_by_kind="{kind}",created_by_name="{owner}"}}', "values": "1x5"})
    series.append({"series": 'kube_replicaset_owner{namespace="bench",replicaset="web-abc",owner_kind="Deployment",'
                             'owner_name="web",owner_is_controller="true"}', "values": "1x5"})
    return series


def _our_series() -> list[dict]:
    """What two replicas of ours serve (each series twice, one per instance)."""
    lines = []
    for pool in ("pool-a", "pool-b"):
        for condition, n in (("Ready", 2 - NOT_READY[pool]), ("NotReady", int(pool == "pool-a")),
                             ("Unknown", int(pool == "pool-b"))):
            lines.append((f'nws_nodegroup_nodes_by_condition{{summarizer="pool",group="{pool}",'
                          f'condition="{condition}"', n))
    for workload, n in PODS_PER_WORKLOAD.items():
        for phase in ("Pending", "Running"):
            lines.append((f'nws_workload_pods{{namespace="bench",workload="{workload}",kind="{KINDS[workload]}",'
                          f'phase="{phase}"', n if phase == "Running" else 0))
    for (workload, pool), n in NODES_PER_WORKLOAD_POOL.items():
        lines.append((f'nws_workload_nodes{{namespace="bench",workload="{workload}",kind="{KINDS[workload]}",'
                      f'summarizer="pool",group="{pool}"', n))
    return [{"series": f'{head},instance="{replica}"}}', "values": f"{n}x5"}
            for head, n in lines for replica in ("r1", "r2")]


def _expected(side: str) -> dict[str, list[dict]]:
    """Each question's answer, as promtool's exp_samples, for ``side`` ("ours" or "ksm")."""
    ours = side == "ours"
    group, kind = ("group", "kind") if ours else (POOL, "workload_type")
    summarizer = 'summarizer="pool",' if ours else ""
    return {
        "not_ready_per_pool": [{"labels": f'{{{summarizer}{group}="{pool}"}}', "value": n}
                               for pool, n in NOT_READY.items()],
        "pods_per_workload": [{"labels": f'{{namespace="bench",workload="{w}",{kind}="{KINDS[w]}"}}', "value": n}
                              for w, n in PODS_PER_WORKLOAD.items()],
        "nodes_per_workload_per_pool": [
            {"labels": f'{{{summarizer}namespace="bench",workload="{w}",{kind}="{KINDS[w]}",{group}="{pool}"}}',
             "value": n} for (w, pool), n in NODES_PER_WORKLOAD_POOL.items()],
    }


def test_both_sides_answer_each_question_alike_in_promtool(tmp_path: Path) -> None:
    """Each question's two queries, on the same small cluster: our answer with two replicas
    folded, KSM's through its joins, both the expected rows."""
    tests = []
    for side, series in (("ours", _our_series()), ("ksm", _ksm_series())):
        expected = _expected(side)
        tests.append({"interval": "1m", "input_series": series, "promql_expr_test": [
            {"expr": getattr(q, side), "eval_time": "3m", "exp_samples": expected[q.name]} for q in questions()]})
    path = tmp_path / "ksm.test.yaml"
    path.write_text(yaml.safe_dump({"tests": tests}, sort_keys=False))
    result = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_our_queries_fold_replicas_by_the_families_own_labels() -> None:
    for q in questions():
        for family in set(re.findall(r"\b(nws_\w+)\{", q.ours)):
            assert f"max by (cluster, {', '.join(LABELS[family])}) ({family}{{" in q.ours, (q.name, family)


def test_prometheus_stores_every_ksm_family_the_questions_read() -> None:
    for q in questions():
        assert q.ksm is not None
        used = set(re.findall(r"\b(kube_\w+)\{|\b(kube_\w+)\)", q.ksm))
        assert {name for pair in used for name in pair if name} <= set(KSM_FAMILIES_READ), q.name


def test_ksm_label_names() -> None:
    assert ksm_label("cloud.google.com/gke-nodepool") == POOL
    assert ksm_label("karpenter.sh/nodePool") == "label_karpenter_sh_node_pool"
    assert ksm_label("eks.amazonaws.com/nodegroup") == "label_eks_amazonaws_com_nodegroup"


def _answer(*series: tuple[dict[str, str], float]) -> list[dict]:
    return [{"metric": metric, "value": [1700000000.0, f"{v:g}"]} for metric, v in series]


Q = Question("pods", "pods per root workload", "", "", ("namespace", "workload", "kind"),
             ("namespace", "workload", "workload_type"))


def test_agreement_on_fixed_answers() -> None:
    ours = _answer(({"namespace": "a", "workload": "web", "kind": "Deployment", "cluster": ""}, 3),
                   ({"namespace": "a", "workload": "idle", "kind": "Deployment"}, 0))
    same = _answer(({"namespace": "a", "workload": "web", "workload_type": "Deployment"}, 3))
    assert agreement(Q, ours, same)["agree"]  # a row at 0 may be absent on the other side

    other = _answer(({"namespace": "a", "workload": "web", "workload_type": "Deployment"}, 2),
                    ({"namespace": "a", "workload": "lws-0", "workload_type": "StatefulSet"}, 4))
    a = agreement(Q, ours, other)
    assert not a["agree"]
    assert a["differ"] == [[["a", "web", "Deployment"], 3.0, 2.0]]
    assert a["only_ksm"] == [["a", "lws-0", "StatefulSet"]] and a["only_ours_count"] == 0


def test_rows_refuse_two_series_for_one_row() -> None:
    twice = _answer(({"namespace": "a", "workload": "web", "kind": "Deployment", "instance": "r1"}, 3),
                    ({"namespace": "a", "workload": "web", "kind": "Deployment", "instance": "r2"}, 3))
    try:
        rows(twice, Q.ours_key)
    except ValueError as err:
        assert "two series" in str(err)
    else:
        raise AssertionError("a replica's copy was taken for a row")


def test_summarise() -> None:
    s = summarise(_answer(({"group": "a"}, 2), ({"group": "b"}, 0), ({"group": "c"}, 5)), ("group",))
    assert s == {"rows": 3, "nonzero": 2, "sum": 7.0, "max": 5.0, "top": [["c", 5.0], ["a", 2.0], ["b", 0.0]]}


def test_counting_a_text_exposition() -> None:
    text = (b'# HELP kube_pod_info x\n# TYPE kube_pod_info gauge\nkube_pod_info{pod="a"} 1\n'
            b'kube_pod_info{pod="b"} 1\nkube_pod_owner{pod="a"} 1\n\nup 1')
    assert count_series(text) == sum(1 for line in text.split(b"\n") if line and not line.startswith(b"#")) == 4
    assert family_count(text, "kube_pod_info") == 2 and family_count(text, "kube_pod") == 0
    assert count_series(b"") == 0


def test_not_ready_nodes_are_in_some_pools_only_with_both_statuses() -> None:
    chosen = not_ready_nodes(500, 20)
    pools = {int(node.split("-")[1]) % 20 for node in chosen}
    assert pools == {0, 1, 2, 3, 4}
    assert set(chosen.values()) == {"False", "Unknown"}
    assert len(chosen) == 20  # every seventh node of 5 pools of 25


def _fake_result(nodes: int) -> dict:
    def side(scrape_bytes: int, series: int, rss: float) -> dict:
        return {"sync": {"readyz_seconds": 1.0, "complete_scrape_seconds": 2.0},
                "scrape": {"plain": {"bytes": scrape_bytes, "seconds": 0.01},
                           "gzip": {"bytes": scrape_bytes // 10, "seconds": 0.02}, "series": series},
                "peak_rss_mb": rss, "churn_cpu_seconds": 3.0}

    answer = {"total_queryable_samples": 40, "peak_samples": 120, "seconds": 0.002,
              "summary": {"nonzero": 5}}
    return {"nodes": nodes, "pods": nodes * 30, "ours": side(130_000, 1_300, 90.0),
            "ksm": side(60_000_000, 400_000, 400.0),
            "questions": [{"name": q.name, "title": q.title, "ours": answer,
                           "ksm": {**answer, "total_queryable_samples": 4000, "promql": q.ksm},
                           "agreement": {"agree": True}, "samples_ratio": 100.0} for q in questions()]}


def test_report_text() -> None:
    results = [_fake_result(500)]
    assert ratios(results[0])["scrape_bytes"] == 462
    text = markdown(results)
    assert "| 500 / 15,000 | KSM | 60.0 MB | 6.0 MB | 400,000 |" in text
    assert text.count("| yes |") == 3
