"""Scale sweep: for each cluster size, what users pay today (kubectl get nodes / pods) against the
summaries, and the service's own costs: sync vs. the bare LIST floor, memory, churn, latency,
writes, scrape. Writes bench/results/scale.{json,md,png} (`--out` puts them elsewhere).

    python -m bench.scale --nodes 500 2000 5000 --pods-per-node 30

A before/after comparison on one populated control plane, the service started from each checkout
in turn (PYTHONPATH and working directory set to it), alternately, summaries deleted in between;
`--only service` skips what does not depend on the service (`kubectl get nodes` and `get pods -A`):

    git worktree add /tmp/before <commit>
    python -m bench.scale --nodes 5000 --only service --code /tmp/before . --repeat 2 \\
        --merge --compare bench/results/scale.node-state.json

The same for /metrics served plain and with --metrics-secure (HTTPS, every scrape with a bearer
token checked by TokenReview + SubjectAccessReview, decisions cached), alternately:

    python -m bench.scale --nodes 5000 --only service --metrics plain secure --repeat 2 \\
        --compare bench/results/scale.secure-metrics.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from kubeindex.client.api import ApiClient, load_connection
from kubeindex.model.resources import NODE_SUMMARIES, NODES, PODS
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, metrics_reader_token, parse, select, value, wait_for

from .common import CRDS, ROOT, add_out, clean, p50_p99_ms, revision, running_from, say, status_kb, writes
from .plot import pyplot
from .populate import churn, populate
from .sync import list_floor


def kubectl_cost(cluster: LocalCluster, *args: str, runs: int = 3) -> dict:
    """Median wall time and bytes of a kubectl read."""
    times, size = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        out = cluster.kubectl("get", *args, "-o", "json", timeout=600).stdout
        times.append(time.perf_counter() - started)
        size = len(out.encode())
    return {"seconds": round(statistics.median(times), 3), "bytes": size}


class PlainWatch:
    """The latency floor: a bare watch on nodes (one HTTP stream, JSON lines, no index, no
    exporter), started before the flips, in a thread of its own. Records when each event of one
    node arrived (time.monotonic(), which is system-wide on Linux: comparable with the service's)
    and the node's Ready status in it."""

    def __init__(self, cluster: LocalCluster, node: str) -> None:
        self.cluster, self.node = cluster, node
        self.seen: list[tuple[float, str]] = []  # (arrival, Ready status)
        self._lock = threading.Lock()
        _, listed = cluster.request(f"{NODES.path()}?limit=1")
        assert isinstance(listed, dict)
        host, port = cluster.server.removeprefix("https://").split(":")
        self._conn = http.client.HTTPSConnection(host, int(port), context=cluster._ssl, timeout=3600)
        self._conn.request("GET", f"{NODES.path()}?watch=1&resourceVersion={listed['metadata']['resourceVersion']}")
        self._resp = self._conn.getresponse()
        assert self._resp.status == 200, self._resp.status
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for line in self._resp:
                arrived = time.monotonic()
                event = json.loads(line)
                obj = event.get("object", {})
                if obj.get("metadata", {}).get("name") != self.node:
                    continue
                ready = next((c.get("status", "") for c in obj.get("status", {}).get("conditions", [])
                              if c.get("type") == "Ready"), "")
                with self._lock:
                    self.seen.append((arrived, ready))
        except (OSError, ValueError, AttributeError, http.client.HTTPException):
            pass  # closed (http.client raises AttributeError when the socket goes mid-read)

    def arrival(self, since: float, ready: str, timeout: float = 30) -> float | None:
        """When the first event after ``since`` showing Ready=``ready`` arrived (None: never)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                hit = next((t for t, r in self.seen if t >= since and r == ready), None)
            if hit is not None:
                return hit
            time.sleep(0.01)
        return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.sock.shutdown(2) if self._conn.sock else None
        self._conn.close()


def not_ready_latency(cluster: LocalCluster, svc: Service, node: str, group: str, rounds: int) -> dict:
    """API change (a node's Ready condition flips) -> /metrics, and -> the NodeSummary status; and
    the floor: when a plain watch on nodes (PlainWatch) saw the same change."""
    to_metric, to_summary, to_floor, marks = [], [], [], []
    series = f'nws_nodegroup_nodes_by_condition{{summarizer="pool",group="{group}",condition="NotReady"}} '
    floor = PlainWatch(cluster, node)
    try:
        for i in range(rounds):
            status = "False" if i % 2 == 0 else "True"
            before = value(parse(svc.get("/metrics")[1]), "nws_nodegroup_nodes_by_condition", summarizer="pool",
                           group=group, condition="NotReady") or 0
            want = before + (1 if status == "False" else -1)
            started = time.monotonic()
            cluster.request(NODES.path(name=node, subresource="status"), "PATCH",
                            {"status": {"conditions": [{"type": "Ready", "status": status, "reason": "Bench"}]}},
                            content_type="application/strategic-merge-patch+json")

            def metric_shows(want: float = want) -> bool:  # a substring test: parsing would dominate the timing
                return f"{series}{want:g}\n" in svc.get("/metrics")[1]

            def summary_shows(want: float = want) -> bool:
                code, body = cluster.request(NODE_SUMMARIES.path(name=f"pool-{group}"))
                conds = ({c["type"]: c["count"] for c in body.get("status", {}).get("conditions", [])}
                         if code == 200 and isinstance(body, dict) else {})
                return conds.get("NotReady") == want

            wait_for(metric_shows, timeout=30, interval=0.005)
            to_metric.append(time.monotonic() - started)
            seen = floor.arrival(started, status)
            to_floor.append(seen - started if seen is not None else to_metric[-1])
            marks.append({"patched": started, "watch_saw": seen, "metrics_showed": started + to_metric[-1]})

            wait_for(summary_shows, timeout=30, interval=0.01)
            to_summary.append(time.monotonic() - started)
            time.sleep(1.1)  # past the per-object write debounce, so each round measures a first change
    finally:
        floor.close()
    over = [m - f for m, f in zip(to_metric, to_floor, strict=True)]
    (m50, m99), (s50, s99), (f50, f99), (o50, o99) = (p50_p99_ms(v) for v in (to_metric, to_summary, to_floor, over))
    return {"metric_p50_ms": m50, "metric_p99_ms": m99, "summary_p50_ms": s50, "summary_p99_ms": s99,
            "floor_p50_ms": f50, "floor_p99_ms": f99, "over_floor_p50_ms": o50, "over_floor_p99_ms": o99,
            "metric_ms": [round(t * 1000) for t in to_metric], "floor_ms": [round(t * 1000) for t in to_floor],
            "marks": marks}


def _on_node(cluster: LocalCluster, node: str) -> Counter[str]:
    """Pods per workload (Deployment name) on one node."""
    _, body = cluster.request(f"{PODS.path('bench')}?fieldSelector=spec.nodeName%3D{node}")
    assert isinstance(body, dict)
    return Counter(item["metadata"]["name"].rsplit("-", 1)[0] for item in body["items"])


def disruption_latency(cluster: LocalCluster, svc: Service, nodes: list[str], groups: int, taint: str) -> dict:
    """A node state flip with its pods: a disruption taint added to a node, then removed (two flips
    per node, one node tainted at a time) -> /metrics shows the node group's Disrupting count and
    every workload with pods on the node in nws_workload_pods_by_node_state (or no longer)."""
    flips, pods_per_node = [], []
    for node in nodes:
        group = f"pool-{int(node.rsplit('-', 1)[1]) % groups}"
        on_node = _on_node(cluster, node)
        pods_per_node.append(sum(on_node.values()))
        count = f'nws_nodegroup_nodes_by_state{{summarizer="pool",group="{group}",state="Disrupting"}} '
        per_workload = {w: f'nws_workload_pods_by_node_state{{namespace="bench",workload="{w}",kind="Deployment",'
                           f'state="Disrupting"}} ' for w in on_node}
        before = value(parse(svc.get("/metrics")[1]), "nws_nodegroup_nodes_by_state", summarizer="pool",
                       group=group, state="Disrupting") or 0
        for tainted in (True, False):
            want = f"{count}{before + 1 if tainted else before:g}\n"
            taints = [{"key": taint, "value": "bench", "effect": "NoSchedule"}] if tainted else None
            started = time.monotonic()
            cluster.request(NODES.path(name=node), "PATCH", {"spec": {"taints": taints}},
                            content_type="application/merge-patch+json")

            def shows(want: str = want, tainted: bool = tainted, on_node: Counter[str] = on_node,
                      per_workload: dict[str, str] = per_workload) -> bool:  # substring tests, as above
                text = svc.get("/metrics")[1]
                if want not in text:
                    return False
                if tainted:
                    return all(f"{series}{on_node[w]}\n" in text for w, series in per_workload.items())
                return not any(series in text for series in per_workload.values())

            wait_for(shows, timeout=30, interval=0.005)
            flips.append(time.monotonic() - started)
            time.sleep(1.1)
    p50, p99 = p50_p99_ms(flips)
    return {"flips": len(flips), "pods_per_node": min(pods_per_node), "taint": taint,
            "metric_p50_ms": p50, "metric_p99_ms": p99, "metric_max_ms": round(max(flips) * 1000),
            "metric_ms": [round(f * 1000) for f in flips]}


def events(svc: Service) -> float:
    return sum(select(parse(svc.get("/metrics")[1]), "nws_watch_events_total", resource="pods").values())


def run_size(nodes: int, pods: int, groups: int, workloads: int, args: argparse.Namespace) -> list[dict]:
    size: dict = {"nodes": nodes, "pods": pods, "groups": groups, "workloads": workloads}
    runs: list[dict] = []
    with LocalCluster(Options(controller_manager=False,
                              extra_apiserver_args=["--max-requests-inflight=4000"])) as cluster:
        cluster.install_crds(CRDS)
        say(f"{nodes} nodes / {pods} pods: populating ...")

        async def setup() -> dict:
            async with ApiClient(load_connection(str(cluster.kubeconfig)), max_connections=64) as api:
                started = time.monotonic()
                await populate(api, nodes, groups, pods, workloads)
                populated = time.monotonic() - started
                seconds, total = await list_floor(api)
                return {"populate_seconds": round(populated), "list_floor_seconds": round(seconds, 3),
                        "list_floor_bytes": total}

        size |= asyncio.run(setup())
        token = metrics_reader_token(cluster, "bench-reader") if "secure" in args.metrics else ""
        for _ in range(args.repeat):
            for code in args.code:
                for metrics in args.metrics:
                    if runs:
                        say("deleting the summaries ...")
                        clean(cluster)
                    runs.append(measure(cluster, code, size, args, metrics, token))
                    say(json.dumps(runs[-1]))
    return runs


def measure(cluster: LocalCluster, code: Path, size: dict, args: argparse.Namespace, metrics: str = "plain",
            token: str = "") -> dict:
    """One service run, from the checkout ``code``, on a populated control plane; every read of
    /metrics (the latency probes too) goes through --metrics-secure when ``metrics`` is "secure"."""
    nodes, pods, workloads = size["nodes"], size["pods"], size["workloads"]
    result = dict(size) | {"checkout": str(code), "code": revision(code), "only": args.only, "metrics": metrics}
    say(f"starting the service from {code} ({result['code']}), {metrics} /metrics ...")
    secure = metrics == "secure"
    # Every workload keeps series of its own (the flips look for them): the cap, 5,000 by default,
    # raised to the workload count, as a user with that many would.
    svc = Service(cluster, secure=secure, token=token if secure else "",
                  args=(f"--max-workload-series={max(5000, workloads)}",))
    started = time.monotonic()
    with running_from(code):
        svc.start()
    result["ready_seconds"] = round(time.monotonic() - started, 2)
    assert svc.proc is not None
    samples = parse(svc.get("/metrics")[1])
    result["initial_sync_seconds"] = value(samples, "nws_initial_sync_duration_seconds")
    result["sync_vs_floor"] = round(result["initial_sync_seconds"] / result["list_floor_seconds"], 2)
    wait_for(lambda: len(cluster.kubectl("get", "workloads.ux", "-A", "--no-headers", timeout=300)
                         .stdout.splitlines()) == workloads, timeout=max(600, workloads / 5), interval=1)
    result["summaries_written_seconds"] = round(time.monotonic() - started, 1)
    result["peak_rss_at_summaries_written_mb"] = round(status_kb(svc.proc.pid, "VmHWM") / 1024, 1)
    say("read costs ...")
    read = result["read"] = {
        "nodesummaries": kubectl_cost(cluster, "nodesummaries"),
        "workloads": kubectl_cost(cluster, "workloads.ux", "-A"),
    }
    if args.only != "service":  # what users pay without the service: the same for any version of it
        read |= {"nodes": kubectl_cost(cluster, "nodes"), "pods": kubectl_cost(cluster, "pods", "-A")}
        ratios(read)
    say("idle writes (60 s) ...")
    time.sleep(5)
    w0 = writes(svc)
    time.sleep(args.idle_seconds)
    result["idle_writes"] = writes(svc) - w0
    say("NotReady latency ...")
    result["latency"] = not_ready_latency(cluster, svc, "node-00001", "pool-1", args.latency_rounds)
    result["has_node_state"] = "nws_nodegroup_nodes_by_state{" in svc.get("/metrics")[1]
    if result["has_node_state"]:
        say("node state flip latency ...")
        flip_nodes = [f"node-{(2 + 251 * k) % nodes:05d}" for k in range(args.flip_nodes)]
        result["flip_latency"] = disruption_latency(cluster, svc, flip_nodes, size["groups"], args.taint)
    say("churn ...")
    _, listed = cluster.request(f"{PODS.path('bench')}?limit=2000")
    assert isinstance(listed, dict)
    pod_names = [item["metadata"]["name"] for item in listed["items"]]
    e0, w0, t0 = events(svc), writes(svc), time.monotonic()

    async def churn_pods() -> int:
        async with ApiClient(load_connection(str(cluster.kubeconfig)), max_connections=64) as api:
            return await churn(api, pod_names, args.churn_seconds)

    updates = asyncio.run(churn_pods())
    elapsed = time.monotonic() - t0
    time.sleep(2)
    result["churn"] = {"api_updates_per_second": round(updates / elapsed),
                       "pod_events_per_second_seen": round((events(svc) - e0) / elapsed),
                       "writes_per_minute": round((writes(svc) - w0) / elapsed * 60)}
    say("scrape ...")
    t = time.perf_counter()
    _, text = svc.get("/metrics")
    result["scrape"] = {"seconds": round(time.perf_counter() - t, 4), "bytes": len(text.encode()),
                        "series": sum(1 for line in text.splitlines() if line and not line.startswith("#"))}
    result["peak_rss_mb"] = round(status_kb(svc.proc.pid, "VmHWM") / 1024, 1)
    result["rss_kb_per_pod"] = round(result["peak_rss_mb"] * 1024 / pods, 2)
    svc.stop()
    return result


def ratios(read: dict) -> None:
    read["nodes_over_summaries_bytes"] = round(read["nodes"]["bytes"] / read["nodesummaries"]["bytes"])
    read["pods_over_workloads_bytes"] = round(read["pods"]["bytes"] / read["workloads"]["bytes"])


def merged(runs: list[dict], out: Path) -> list[dict]:
    """scale.json's rows: per size, the last run of the current checkout, in place of the size's
    row already there; the reads skipped by `--only service` carried over from that row."""
    old = {r["nodes"]: r for r in json.loads(out.read_text())}
    for run in runs:
        previous = old.get(run["nodes"], {})
        if "pods" not in run["read"] and "pods" in previous.get("read", {}):
            run["read"] |= {k: previous["read"][k] for k in ("nodes", "pods")}
            run["read"]["carried_over"] = ["nodes", "pods"]
            ratios(run["read"])
        old[run["nodes"]] = run
    return [old[n] for n in sorted(old)]


def report(results: list[dict], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    rows = ["| nodes | pods | nodes JSON / nodesummaries JSON | pods JSON / workloads JSON | sync / LIST floor | "
            "peak RSS (MB, KB/pod) | NotReady -> metric p50/p99 | floor p50/p99, ours minus floor | "
            "-> NodeSummary p50/p99 | "
            "Disrupting flip (30 pods) -> metric p50/p99 | idle writes | churn: API updates/s, writes/min | scrape |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rd, lat, ch, sc = r["read"], r["latency"], r["churn"], r["scrape"]
        flip = r.get("flip_latency")
        flip_text = f"{flip['metric_p50_ms']} / {flip['metric_p99_ms']} ms" if flip else "-"
        floor_text = (f"{lat['floor_p50_ms']} / {lat['floor_p99_ms']} ms, {lat['over_floor_p50_ms']} / "
                      f"{lat['over_floor_p99_ms']} ms" if "floor_p50_ms" in lat else "-")
        summaries, wls = rd["nodesummaries"], rd["workloads"]
        nodes_text = pods_text = "- / "
        if "nodes" in rd:  # not with --only service (and nothing to carry over)
            nodes, pods = rd["nodes"], rd["pods"]
            nodes_text = (f"{nodes['bytes'] / 1e6:.1f} MB / {summaries['bytes'] / 1e3:.1f} KB "
                          f"({rd['nodes_over_summaries_bytes']}x); {nodes['seconds']} s / ")
            pods_text = (f"{pods['bytes'] / 1e6:.0f} MB / {wls['bytes'] / 1e3:.0f} KB "
                         f"({rd['pods_over_workloads_bytes']}x); {pods['seconds']} s / ")
        rows.append(
            f"| {r['nodes']} | {r['pods']} | {nodes_text}{summaries['seconds']} s "
            f"| {pods_text}{wls['seconds']} s "
            f"| {r['initial_sync_seconds']} s / {r['list_floor_seconds']} s ({r['sync_vs_floor']}x) "
            f"| {r['peak_rss_mb']} ({r['rss_kb_per_pod']}) | {lat['metric_p50_ms']} / {lat['metric_p99_ms']} ms "
            f"| {floor_text} | {lat['summary_p50_ms']} / {lat['summary_p99_ms']} ms | {flip_text} "
            f"| {r['idle_writes']:.0f} "
            f"| {ch['api_updates_per_second']}, {ch['writes_per_minute']} "
            f"| {sc['series']} series, {sc['bytes'] / 1e3:.0f} KB, {sc['seconds'] * 1000:.1f} ms |")
    out.with_suffix(".md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    plt = pyplot()
    if plt is None:
        return
    pods = [r["pods"] for r in results]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ax = axes[0][0]
    for key, label in (("nodes", "get nodes"), ("pods", "get pods -A"), ("nodesummaries", "get nodesummaries"),
                       ("workloads", "get workloads.ux -A")):
        have = [r for r in results if key in r["read"]]
        ax.plot([r["pods"] for r in have], [r["read"][key]["bytes"] / 1e6 for r in have], "o-",
                label=f"kubectl {label} -o json")
    ax.set_yscale("log"), ax.set_title("read: MB per answer"), ax.legend(fontsize=7)
    ax = axes[0][1]
    ax.plot(pods, [r["initial_sync_seconds"] for r in results], "o-", label="service initial sync")
    ax.plot(pods, [r["list_floor_seconds"] for r in results], "o-", label="bare paginated LIST (floor)")
    ax.set_title("sync: seconds"), ax.legend(fontsize=7)
    ax = axes[1][0]
    ax.plot(pods, [r["peak_rss_mb"] for r in results], "o-", label="peak RSS (MB)")
    ax.plot(pods, [r["scrape"]["bytes"] / 1e3 for r in results], "o-", label="/metrics (KB)")
    ax.set_title("memory and scrape size"), ax.legend(fontsize=7)
    ax = axes[1][1]
    ax.plot(pods, [r["latency"]["metric_p99_ms"] for r in results], "o-", label="NotReady -> /metrics p99 (ms)")
    ax.plot(pods, [r["latency"]["summary_p99_ms"] for r in results], "o-", label="NotReady -> NodeSummary p99 (ms)")
    flips = [r for r in results if r.get("flip_latency")]
    ax.plot([r["pods"] for r in flips], [r["flip_latency"]["metric_p99_ms"] for r in flips], "o",
            label="Disrupting taint, 30 pods -> /metrics p99 (ms)")
    ax.set_title("latency"), ax.legend(fontsize=7)
    for a in axes.flat:
        a.set_xlabel("pods")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 2000, 5000])
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--pods-per-workload", type=int, default=50)
    parser.add_argument("--idle-seconds", type=float, default=60)
    parser.add_argument("--churn-seconds", type=float, default=30)
    parser.add_argument("--latency-rounds", type=int, default=20)
    parser.add_argument("--flip-nodes", type=int, default=20,
                        help="nodes tainted and untainted in turn for the node state flip latency (2 flips each)")
    parser.add_argument("--taint", default="karpenter.sh/disrupted", help="the disruption taint of the flips")
    parser.add_argument("--only", choices=["service"],
                        help="service: skip `kubectl get nodes` and `get pods -A` (no service involved)")
    parser.add_argument("--code", type=Path, nargs="+", default=[ROOT],
                        help="checkouts to run the service from, in turn, on each populated control plane")
    parser.add_argument("--metrics", nargs="+", choices=["plain", "secure"], default=["plain"],
                        help="serve /metrics plain, or with --metrics-secure (the bench scrapes with a token "
                             "bound to the metrics-reader role); several: each in turn")
    parser.add_argument("--repeat", type=int, default=1, help="rounds over --code (and --metrics)")
    add_out(parser, "scale.json", (".md", ".png"))
    parser.add_argument("--merge", action="store_true",
                        help="replace only the sizes run in --out (the current checkout's last run)")
    parser.add_argument("--compare", type=Path, metavar="PATH.json",
                        help="also write every run (each checkout, each round) to PATH.json")
    args = parser.parse_args(argv)
    args.code = [c.resolve() for c in args.code]
    results, runs = [], []
    for n in args.nodes:
        pods = n * args.pods_per_node
        runs += run_size(n, pods, args.groups, max(1, pods // args.pods_per_workload), args)
        if args.compare:
            args.compare.write_text(json.dumps(runs, indent=2) + "\n")
        mine = [r for r in runs if r["checkout"] == str(ROOT) and r["metrics"] == args.metrics[0]]
        if args.merge:
            results = merged(mine, args.out)
        else:
            results = [[r for r in mine if r["nodes"] == size][-1] for size in sorted({r["nodes"] for r in mine})]
        if results:
            report(results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
