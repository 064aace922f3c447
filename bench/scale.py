"""Scale sweep: for each cluster size, what users pay today (kubectl get nodes / pods) against the
summaries, and the service's own costs: sync vs. the bare LIST floor, memory, churn, latency,
writes, scrape. Writes bench/results/scale.{json,md,png}.

    python -m bench.scale --nodes 500 2000 5000 --pods-per-node 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from kubeindex.api import ApiClient, load_connection
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, parse, select, value, wait_for

from .populate import populate
from .sync import _floor, _status_kb

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def kubectl_cost(cluster: LocalCluster, *args: str, runs: int = 3) -> dict:
    """Median wall time and bytes of a kubectl read."""
    times, size = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        out = cluster.kubectl("get", *args, "-o", "json", timeout=600).stdout
        times.append(time.perf_counter() - started)
        size = len(out.encode())
    return {"seconds": round(statistics.median(times), 3), "bytes": size}


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def not_ready_latency(cluster: LocalCluster, svc: Service, node: str, group: str, rounds: int) -> dict:
    """API change (a node's Ready condition flips) -> /metrics, and -> the NodeSummary status."""
    to_metric, to_summary = [], []
    series = f'nws_nodegroup_nodes_by_condition{{summarizer="pool",group="{group}",condition="NotReady"}} '
    for i in range(rounds):
        status = "False" if i % 2 == 0 else "True"
        before = value(parse(svc.get("/metrics")[1]), "nws_nodegroup_nodes_by_condition", summarizer="pool",
                       group=group, condition="NotReady") or 0
        want = before + (1 if status == "False" else -1)
        started = time.monotonic()
        cluster.request(f"/api/v1/nodes/{node}/status", "PATCH",
                        {"status": {"conditions": [{"type": "Ready", "status": status, "reason": "Bench"}]}},
                        content_type="application/strategic-merge-patch+json")

        def metric_shows(want: float = want) -> bool:  # a substring test: parsing would dominate the timing
            return f"{series}{want:g}\n" in svc.get("/metrics")[1]

        def summary_shows(want: float = want) -> bool:
            code, body = cluster.request(f"/apis/ux.sean.example.com/v1alpha1/nodesummaries/pool-{group}")
            conds = {c["type"]: c["count"] for c in body.get("status", {}).get("conditions", [])} if code == 200 else {}
            return conds.get("NotReady") == want

        wait_for(metric_shows, timeout=30, interval=0.005)
        to_metric.append(time.monotonic() - started)

        wait_for(summary_shows, timeout=30, interval=0.01)
        to_summary.append(time.monotonic() - started)
        time.sleep(1.1)  # past the per-object write debounce, so each round measures a first change
    ms = {name: [round(percentile(v, q) * 1000) for q in (0.5, 0.99)]
          for name, v in (("metric", to_metric), ("summary", to_summary))}
    return {"metric_p50_ms": ms["metric"][0], "metric_p99_ms": ms["metric"][1],
            "summary_p50_ms": ms["summary"][0], "summary_p99_ms": ms["summary"][1]}


async def _churn(api: ApiClient, pods: list[str], seconds: float, concurrency: int = 64) -> int:
    """Flip pod phases as fast as the API server takes them; returns the number of updates."""
    done = 0
    deadline = time.monotonic() + seconds
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        nonlocal done
        async with sem:
            if time.monotonic() > deadline:
                return
            phase = "Running" if (i // len(pods)) % 2 else "Pending"  # each visit flips the pod
            await api.request("PATCH", f"/api/v1/namespaces/bench/pods/{pods[i % len(pods)]}/status",
                              {"status": {"phase": phase}}, content_type="application/merge-patch+json")
            done += 1

    i = 0
    while time.monotonic() < deadline:
        await asyncio.gather(*(one(i + k) for k in range(concurrency * 4)))
        i += concurrency * 4
    return done


def writes(svc: Service) -> float:
    return sum(select(parse(svc.get("/metrics")[1]), "nws_reconciler_writes_total").values())


def events(svc: Service) -> float:
    return sum(select(parse(svc.get("/metrics")[1]), "nws_watch_events_total", resource="pods").values())


def run_size(nodes: int, pods: int, groups: int, workloads: int, args: argparse.Namespace) -> dict:
    result: dict = {"nodes": nodes, "pods": pods, "groups": groups, "workloads": workloads}
    with LocalCluster(Options(controller_manager=False,
                              extra_apiserver_args=["--max-requests-inflight=4000"])) as cluster:
        cluster.install_crds(ROOT / "crds")
        say(f"{nodes} nodes / {pods} pods: populating ...")

        async def setup() -> dict:
            async with ApiClient(load_connection(str(cluster.kubeconfig)), max_connections=64) as api:
                started = time.monotonic()
                await populate(api, nodes, groups, pods, workloads)
                populated = time.monotonic() - started
                floors = []
                for _ in range(2):  # best of two (the second is warm, like the service's)
                    n, p = await _floor(api, "/api/v1/nodes", 500), await _floor(api, "/api/v1/pods", 500)
                    floors.append((n[0] + p[0], n[1] + p[1]))
                seconds, size = min(floors)
                return {"populate_seconds": round(populated), "list_floor_seconds": round(seconds, 3),
                        "list_floor_bytes": size}

        result |= asyncio.run(setup())
        say("starting the service ...")
        svc = Service(cluster)
        started = time.monotonic()
        svc.start()
        result["ready_seconds"] = round(time.monotonic() - started, 2)
        assert svc.proc is not None
        samples = parse(svc.get("/metrics")[1])
        result["initial_sync_seconds"] = value(samples, "nws_initial_sync_duration_seconds")
        result["sync_vs_floor"] = round(result["initial_sync_seconds"] / result["list_floor_seconds"], 2)
        wait_for(lambda: len(cluster.kubectl("get", "workloads.ux", "-A", "--no-headers", timeout=300)
                             .stdout.splitlines()) == workloads, timeout=600, interval=1)
        result["summaries_written_seconds"] = round(time.monotonic() - started, 1)
        say("read costs ...")
        result["read"] = {
            "nodes": kubectl_cost(cluster, "nodes"), "nodesummaries": kubectl_cost(cluster, "nodesummaries"),
            "pods": kubectl_cost(cluster, "pods", "-A"), "workloads": kubectl_cost(cluster, "workloads.ux", "-A"),
        }
        read = result["read"]
        read["nodes_over_summaries_bytes"] = round(read["nodes"]["bytes"] / read["nodesummaries"]["bytes"])
        read["pods_over_workloads_bytes"] = round(read["pods"]["bytes"] / read["workloads"]["bytes"])
        say("idle writes (60 s) ...")
        time.sleep(5)
        w0 = writes(svc)
        time.sleep(args.idle_seconds)
        result["idle_writes"] = writes(svc) - w0
        say("NotReady latency ...")
        result["latency"] = not_ready_latency(cluster, svc, "node-00001", "pool-1", args.latency_rounds)
        say("churn ...")
        pod_names = cluster.kubectl("get", "pods", "-n", "bench", "-o", "jsonpath={.items[*].metadata.name}",
                                    timeout=300).stdout.split()[:2000]
        e0, w0, t0 = events(svc), writes(svc), time.monotonic()

        async def churn() -> int:
            async with ApiClient(load_connection(str(cluster.kubeconfig)), max_connections=64) as api:
                return await _churn(api, pod_names, args.churn_seconds)

        updates = asyncio.run(churn())
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
        result["peak_rss_mb"] = round(_status_kb(svc.proc.pid, "VmHWM") / 1024, 1)
        result["rss_kb_per_pod"] = round(result["peak_rss_mb"] * 1024 / pods, 2)
        svc.stop()
    say(json.dumps(result))
    return result


def report(results: list[dict]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "scale.json").write_text(json.dumps(results, indent=2) + "\n")
    rows = ["| nodes | pods | nodes JSON / nodesummaries JSON | pods JSON / workloads JSON | sync / LIST floor | "
            "peak RSS (MB, KB/pod) | NotReady -> metric p50/p99 | -> NodeSummary p50/p99 | idle writes | "
            "churn: API updates/s, writes/min | scrape |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        rd, lat, ch, sc = r["read"], r["latency"], r["churn"], r["scrape"]
        nodes, summaries, pods, wls = rd["nodes"], rd["nodesummaries"], rd["pods"], rd["workloads"]
        rows.append(
            f"| {r['nodes']} | {r['pods']} | {nodes['bytes'] / 1e6:.1f} MB / {summaries['bytes'] / 1e3:.1f} KB "
            f"({rd['nodes_over_summaries_bytes']}x); {nodes['seconds']} s / {summaries['seconds']} s "
            f"| {pods['bytes'] / 1e6:.0f} MB / {wls['bytes'] / 1e3:.0f} KB ({rd['pods_over_workloads_bytes']}x); "
            f"{pods['seconds']} s / {wls['seconds']} s "
            f"| {r['initial_sync_seconds']} s / {r['list_floor_seconds']} s ({r['sync_vs_floor']}x) "
            f"| {r['peak_rss_mb']} ({r['rss_kb_per_pod']}) | {lat['metric_p50_ms']} / {lat['metric_p99_ms']} ms "
            f"| {lat['summary_p50_ms']} / {lat['summary_p99_ms']} ms | {r['idle_writes']:.0f} "
            f"| {ch['api_updates_per_second']}, {ch['writes_per_minute']} "
            f"| {sc['series']} series, {sc['bytes'] / 1e3:.0f} KB, {sc['seconds'] * 1000:.1f} ms |")
    (RESULTS / "scale.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib not installed (pip install '.[bench]'): no plot")
        return
    pods = [r["pods"] for r in results]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ax = axes[0][0]
    for key, label in (("nodes", "get nodes"), ("pods", "get pods -A"), ("nodesummaries", "get nodesummaries"),
                       ("workloads", "get workloads.ux -A")):
        ax.plot(pods, [r["read"][key]["bytes"] / 1e6 for r in results], "o-", label=f"kubectl {label} -o json")
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
    ax.set_title("latency"), ax.legend(fontsize=7)
    for a in axes.flat:
        a.set_xlabel("pods")
    fig.tight_layout()
    fig.savefig(RESULTS / "scale.png", dpi=100)


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
    args = parser.parse_args(argv)
    results = []
    for n in args.nodes:
        pods = n * args.pods_per_node
        results.append(run_size(n, pods, args.groups, max(1, pods // args.pods_per_workload), args))
        report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
