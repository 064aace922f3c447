"""The next tier: one control plane grown size by size (5,000 -> 10,000 -> 20,000 nodes at 15
lean pods per node by default), and at each size what every part pays: the time to populate,
kube-apiserver's and etcd's memory, etcd's database, a bare paginated LIST, kubectl's reads (time,
bytes, its own peak RSS), and the service as `bench.scale` measures it (sync, RSS, NotReady ->
/metrics against the plain-watch floor, churn, scrape), with kube-apiserver's peak during the
service's run. Then the slope of each between the last two sizes and where it would be at
--project nodes. Writes bench/results/tier.{json,md,png} (`--out` puts them elsewhere).

    python -m bench.tier --nodes 5000 10000 20000 --pods-per-node 15

Pods are lean (`populate.pod_manifest(lean=True)`: labels, an owner, the node, requests; about
0.8 KB) so that the largest size fits the time and the machine; `--full-pods` for the 2 KB ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kubeindex.client.api import ApiClient, load_connection
from localkube.cluster import LocalCluster, Options
from localkube.service import parse, value

from .common import CRDS, ROOT, Sampler, add_out, clean, control_plane_pids, sayer, status_kb
from .plot import pyplot
from .populate import populate_cluster
from .scale import measure
from .sync import list_floor

MB = 1024 * 1024
say = sayer("tier")


def control_plane(cluster: LocalCluster) -> dict:
    """kube-apiserver's and etcd's memory now, and etcd's database (allocated and in use)."""
    pids = control_plane_pids(cluster, "apiserver", "etcd")
    with urllib.request.urlopen(f"{cluster.etcd_url}/metrics", timeout=30) as resp:
        samples = parse(resp.read().decode())
    out = {f"{name}_rss_mb": round(status_kb(pid, "VmRSS") / 1024) for name, pid in pids.items()}
    out["etcd_db_mb"] = round((value(samples, "etcd_mvcc_db_total_size_in_bytes") or 0) / MB)
    out["etcd_db_in_use_mb"] = round((value(samples, "etcd_mvcc_db_total_size_in_use_in_bytes") or 0) / MB)
    return out


def kubectl_read(cluster: LocalCluster, *args: str) -> dict:
    """One `kubectl get ... -o json`: seconds, bytes, kubectl's peak RSS (GNU time's %M)."""
    cmd = ["/usr/bin/time", "-f", "%M", *cluster.kubectl_argv("get", *args, "-o", "json")]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, timeout=3600)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        return {"error": proc.stderr.decode()[-500:], "seconds": round(seconds, 1)}
    return {"seconds": round(seconds, 2), "bytes": len(proc.stdout),
            "kubectl_peak_rss_mb": round(int(proc.stderr.split()[-1]) / 1024)}


def grow(cluster: LocalCluster, have: tuple[int, int, int], want: tuple[int, int, int],
         args: argparse.Namespace) -> float:
    return populate_cluster(cluster.kubeconfig, want[0], args.groups, want[1], want[2], grow_from=have,
                            lean=not args.full_pods)


def bare_list(cluster: LocalCluster) -> dict:
    async def run() -> tuple[float, int]:
        async with ApiClient(load_connection(str(cluster.kubeconfig))) as api:
            return await list_floor(api)

    seconds, size = asyncio.run(run())
    return {"list_floor_seconds": round(seconds, 3), "list_floor_bytes": size}


def run(args: argparse.Namespace) -> list[dict]:
    rows: list[dict] = []
    if args.append:  # sizes measured before (their cluster grown by an earlier run), smaller than these
        rows = [r for r in json.loads(args.out.read_text())["rows"] if r["nodes"] < args.nodes[0]]
    have = (0, 0, 0)
    options = Options(controller_manager=False, extra_apiserver_args=["--max-requests-inflight=4000"])
    with LocalCluster(options) as cluster:
        cluster.install_crds(CRDS)
        for nodes in args.nodes:
            pods = nodes * args.pods_per_node
            want = (nodes, pods, max(1, pods // args.pods_per_workload))
            say(f"growing to {nodes} nodes / {pods} pods / {want[2]} Deployments ...")
            seconds = grow(cluster, have, want, args)
            added = (want[0] - have[0]) * 2 + (want[1] - have[1]) + (want[2] - have[2]) * 2  # requests
            row: dict = {"nodes": nodes, "pods": pods, "groups": args.groups, "workloads": want[2],
                         "lean_pods": not args.full_pods, "grown_from_nodes": have[0],
                         "populate_seconds": round(seconds),
                         "populate_requests_per_second": round(added / seconds)}
            have = want
            time.sleep(args.settle)  # let the API server's and etcd's garbage go before reading their memory
            row |= control_plane(cluster) | bare_list(cluster)
            say(json.dumps(row))
            say("kubectl reads ...")
            row["kubectl"] = {"nodes": kubectl_read(cluster, "nodes"), "pods": kubectl_read(cluster, "pods", "-A")}
            say(json.dumps(row["kubectl"]))
            pids = control_plane_pids(cluster, "apiserver")
            base = status_kb(pids["apiserver"], "VmRSS")
            sampler = Sampler(pids)
            sampler.start()
            try:
                size = {k: row[k] for k in ("nodes", "pods", "groups", "workloads", "list_floor_seconds")}
                row["service"] = measure(cluster, ROOT, size, args)
            finally:
                peak = sampler.stop()
            row["apiserver_peak_rss_during_service_mb"] = round(peak["apiserver"] / 1024)
            row["apiserver_rss_increase_during_service_mb"] = round((peak["apiserver"] - base) / 1024)
            row |= {f"after_service_{k}": v for k, v in control_plane(cluster).items()}
            rows.append(row)
            say(json.dumps({k: v for k, v in row.items() if k != "service"}))
            write(rows, args)
            clean(cluster)  # the next size's service starts as this one did: no summaries
    return rows


# What is projected, from where in a row, and the limit it meets here or in a default install.
CURVES: list[tuple[str, str, float | None, str]] = [
    ("kube-apiserver RSS (MB)", "apiserver_peak_rss_during_service_mb", 24 * 1024, "this machine's 24 GiB"),
    ("etcd RSS (MB)", "etcd_rss_mb", None, ""),
    ("etcd database (MB)", "etcd_db_mb", 8 * 1024, "etcd's --quota-backend-bytes, 8 GiB (its suggested maximum)"),
    ("service peak RSS (MB)", "service.peak_rss_mb", 1024, "the shipped Deployment's memory limit, 1 GiB"),
    ("service initial sync (s)", "service.initial_sync_seconds", None, ""),
    ("bare paginated LIST (s)", "list_floor_seconds", None, ""),
    ("kubectl get pods -A (s)", "kubectl.pods.seconds", None, ""),
    ("kubectl get pods -A peak RSS (MB)", "kubectl.pods.kubectl_peak_rss_mb", None, ""),
    ("NotReady -> /metrics p99 (ms)", "service.latency.metric_p99_ms", None, ""),
    ("plain watch floor p99 (ms)", "service.latency.floor_p99_ms", None, ""),
    ("/metrics bytes", "service.scrape.bytes", None, ""),
]


def lookup(row: dict, path: str) -> float | None:
    """The number at ``path`` (keys joined by dots) in ``row``; None where there is none."""
    value: object = row
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, int | float) else None


def projections(rows: list[dict], target_nodes: int) -> list[dict]:
    """Per curve: the slope per 1,000 nodes between the last two sizes (the pods per node fixed),
    the value at ``target_nodes`` on that line, and at which size it meets its limit."""
    out: list[dict] = []
    if len(rows) < 2:
        return out
    a, b = rows[-2], rows[-1]
    for label, path, limit, limit_text in CURVES:
        va, vb = lookup(a, path), lookup(b, path)
        if va is None or vb is None:
            continue
        slope = (vb - va) / (b["nodes"] - a["nodes"])
        entry = {"curve": label, "at": {r["nodes"]: lookup(r, path) for r in rows},
                 "slope_per_1000_nodes": round(slope * 1000, 2),
                 "projected": round(vb + slope * (target_nodes - b["nodes"]), 1)}
        if limit is not None:
            entry["limit"], entry["limit_text"] = limit, limit_text
            entry["meets_limit_at_nodes"] = round(b["nodes"] + (limit - vb) / slope) if slope > 0 else None
        out.append(entry)
    return out


def write(rows: list[dict], args: argparse.Namespace) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    projected = projections(rows, args.project)
    args.out.write_text(json.dumps({"rows": rows, "project_nodes": args.project,
                                                   "projections": projected}, indent=2) + "\n")
    lines = ["| nodes / pods | populate (requests/s) | kube-apiserver RSS: after populate, peak with the service | "
             "etcd RSS, DB (in use) | bare LIST | `get nodes` | `get pods -A` (kubectl RSS) | service: sync, "
             "peak RSS | NotReady -> /metrics p50/p99; floor p99 | /metrics |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s, k = r["service"], r["kubectl"]
        lat = s["latency"]

        def read(x: dict) -> str:
            if "error" in x:
                return f"failed after {x['seconds']} s"
            return f"{x['seconds']} s, {x['bytes'] / 1e6:.0f} MB ({x['kubectl_peak_rss_mb']} MB)"

        lines.append(
            f"| {r['nodes']:,} / {r['pods']:,} | {r['populate_seconds']} s ({r['populate_requests_per_second']}) "
            f"| {r['apiserver_rss_mb']:,}, {r['apiserver_peak_rss_during_service_mb']:,} MB "
            f"| {r['etcd_rss_mb']:,} MB, {r['etcd_db_mb']:,} ({r['etcd_db_in_use_mb']:,}) MB "
            f"| {r['list_floor_seconds']} s, {r['list_floor_bytes'] / 1e6:.0f} MB "
            f"| {read(k['nodes'])} | {read(k['pods'])} "
            f"| {s['initial_sync_seconds']} s, {s['peak_rss_mb']} MB "
            f"| {lat['metric_p50_ms']} / {lat['metric_p99_ms']} ms; {lat.get('floor_p99_ms', '-')} ms "
            f"| {s['scrape']['series']:,} series, {s['scrape']['bytes'] / 1e3:.0f} KB |")
    if projected:
        lines += ["", f"Between the last two sizes, per 1,000 nodes, and on that line at {args.project:,} nodes:", "",
                  "| curve | slope per 1,000 nodes | at " + f"{args.project:,} nodes | limit | reached at |",
                  "|---|---|---|---|---|"]
        for p in projected:
            limit = p.get("limit_text", "")
            reached = f"{p['meets_limit_at_nodes']:,} nodes" if p.get("meets_limit_at_nodes") else ""
            lines.append(f"| {p['curve']} | {p['slope_per_1000_nodes']:,} | {p['projected']:,} | {limit} | {reached} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows, args.out.with_suffix(".png"))


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    nodes = [r["nodes"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    ax = axes[0]
    for label, key in (("kube-apiserver", "apiserver_peak_rss_during_service_mb"), ("etcd", "etcd_rss_mb"),
                        ("etcd database", "etcd_db_mb"), ("service", "service.peak_rss_mb"),
                        ("kubectl get pods -A", "kubectl.pods.kubectl_peak_rss_mb")):
        have = [(r["nodes"], lookup(r, key)) for r in rows if lookup(r, key) is not None]
        ax.plot([n for n, _ in have], [v for _, v in have], "o-", label=label)
    ax.set_title("memory (MB)"), ax.legend(fontsize=7)
    ax = axes[1]
    for label, key in (("service initial sync", "service.initial_sync_seconds"),
                        ("bare paginated LIST", "list_floor_seconds"), ("kubectl get pods -A", "kubectl.pods.seconds")):
        have = [(r["nodes"], lookup(r, key)) for r in rows if lookup(r, key) is not None]
        ax.plot([n for n, _ in have], [v for _, v in have], "o-", label=label)
    ax.set_yscale("log"), ax.set_title("seconds"), ax.legend(fontsize=7)
    ax = axes[2]
    for label, key in (("NotReady -> /metrics p99", "service.latency.metric_p99_ms"),
                        ("plain watch floor p99", "service.latency.floor_p99_ms"),
                        ("NotReady -> /metrics p50", "service.latency.metric_p50_ms")):
        ax.plot(nodes, [lookup(r, key) for r in rows], "o-", label=label)
    ax.set_title("latency (ms)"), ax.legend(fontsize=7)
    for a in axes:
        a.set_xlabel(f"nodes ({rows[0]['pods'] // rows[0]['nodes']} pods each)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tier", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[5000, 10000, 20000], help="sizes, ascending")
    parser.add_argument("--pods-per-node", type=int, default=15)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--pods-per-workload", type=int, default=50)
    parser.add_argument("--full-pods", action="store_true", help="2 KB pods, as bench.scale makes")
    add_out(parser, "tier.json", (".md", ".png"))
    parser.add_argument("--append", action="store_true",
                        help="keep --out's rows for smaller sizes (the first size is then populated at once)")
    parser.add_argument("--project", type=int, default=65000, help="project each curve to this many nodes")
    parser.add_argument("--settle", type=float, default=20,
                        help="seconds between populating and reading kube-apiserver's and etcd's memory (default 20)")
    # bench.scale.measure's knobs
    parser.add_argument("--idle-seconds", type=float, default=30)
    parser.add_argument("--churn-seconds", type=float, default=30)
    parser.add_argument("--latency-rounds", type=int, default=20)
    parser.add_argument("--flip-nodes", type=int, default=20)
    parser.add_argument("--taint", default="karpenter.sh/disrupted")
    args = parser.parse_args(argv)
    args.only, args.metrics = "service", ["plain"]
    if args.nodes != sorted(args.nodes):
        parser.error("--nodes must be ascending: the cluster grows")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
