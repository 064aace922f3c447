"""node-workload-summary beside kube-state-metrics (KSM), on one populated control plane, in one
run: what each costs (scrape, sync, memory, CPU under pod churn) and what answering the same three
questions costs in a real Prometheus scraping both.

Per size (30 pods per node by default, 20 node pools, a Deployment per 50 pods, plus a few
StatefulSets and Jobs whose pods have them as direct owners):

1. populate the control plane (bench/populate.py), make some nodes NotReady (and a few Unknown);
2. start the service (exporter + reconciler; a NodeSummarizer on the pool label, a
   WorkloadSummarizer for Deployments, StatefulSets and Jobs), then KSM
   (`--resources=nodes,pods,deployments,replicasets,statefulsets,jobs`,
   `--metric-labels-allowlist=nodes=[<pool label>]`, `--enable-gzip-encoding`): time to ready
   (ours: /readyz; KSM's /readyz only says its self-metrics registry is not empty, so its sync is
   the time to a first complete scrape: every node, pod and owner object in it);
3. each /metrics scraped 3 times plain and 3 times with `Accept-Encoding: gzip`: bytes, series,
   median time;
4. once ours has written its first summaries, Prometheus scraping both every --scrape-interval;
   pod churn for --churn-seconds (phase flips,
   as bench/scale.py does): each process's CPU seconds (utime + stime from /proc), and the
   summary writes ours made meanwhile. A second instance of ours, `--no-reconciler` (metrics
   only: KSM's job), scraped by the same Prometheus, runs beside through the churn: what the
   exporter alone costs per event;
5. the three questions, ours and KSM's PromQL, each run --query-runs times at one instant with
   `stats=all`: result, agreement (row by row), median time, samples touched;
6. peak RSS (VmHWM) of both.

Writes bench/results/ksm.{json,md,png} (`--out` puts them elsewhere). Heavy sizes take the bench
lock:

    flock /tmp/nws-bench.lock python -m bench.ksm --nodes 500 2000 5000
    python -m bench.ksm --nodes 50 --churn-seconds 20 --scrape-interval 5s --out /tmp/ksm-small.json
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import re
import statistics
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from alerts.replicas import CLUSTER, one
from kubeindex.client.api import ApiClient, load_connection
from kubeindex.model.resources import NODES, PODS, WORKLOAD_SUMMARIZERS
from localkube.build import KUBE_STATE_METRICS
from localkube.cluster import LocalCluster, Options
from localkube.ksm import RESOURCES, KubeStateMetrics, build
from localkube.prometheus import Prometheus
from localkube.service import Service, parse, select, value, wait_for

from .common import CRDS, add_out, cpu_seconds, say, status_kb, writes, writes_settled
from .plot import pyplot
from .populate import POOL_LABEL, churn, create, pod_manifest, populate, run_all

SUMMARIZER = "pool"
# The KSM families the questions read.
KSM_FAMILIES_READ = ("kube_node_labels", "kube_node_status_condition", "kube_pod_owner", "kube_replicaset_owner",
                     "kube_pod_info")  # bench/populate.py's NodeSummarizer on POOL_LABEL


# ---------------------------------------------------------------------------------------------
# The questions: pure, unit-tested (tests/unit/test_bench_ksm.py)


def ksm_label(key: str) -> str:
    """The Prometheus label KSM gives a Kubernetes label key in `kube_<resource>_labels`
    (internal/store/utils.go: invalid characters to `_`, camelCase to snake_case, `label_`)."""
    sanitized = re.sub(r"[^a-zA-Z0-9_]", "_", key)
    return "label_" + re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", sanitized).lower()


@dataclass(frozen=True)
class Question:
    name: str
    title: str
    ours: str  # PromQL on our families, replicas folded as alerts/rules.py does
    ksm: str | None  # PromQL on KSM's families; None where KSM cannot answer
    ours_key: tuple[str, ...]  # the labels naming a row of each answer, in the same order
    ksm_key: tuple[str, ...]
    ksm_cannot: str = ""  # why, where ksm is None


def ksm_pod_workload() -> str:
    """One series per pod and root workload, from KSM: a ReplicaSet's pods joined through
    kube_replicaset_owner to their Deployment (kubernetes-mixin's recording rule, two hops),
    StatefulSets' and Jobs' pods by their direct owner (one hop). Deeper chains (an LWS worker:
    four hops) need another join per hop and kind; KSM has no owner series for custom kinds."""
    deployment = (
        'label_replace(kube_pod_owner{owner_kind="ReplicaSet"}, "replicaset", "$1", "owner_name", "(.*)")'
        " * on (namespace, replicaset) group_left (owner_name) topk by (namespace, replicaset) "
        '(1, max by (namespace, replicaset, owner_name) (kube_replicaset_owner{owner_kind="Deployment"}))'
    )
    deployment = (f'label_replace(label_replace({deployment}, "workload", "$1", "owner_name", "(.*)"), '
                  '"workload_type", "Deployment", "", "")')
    direct = ('label_replace(label_replace(kube_pod_owner{owner_kind=~"StatefulSet|Job"}, '
              '"workload", "$1", "owner_name", "(.*)"), "workload_type", "$1", "owner_kind", "(.*)")')
    return f"max by (namespace, workload, workload_type, pod) ({deployment} or {direct})"


def questions(pool_label: str = POOL_LABEL, summarizer: str = SUMMARIZER, cluster: str = CLUSTER) -> list[Question]:
    pool = ksm_label(pool_label)
    node_pool = f"max by (node, {pool}) (kube_node_labels)"
    not_ready = one("nws_nodegroup_nodes_by_condition", f'summarizer="{summarizer}", condition!="Ready"', cluster)
    pods = one("nws_workload_pods", 'workload!="other"', cluster)
    per_pod = ksm_pod_workload()
    return [
        Question(
            "not_ready_per_pool", "NotReady (or Unknown) nodes per pool",
            f"sum by ({cluster}, summarizer, group) ({not_ready})",
            # kubernetes-mixin's KubeNodeNotReady reads status="true" == 0: one series per node
            # (status=~"false|unknown" would read two).
            f"sum by ({pool}) ("
            '(1 - max by (node) (kube_node_status_condition{condition="Ready", status="true"}))'
            f" * on (node) group_left ({pool}) {node_pool})",
            ("group",), (pool,),
        ),
        Question(
            "pods_per_workload", "pods per root workload",
            f"sum by ({cluster}, namespace, workload, kind) ({pods})",
            f"count by (namespace, workload, workload_type) ({per_pod})",
            ("namespace", "workload", "kind"), ("namespace", "workload", "workload_type"),
        ),
        Question(
            "nodes_per_workload_per_pool", "distinct nodes per workload per pool",
            one("nws_workload_nodes", f'summarizer="{summarizer}", workload!="other"', cluster),
            f"count by (namespace, workload, workload_type, {pool}) ("
            f"count by (namespace, workload, workload_type, node, {pool}) ({per_pod}"
            ' * on (namespace, pod) group_left (node) max by (namespace, pod, node) (kube_pod_info{node!=""})'
            f" * on (node) group_left ({pool}) {node_pool}))",
            ("namespace", "workload", "kind", "group"), ("namespace", "workload", "workload_type", pool),
        ),
    ]


def rows(result: list[dict], key: tuple[str, ...]) -> dict[tuple[str, ...], float]:
    """A Prometheus instant vector as {row key: value}; two series with one key are an error."""
    out: dict[tuple[str, ...], float] = {}
    for series in result:
        k = tuple(series["metric"].get(label, "") for label in key)
        if k in out:
            raise ValueError(f"two series for {dict(zip(key, k, strict=True))}")
        out[k] = float(series["value"][1])
    return out


def agreement(question: Question, ours: list[dict], ksm: list[dict]) -> dict:
    """Row by row: the same keys with the same values. Rows at 0 on one side may be absent on
    the other (a family emitted only while non-zero, an inner join that found nothing)."""
    a, b = rows(ours, question.ours_key), rows(ksm, question.ksm_key)
    a_nz = {k: v for k, v in a.items() if v}
    b_nz = {k: v for k, v in b.items() if v}
    only_ours = sorted(set(a_nz) - set(b_nz))
    only_ksm = sorted(set(b_nz) - set(a_nz))
    differ = sorted(k for k in set(a_nz) & set(b_nz) if a_nz[k] != b_nz[k])
    return {
        "agree": not (only_ours or only_ksm or differ),
        "rows_ours": len(a), "rows_ksm": len(b), "nonzero_rows": len(a_nz),
        "only_ours": [list(k) for k in only_ours[:5]], "only_ours_count": len(only_ours),
        "only_ksm": [list(k) for k in only_ksm[:5]], "only_ksm_count": len(only_ksm),
        "differ": [[list(k), a_nz[k], b_nz[k]] for k in differ[:5]], "differ_count": len(differ),
    }


def summarise(result: list[dict], key: tuple[str, ...]) -> dict:
    """A few numbers about an answer: rows, non-zero rows, sum, max, the three largest rows."""
    r = rows(result, key)
    top = sorted(r.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return {"rows": len(r), "nonzero": sum(1 for v in r.values() if v), "sum": sum(r.values()),
            "max": max(r.values(), default=0), "top": [["/".join(k), v] for k, v in top]}


def count_series(text: bytes) -> int:
    """Sample lines of a text exposition (neither comments nor blank lines), without splitting
    hundreds of megabytes into lines."""
    if not text:
        return 0
    lines = text.count(b"\n") + (0 if text.endswith(b"\n") else 1)
    comments = text.count(b"\n#") + text.startswith(b"#")
    blanks = text.count(b"\n\n") + text.startswith(b"\n")
    return lines - comments - blanks


# ---------------------------------------------------------------------------------------------
# Measuring


def fetch(url: str, gzipped: bool = False, timeout: float = 600) -> tuple[float, bytes, str]:
    """Seconds to the last byte, the body as it came (compressed or not), its Content-Encoding."""
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzipped else {})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        body = resp.read()
        encoding = resp.headers.get("Content-Encoding", "")
    return time.perf_counter() - started, body, encoding


def scrape_cost(url: str, runs: int = 3) -> dict:
    """Bytes, series and median time of /metrics, plain and with Accept-Encoding: gzip."""
    out: dict = {}
    for mode in ("plain", "gzip"):
        times, body, encoding = [], b"", ""
        for _ in range(runs):
            seconds, body, encoding = fetch(url, gzipped=mode == "gzip")
            times.append(seconds)
        text = gzip.decompress(body) if encoding == "gzip" else body
        out[mode] = {"bytes": len(body), "seconds": round(statistics.median(times), 4),
                     "encoding": encoding or "identity", "series": count_series(text)}
    out["series"] = out["plain"]["series"]
    return out


def ksm_sync(ksm: KubeStateMetrics, expected: dict[str, int], timeout: float = 1800) -> dict:
    """Start KSM; the seconds to /readyz 200 (telemetry port) and to the end of its first
    complete scrape, scraping back to back."""
    started = time.monotonic()
    ksm.start()
    readyz = None
    seen: dict[str, int] = {}
    while time.monotonic() - started < timeout:
        if not ksm.running():
            raise RuntimeError(f"kube-state-metrics exited:\n{ksm.log_tail()}")
        if readyz is None and ksm.ready():
            readyz = time.monotonic() - started
        done, seen = ksm.complete(expected)
        if done:
            return {"readyz_seconds": round(readyz if readyz is not None else time.monotonic() - started, 2),
                    "complete_scrape_seconds": round(time.monotonic() - started, 2)}
        time.sleep(0.2)
    raise RuntimeError(f"kube-state-metrics showed {seen}, not {expected}, within {timeout}s")


def service_sync(svc: Service, timeout: float = 1800) -> dict:
    started = time.monotonic()
    svc.start(ready=False)
    wait_for(lambda: svc.get("/readyz")[0] == 200, timeout=timeout, interval=0.05)
    ready = time.monotonic() - started
    return {"readyz_seconds": round(ready, 2),
            "initial_sync_seconds": value(parse(svc.get("/metrics")[1]), "nws_initial_sync_duration_seconds")}


def not_ready_nodes(nodes: int, groups: int) -> dict[str, str]:
    """{node: Ready status} for the nodes made not Ready: in a quarter of the pools (at least
    one), every seventh node; one in three of them Unknown, the rest False."""
    pools = max(1, groups // 4)
    chosen = [i for i in range(nodes) if i % groups < pools and (i // groups) % 7 == 0]
    return {f"node-{i:05d}": "Unknown" if k % 3 == 2 else "False" for k, i in enumerate(chosen)}


async def _direct_workloads(api: ApiClient, nodes: int, kinds: dict[str, int], pods_each: int, first_pod: int,
                            concurrency: int = 64) -> int:
    """StatefulSets and Jobs, ``kinds[kind]`` of each, with ``pods_each`` pods owned directly;
    pod p goes to node p % nodes (p from ``first_pod``). Returns the pods made."""
    owners: list[tuple[str, str, dict]] = []  # (api version, kind, object)

    async def make(kind: str, i: int) -> None:
        name = f"{kind.lower()}-{i}"
        template: dict[str, Any] = {"metadata": {"labels": {"app": name}},
                                    "spec": {"containers": [{"name": "c", "image": "x"}], "restartPolicy": "Never"}}
        if kind == "StatefulSet":
            template["spec"].pop("restartPolicy")
            body = {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name},
                    "spec": {"selector": {"matchLabels": {"app": name}}, "serviceName": name,
                             "replicas": pods_each, "template": template}}
            owners.append(("apps/v1", kind, await create(api, "/apis/apps/v1/namespaces/bench/statefulsets", body)))
        else:
            body = {"apiVersion": "batch/v1", "kind": kind, "metadata": {"name": name},
                    "spec": {"parallelism": pods_each, "completions": pods_each, "template": template}}
            owners.append(("batch/v1", kind, await create(api, "/apis/batch/v1/namespaces/bench/jobs", body)))

    await run_all([partial(make, k, i) for k, n in kinds.items() for i in range(n)], concurrency, "owners")
    owners.sort(key=lambda o: o[2]["metadata"]["name"])

    def make_pod(p: int, owner: tuple[str, str, dict], k: int) -> Awaitable[dict]:
        version, kind, obj = owner
        name = obj["metadata"]["name"]
        manifest = pod_manifest(f"{name}-{k}", f"node-{p % nodes:05d}", obj, name)
        manifest["metadata"]["ownerReferences"][0] |= {"apiVersion": version, "kind": kind}
        return create(api, PODS.path("bench"), manifest)

    tasks = []
    p = first_pod
    for owner in owners:
        for k in range(pods_each):
            tasks.append(lambda p=p, owner=owner, k=k: make_pod(p, owner, k))
            p += 1
    await run_all(tasks, concurrency, "pods of StatefulSets and Jobs")
    return len(tasks)


def setup(cluster: LocalCluster, size: dict) -> dict:
    """Populate; configure the WorkloadSummarizer for Deployments, StatefulSets and Jobs; make
    the chosen nodes not Ready. Returns what KSM's complete scrape must show."""
    nodes, groups = size["nodes"], size["groups"]
    direct_pods = sum(size["direct"].values()) * size["direct_pods_each"]

    async def run() -> None:
        async with ApiClient(load_connection(str(cluster.kubeconfig)), max_connections=64) as api:
            await populate(api, nodes, groups, size["pods"] - direct_pods, size["deployments"])
            await _direct_workloads(api, nodes, size["direct"], size["direct_pods_each"], size["pods"] - direct_pods)

    started = time.monotonic()
    asyncio.run(run())
    size["populate_seconds"] = round(time.monotonic() - started)
    cluster.request(WORKLOAD_SUMMARIZERS.path(name="apps"), "PATCH", {"spec": {"workloadTypes": [
        {"group": "apps", "kind": "Deployment"}, {"group": "apps", "kind": "StatefulSet"},
        {"group": "batch", "kind": "Job"}]}}, content_type="application/merge-patch+json")
    for node, status in size["not_ready"].items():
        cluster.request(NODES.path(name=node, subresource="status"), "PATCH",
                        {"status": {"conditions": [{"type": "Ready", "status": status, "reason": "Bench"}]}},
                        content_type="application/strategic-merge-patch+json")
    return {"kube_node_info": nodes, "kube_pod_info": size["pods"], "kube_deployment_created": size["deployments"],
            "kube_replicaset_created": size["deployments"], "kube_statefulset_created": size["direct"]["StatefulSet"],
            "kube_job_created": size["direct"]["Job"]}


def query(prom: Prometheus, expr: str, at: float, runs: int) -> dict:
    """An instant query at ``at``, ``runs`` times: the result, the median wall time, and the
    engine's stats (samples touched; its own timings) from the last run."""
    params = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}", "stats": "all"})
    times, data = [], {}
    for _ in range(runs):
        started = time.perf_counter()
        with urllib.request.urlopen(f"{prom.url}/api/v1/query?{params}", timeout=600) as resp:
            data = json.loads(resp.read())["data"]
        times.append(time.perf_counter() - started)
    stats = data.get("stats", {})
    samples, timings = stats.get("samples", {}), stats.get("timings", {})
    return {"result": data["result"], "seconds": round(statistics.median(times), 4),
            "eval_seconds": timings.get("evalTotalTime"),
            "total_queryable_samples": samples.get("totalQueryableSamples"),
            "peak_samples": samples.get("peakSamples")}


def prometheus_for(cluster: LocalCluster, svc: Service, ksm: KubeStateMetrics, interval: str,
                   exporter: Service) -> Prometheus:
    """One Prometheus scraping both (and the metrics-only instance of ours, kept apart: a job of
    its own, none of its series stored), at one interval; each scrape may take the whole interval."""
    ksm_job = {"job_name": "kube-state-metrics", "honor_labels": True, "scrape_timeout": interval,
               "static_configs": [{"targets": [f"127.0.0.1:{ksm.port}"]}],
               # Stored: only the families the questions read (Prometheus still receives and
               # parses every line), so that 150,000 pods' worth fits in this machine's memory.
               "metric_relabel_configs": [{"source_labels": ["__name__"], "action": "keep",
                                           "regex": "|".join(KSM_FAMILIES_READ)}]}
    exporter_job = {"job_name": EXPORTER_JOB, "scrape_timeout": interval,
                    "static_configs": [{"targets": [f"127.0.0.1:{exporter.port}"]}],
                    "metric_relabel_configs": [{"source_labels": ["__name__"], "action": "drop", "regex": ".+"}]}
    prom = Prometheus(cluster.workdir / "prometheus", [f"127.0.0.1:{svc.port}"], [], interval=interval,
                      honor_labels=True, extra_jobs=[ksm_job, exporter_job])
    return prom.start()


EXPORTER_JOB = "node-workload-summary-metrics-only"


def scraped(prom: Prometheus, job: str, at: float, window: str) -> dict:
    """Prometheus's own view of a job's scrapes: how many in ``window`` succeeded, the last one's
    duration and samples."""
    def one_value(expr: str) -> float | None:
        result = prom.api("/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"}))["result"]
        return float(result[0]["value"][1]) if result else None

    sel = f'{{job="{job}"}}'
    return {"scrapes_ok": one_value(f"sum_over_time(up{sel}[{window}])"),
            "scrapes": one_value(f"count_over_time(up{sel}[{window}])"),
            "last_scrape_seconds": one_value(f"scrape_duration_seconds{sel}"),
            "last_scrape_samples": one_value(f"scrape_samples_scraped{sel}")}


def measure_size(nodes: int, args: argparse.Namespace) -> dict:
    pods = nodes * args.pods_per_node
    direct_each = args.direct_pods_each
    direct = {"StatefulSet": max(1, pods // 1000), "Job": max(1, pods // 1000)}
    size: dict = {"nodes": nodes, "pods": pods, "groups": args.groups, "direct": direct,
                  "direct_pods_each": direct_each}
    # As many Deployments as bench/scale.py makes (pod p of Deployment p % D on node p % nodes: with
    # 20 pools each Deployment's pods are in one pool); the pods of StatefulSets and Jobs are part
    # of the 30 per node, each of those spread over as many pools as it has pods.
    size["deployments"] = args.deployments or max(1, pods // args.pods_per_workload)
    size["workloads"] = size["deployments"] + sum(direct.values())
    size["not_ready"] = not_ready_nodes(nodes, args.groups)
    result: dict = {k: v for k, v in size.items() if k != "not_ready"} | {"not_ready_nodes": len(size["not_ready"])}
    options = Options(controller_manager=False, extra_apiserver_args=["--max-requests-inflight=4000"])
    with LocalCluster(options) as cluster:
        cluster.install_crds(CRDS)
        say(f"{nodes} nodes / {pods} pods / {result['workloads']} workloads: populating ...")
        expected = setup(cluster, size)
        result["populate_seconds"] = size["populate_seconds"]
        say(f"populated in {size['populate_seconds']} s; {len(size['not_ready'])} nodes not Ready; "
            "starting the service ...")
        svc = Service(cluster)
        exporter = Service(cluster, args=("--no-reconciler",))
        ksm = KubeStateMetrics(cluster, node_labels=(POOL_LABEL,))
        prom = None
        try:
            ours: dict = {"sync": service_sync(svc)}
            say(f"service ready: {ours['sync']}; starting kube-state-metrics ...")
            theirs: dict = {"sync": ksm_sync(ksm, expected)}
            say(f"kube-state-metrics complete: {theirs['sync']}")
            assert svc.proc is not None
            pids = {"ours": svc.proc.pid, "ksm": ksm.pid}
            wait_for(lambda: sum(select(parse(svc.get("/metrics")[1]), "nws_nodegroup_pods").values()) == pods,
                     timeout=600, interval=1)
            say("scrape costs ...")
            ours["scrape"] = scrape_cost(svc.metrics_url, args.scrape_runs)
            theirs["scrape"] = scrape_cost(ksm.metrics_url, args.scrape_runs)
            say(f"ours {ours['scrape']}; kube-state-metrics {theirs['scrape']}")
            exporter_sync = service_sync(exporter)
            assert exporter.proc is not None
            pids["exporter"] = exporter.proc.pid
            say(f"the metrics-only instance of ours ready: {exporter_sync}")
            # The first summaries (an apply and a status apply each, at --writes-per-second) are
            # not the churn's cost: at 5,000 nodes they take about two minutes.
            ours["first_summaries_seconds"] = round(writes_settled(svc, args.groups + size["workloads"]), 1)
            say(f"the first summaries written ({ours['first_summaries_seconds']} s)")
            prom = prometheus_for(cluster, svc, ksm, args.scrape_interval, exporter)
            say(f"Prometheus scraping both every {args.scrape_interval}; churn for {args.churn_seconds:.0f} s ...")
            _, listed = cluster.request(f"{PODS.path('bench')}?limit=2000")
            assert isinstance(listed, dict)
            pod_names = [item["metadata"]["name"] for item in listed["items"]]
            cpu0 = {k: cpu_seconds(pid) for k, pid in pids.items()}
            writes0, t0 = writes(svc), time.monotonic()

            async def churn_pods() -> int:
                async with ApiClient(load_connection(str(cluster.kubeconfig)), max_connections=64) as api:
                    return await churn(api, pod_names, args.churn_seconds)

            updates = asyncio.run(churn_pods())
            elapsed = time.monotonic() - t0
            ours["churn_writes"] = round(writes(svc) - writes0)
            metrics_only: dict = {}
            for side, k in ((ours, "ours"), (theirs, "ksm"), (metrics_only, "exporter")):
                side["churn_cpu_seconds"] = round(cpu_seconds(pids[k]) - cpu0[k], 2)
                # Each update is one pod watch event to each side (and its scrapes meanwhile).
                side["churn_cpu_ms_per_1000_events"] = round(side["churn_cpu_seconds"] / max(updates, 1) * 1e6, 1)
            ours["metrics_only"] = metrics_only
            result["churn"] = {"seconds": round(elapsed, 1), "api_updates": updates,
                               "api_updates_per_second": round(updates / elapsed)}
            say(f"churn: {result['churn']}; ours {ours['churn_cpu_seconds']} CPU s ({ours['churn_writes']} "
                f"writes; metrics only: {metrics_only['churn_cpu_seconds']}), "
                f"kube-state-metrics {theirs['churn_cpu_seconds']} CPU s")
            interval = _seconds(args.scrape_interval)
            time.sleep(3 * interval)  # a few scrapes of the settled state
            at = time.time()
            window = f"{int(3 * interval) + 1}s"
            ours["prometheus"] = scraped(prom, "node-workload-summary", at, window)
            theirs["prometheus"] = scraped(prom, "kube-state-metrics", at, window)
            say(f"Prometheus: ours {ours['prometheus']}; kube-state-metrics {theirs['prometheus']}")
            result["questions"] = ask(prom, at, args.query_runs)
            for side, pid in ((ours, pids["ours"]), (theirs, pids["ksm"])):
                side["peak_rss_mb"] = round(status_kb(pid, "VmHWM") / 1024, 1)
            result["ours"], result["ksm"] = ours, theirs
        finally:
            if prom is not None:
                prom.stop()
            ksm.stop()
            exporter.stop()
            svc.stop()
    return result


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", duration)
    if not match:
        raise ValueError(f"not a duration: {duration}")
    return float(match.group(1)) * units[match.group(2)]


def ask(prom: Prometheus, at: float, runs: int) -> list[dict]:
    answers = []
    for q in questions():
        say(f"question: {q.title} ...")
        ours = query(prom, q.ours, at, runs)
        entry: dict = {"name": q.name, "title": q.title,
                       "ours": {"promql": q.ours, **{k: v for k, v in ours.items() if k != "result"},
                                "summary": summarise(ours["result"], q.ours_key)}}
        if q.ksm is None:
            entry["ksm"] = {"promql": None, "cannot": q.ksm_cannot}
        else:
            theirs = query(prom, q.ksm, at, runs)
            entry["ksm"] = {"promql": q.ksm, **{k: v for k, v in theirs.items() if k != "result"},
                            "summary": summarise(theirs["result"], q.ksm_key)}
            entry["agreement"] = agreement(q, ours["result"], theirs["result"])
            if ours["total_queryable_samples"]:
                entry["samples_ratio"] = round(theirs["total_queryable_samples"] / ours["total_queryable_samples"], 1)
        say(json.dumps({k: v for k, v in entry.items() if k in ("name", "agreement", "samples_ratio")}))
        answers.append(entry)
    return answers


# ---------------------------------------------------------------------------------------------
# Report


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n / 1e3:,.0f} KB"


def ratios(r: dict) -> dict:
    o, k = r["ours"], r["ksm"]
    out = {"scrape_bytes": round(k["scrape"]["plain"]["bytes"] / o["scrape"]["plain"]["bytes"]),
           "scrape_gzip_bytes": round(k["scrape"]["gzip"]["bytes"] / o["scrape"]["gzip"]["bytes"]),
           "series": round(k["scrape"]["series"] / o["scrape"]["series"]),
           "peak_rss": round(k["peak_rss_mb"] / o["peak_rss_mb"], 1)}
    if "churn_cpu_ms_per_1000_events" in o:  # runs before it was reported have the seconds only
        out["churn_cpu"] = round(k["churn_cpu_ms_per_1000_events"] / o["churn_cpu_ms_per_1000_events"], 1)
    for q in r["questions"]:
        if "samples_ratio" in q:
            out[f"samples_{q['name']}"] = q["samples_ratio"]
    return out


def _per_event(side: dict) -> str:
    per = side.get("churn_cpu_ms_per_1000_events")
    return "" if per is None else f" ({per:,.0f} ms)"


def churn_table(results: list[dict]) -> list[str]:
    """CPU per 1,000 pod events under churn: ours as shipped (its summary writes made meanwhile),
    ours metrics only, KSM (runs before the metrics-only instance have no table)."""
    runs = [r for r in results if "metrics_only" in r["ours"]]
    if not runs:
        return []
    lines = ["", "| nodes / pods | pod updates | ours: CPU s (ms per 1,000 pod events), summary writes | "
             "ours, metrics only | KSM | KSM / ours | KSM / ours metrics only |", "|---|---|---|---|---|---|---|"]
    for r in runs:
        o, m, k = r["ours"], r["ours"]["metrics_only"], r["ksm"]
        per = [side["churn_cpu_ms_per_1000_events"] for side in (o, m, k)]
        lines.append(f"| {r['nodes']:,} / {r['pods']:,} | {r['churn']['api_updates']:,} | "
                     f"{o['churn_cpu_seconds']} ({per[0]:,.0f} ms), {o['churn_writes']:,} | "
                     f"{m['churn_cpu_seconds']} ({per[1]:,.0f} ms) | {k['churn_cpu_seconds']} ({per[2]:,.0f} ms) | "
                     f"{per[2] / per[0]:.1f}x | {per[2] / per[1]:.1f}x |")
    return lines


def markdown(results: list[dict]) -> str:
    lines = ["| nodes / pods | | /metrics plain | gzip | series | scrape time plain / gzip | ready | "
             "peak RSS | CPU s in churn (ms per 1,000 pod events) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for name, side in (("ours", r["ours"]), ("KSM", r["ksm"])):
            s = side["scrape"]
            ready = (f"{side['sync']['readyz_seconds']} s (/readyz)" if name == "ours" else
                     f"{side['sync']['complete_scrape_seconds']} s (first complete scrape; "
                     f"/readyz {side['sync']['readyz_seconds']} s)")
            lines.append(f"| {r['nodes']:,} / {r['pods']:,} | {name} | {_mb(s['plain']['bytes'])} | "
                         f"{_mb(s['gzip']['bytes'])} | {s['series']:,} | "
                         f"{s['plain']['seconds'] * 1000:,.0f} / {s['gzip']['seconds'] * 1000:,.0f} ms | {ready} | "
                         f"{side['peak_rss_mb']} MB | {side['churn_cpu_seconds']}{_per_event(side)} |")
        rt = ratios(r)
        lines.append(f"| | KSM / ours | {rt['scrape_bytes']}x | {rt['scrape_gzip_bytes']}x | {rt['series']}x | | | "
                     f"{rt['peak_rss']}x | {str(rt['churn_cpu']) + 'x' if 'churn_cpu' in rt else ''} |")
    lines += churn_table(results)
    lines += ["", "| nodes | question | samples touched ours / KSM (ratio) | peak samples ours / KSM | "
              "query time ours / KSM | rows ours / KSM | agree |", "|---|---|---|---|---|---|---|"]
    for r in results:
        for q in r["questions"]:
            o, k = q["ours"], q["ksm"]
            if k.get("promql") is None:
                lines.append(f"| {r['nodes']:,} | {q['title']} | {o['total_queryable_samples']:,} / - | | | | "
                             f"KSM cannot: {k['cannot']} |")
                continue
            a = q["agreement"]
            agree = "yes" if a["agree"] else (f"no ({a['only_ours_count']} rows only ours, {a['only_ksm_count']} "
                                              f"only KSM, {a['differ_count']} differ)")
            lines.append(
                f"| {r['nodes']:,} | {q['title']} | {o['total_queryable_samples']:,} / "
                f"{k['total_queryable_samples']:,} ({q.get('samples_ratio', '-')}x) | {o['peak_samples']:,} / "
                f"{k['peak_samples']:,} | {o['seconds'] * 1000:,.1f} / {k['seconds'] * 1000:,.1f} ms | "
                f"{o['summary']['nonzero']:,} / {k['summary']['nonzero']:,} | {agree} |")
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    nodes = [r["nodes"] for r in results]
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    ksm_style, our_style = {"marker": "o", "linestyle": "-"}, {"marker": "s", "linestyle": "--"}
    ax = axes[0][0]
    for mode, shade in (("plain", 0), ("gzip", 1)):
        ax.plot(nodes, [r["ksm"]["scrape"][mode]["bytes"] for r in results], **ksm_style,
                color=("#c0392b", "#e6a59d")[shade], label=f"KSM, {mode}")
        ax.plot(nodes, [r["ours"]["scrape"][mode]["bytes"] for r in results], **our_style,
                color=("#1f6fb2", "#9cc3e6")[shade], label=f"ours, {mode}")
    ax.set_title("one scrape of /metrics: bytes")
    ax = axes[0][1]
    colors = ("#c0392b", "#8e44ad", "#16a085")
    for color, q0 in zip(colors, results[0]["questions"], strict=False):
        def samples(side: str, name: str = q0["name"]) -> list[float]:
            return [next(q for q in r["questions"] if q["name"] == name)[side].get("total_queryable_samples") or 0
                    for r in results]

        ax.plot(nodes, samples("ksm"), **ksm_style, color=color, label=f"KSM: {q0['title']}")
        ax.plot(nodes, samples("ours"), **our_style, color=color, label=f"ours: {q0['title']}")
    ax.set_title("samples a query touches (Prometheus stats=all)")
    ax = axes[1][0]
    ax.plot(nodes, [r["ksm"]["peak_rss_mb"] for r in results], **ksm_style, color="#c0392b", label="KSM")
    ax.plot(nodes, [r["ours"]["peak_rss_mb"] for r in results], **our_style, color="#1f6fb2", label="ours")
    ax.set_title("peak RSS (VmHWM), MB")
    ax = axes[1][1]
    ax.plot(nodes, [r["ksm"]["churn_cpu_seconds"] for r in results], **ksm_style, color="#c0392b", label="KSM")
    ax.plot(nodes, [r["ours"]["churn_cpu_seconds"] for r in results], **our_style, color="#1f6fb2",
            label="ours (exporter and reconciler)")
    if all("metrics_only" in r["ours"] for r in results):
        ax.plot(nodes, [r["ours"]["metrics_only"]["churn_cpu_seconds"] for r in results], **our_style,
                color="#9cc3e6", label="ours, metrics only (--no-reconciler)")
    ax.set_title(f"CPU seconds in {results[0]['churn']['seconds']:.0f} s of pod churn")
    for a in axes[0]:
        a.set_yscale("log")
    for a in axes[1]:
        a.set_ylim(bottom=0)
    for a in axes.flat:
        a.set_xscale("log")
        a.set_xticks(nodes, [f"{n:,}" for n in nodes])
        a.minorticks_off()
        a.set_xlabel("nodes (30 pods each)")
        a.legend(fontsize=7)
    fig.suptitle("node-workload-summary (ours) beside kube-state-metrics, same cluster, same run")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def report(results: list[dict], out: Path, meta: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    for r in results:
        r["ratios"] = ratios(r)
    out.write_text(json.dumps({"meta": meta, "sizes": results}, indent=2) + "\n")
    text = markdown(results)
    out.with_suffix(".md").write_text(text)
    print(text, flush=True)
    plot(results, out.with_suffix(".png"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ksm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 2000, 5000], help="cluster sizes, in turn")
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--groups", type=int, default=20, help="node pools")
    parser.add_argument("--pods-per-workload", type=int, default=50,
                        help="pods per Deployment (Deployments: pods / this, as bench/scale.py makes)")
    parser.add_argument("--deployments", type=int, default=0,
                        help="Deployments, in place of pods / --pods-per-workload (294 at 500 nodes: each one's "
                             "pods over 10 pools)")
    parser.add_argument("--direct-pods-each", type=int, default=10,
                        help="pods per StatefulSet and per Job (one of each per 1,000 pods)")
    parser.add_argument("--churn-seconds", type=float, default=300)
    parser.add_argument("--scrape-interval", default="30s",
                        help="Prometheus's scrape interval for both (and KSM's scrape timeout)")
    parser.add_argument("--scrape-runs", type=int, default=3, help="scrapes per encoding for the scrape costs")
    parser.add_argument("--query-runs", type=int, default=3, help="runs of each query (median time)")
    add_out(parser, "ksm.json", (".md", ".png"))
    parser.add_argument("--merge", action="store_true",
                        help="keep the other sizes already in --out (replace only those run)")
    args = parser.parse_args(argv)
    build()  # before any control plane: a cold build takes minutes
    meta = {"ksm_version": KUBE_STATE_METRICS.version, "ksm_resources": RESOURCES,
            "scrape_interval": args.scrape_interval, "churn_seconds": args.churn_seconds,
            "load_average_at_start": Path("/proc/loadavg").read_text().split()[:3]}
    kept: dict[int, dict] = {}
    if args.merge and args.out.exists():
        kept = {r["nodes"]: r for r in json.loads(args.out.read_text())["sizes"]}
    for n in args.nodes:
        kept[n] = measure_size(n, args) | {"meta": meta}
        kept[n]["load_average_after"] = Path("/proc/loadavg").read_text().split()[:3]
        report([kept[size] for size in sorted(kept)], args.out, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
