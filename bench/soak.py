"""Soak: pod churn at a constant population until a number of pods has been replaced; the
service's RSS must stay flat after warm-up. Every second up to K pods are deleted and K new ones
(new names, new UIDs) created; the service's RSS is sampled. Writes bench/results/soak.{json,png}
(`--out` puts them elsewhere) with the RSS at the end of warm-up, at the end, and the growth in
bytes per replaced pod after warm-up (least-squares slope of RSS against pods replaced).

    python -m bench.soak --replaced 500000 --churn 200 --nodes 200 --pods 6000

--offline replays the same churn without an API server, in this process: watch lines through
Reflector._handle into the index, a /metrics render and a desired-state pass at the pace a live
service has them, printing RSS, allocated blocks and the size of every per-pod table (all must
stay flat; millions of replacements take minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable

import prometheus_client

from exporter.metrics import Renderer
from kubeindex.client.api import ApiClient, ApiError, load_connection
from kubeindex.model.index import interned_vectors
from kubeindex.model.resources import PODS
from kubeindex.model.revision import Stamped
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, parse, value
from reconciler.desired import Naming, TypeInfo, desired_state

from .common import CRDS, add_out, status_kb
from .index_events import build, pod_json
from .plot import pyplot
from .populate import pod_manifest, populate

BENCH_PODS = PODS.path("bench")


async def _status(request: Awaitable[object]) -> int:
    """The answer's status; 0 for a timeout or a lost connection (not fatal under load)."""
    try:
        await request
    except ApiError as err:
        return err.status
    return 200


async def soak(cluster: LocalCluster, svc: Service, args: argparse.Namespace) -> list[dict]:
    samples: list[dict] = []
    async with ApiClient(load_connection(str(cluster.kubeconfig)), max_connections=64) as api:
        body = json.loads(await api.request("GET", "/apis/apps/v1/namespaces/bench/replicasets"))
        replicasets = sorted(body["items"], key=lambda r: r["metadata"]["name"])
        names = [f"{rs['metadata']['name'].rsplit('-', 1)[0]}-{p:06d}" for p, rs in
                 ((p, replicasets[p % len(replicasets)]) for p in range(args.pods))]
        serial = args.pods
        replaced = 0
        started = time.monotonic()

        def sample(replaced: int) -> None:
            metrics = parse(svc.get("/metrics")[1])
            assert svc.proc is not None
            rss = status_kb(svc.proc.pid, "VmRSS") / 1024
            elapsed = time.monotonic() - started
            samples.append({"t": round(elapsed), "rss_mb": round(rss, 2),
                            "pods": value(metrics, "nws_watch_objects", resource="pods"),
                            "replaced": replaced, "rate": round(replaced / max(elapsed, 1e-9), 1)})
            print(json.dumps(samples[-1]), flush=True)

        next_sample = started
        while replaced < args.replaced and time.monotonic() - started < args.minutes * 60:
            tick = time.monotonic()
            victims, names = names[: args.churn], names[args.churn:]
            fresh = []
            for _ in victims:
                rs = replicasets[serial % len(replicasets)]
                app = rs["metadata"]["name"].rsplit("-", 1)[0]
                name = f"{app}-{serial:06d}"
                fresh.append((name, pod_manifest(name, f"node-{serial % args.nodes:05d}", rs, app)))
                serial += 1
            statuses = await asyncio.gather(
                *(_status(api.request("DELETE", PODS.path("bench", n), {"gracePeriodSeconds": 0})) for n in victims),
                *(_status(api.request("POST", BENCH_PODS, m)) for _, m in fresh))
            deleted = [s < 300 or s == 404 for s in statuses[: len(victims)]]  # 404: a retried delete that was done
            created = [s < 300 for s in statuses[len(victims):]]
            names.extend(n for ok, (n, _) in zip(created, fresh, strict=True) if ok)
            names[:0] = [n for ok, n in zip(deleted, victims, strict=True) if not ok]  # retried next tick
            replaced += min(sum(deleted), sum(created))
            if time.monotonic() >= next_sample:
                sample(replaced)
                next_sample += args.sample_seconds
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        sample(replaced)  # the end, whenever it came
    return samples


def offline(args: argparse.Namespace) -> None:
    args.workloads, args.events = max(1, args.pods // 50), 0
    index, pods, _ = build(args)
    renderer = Renderer(index, 1000, registry=prometheus_client.CollectorRegistry())
    infos = {("apps", "Deployment"): TypeInfo("apps/v1", "deploy", "deployment.apps/v1")}
    cache: Stamped = Stamped()
    naming = Naming.empty()
    rv = 10

    def event(kind: str, serial: int) -> bytes:
        nonlocal rv
        rv += 1
        w = serial % args.workloads
        rs = {"metadata": {"name": f"app-{w}-abc123", "uid": f"rs-{w}"}}
        pod = pod_json(f"app-{w}-{serial:07d}", f"pod-{serial}", f"node-{serial % args.nodes:05d}", rs, "Pending", rv)
        return json.dumps({"type": kind, "object": pod}).encode()

    for serial in range(args.pods):
        pods._handle(event("ADDED", serial))
    for replaced in range(1, args.replaced + 1):
        pods._handle(event("DELETED", replaced - 1))  # the oldest pod: a constant population
        pods._handle(event("ADDED", args.pods + replaced - 1))
        if replaced % max(1, args.churn // 5) == 0:  # the reconciler's pass every 0.2 s
            desired_state(index, {"pool": "uid"}, infos, cache, naming)
        if replaced % int(args.churn * args.sample_seconds) == 0:  # a scrape per sample
            renderer.render()
        if replaced % 100_000 == 0:
            graph = index.graph
            print(json.dumps({
                "replaced": replaced, "rss_mb": round(status_kb(os.getpid(), "VmRSS") / 1024, 2),
                "allocated_blocks": sys.getallocatedblocks(), "pods": len(index.pods),
                "store": len(pods.store.versions),
                "vertices": len(graph.vertices), "children": sum(map(len, graph.children.values())),
                "node_pods": sum(len(n.pods) for n in index.nodes.values()),
                "workload_node_pods": sum(len(w.node_pods) for w in index.workloads.values()),
                "workloads": len(index.workloads), "interned": interned_vectors(), "desired": len(cache)}), flush=True)


def summarize(samples: list[dict], warmup: int) -> dict:
    """RSS at the end of warm-up and at the end, and the least-squares slope of RSS (bytes)
    against pods replaced over the samples after warm-up."""
    after = [s for s in samples if s["replaced"] >= warmup] or samples[-2:]
    xs = [s["replaced"] for s in after]
    ys = [s["rss_mb"] * 2**20 for s in after]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    last = samples[-1]
    return {"warmup_replaced": after[0]["replaced"], "rss_mb_at_warmup": after[0]["rss_mb"],
            "rss_mb_end": last["rss_mb"], "rss_mb_max": max(s["rss_mb"] for s in samples),
            "replaced": last["replaced"], "minutes": round(last["t"] / 60, 1),
            "pods_replaced_per_second": last["rate"], "bytes_per_replaced_pod": round(slope, 3)}


def plot(samples: list[dict], summary: dict, args: argparse.Namespace) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([s["replaced"] / 1000 for s in samples], [s["rss_mb"] for s in samples], "-")
    ax.axvline(summary["warmup_replaced"] / 1000, color="grey", linestyle=":", label="end of warm-up")
    ax.set_xlabel("pods replaced (thousands)"), ax.set_ylabel("RSS (MB)"), ax.set_ylim(bottom=0)
    ax.set_title(f"node-workload-summary RSS, {args.pods} pods, {summary['pods_replaced_per_second']:.0f} "
                 f"replaced/s\n{summary['bytes_per_replaced_pod']:+.2f} B per replaced pod after warm-up")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replaced", type=int, default=500_000, help="stop after this many pods were replaced")
    parser.add_argument("--minutes", type=float, default=100, help="stop after this long in any case")
    parser.add_argument("--warmup", type=int, default=0,
                        help="pods replaced before the growth is measured (default: a fifth of --replaced)")
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=6000)
    parser.add_argument("--churn", type=int, default=200, help="pods replaced per second (at most)")
    parser.add_argument("--sample-seconds", type=float, default=15)
    parser.add_argument("--offline", action="store_true",
                        help="no API server: the watch path and the index only (prints, writes no file)")
    add_out(parser, "soak.json", (".png",))
    args = parser.parse_args(argv)
    if args.offline:
        offline(args)
        return 0
    with LocalCluster(Options()) as cluster:
        cluster.install_crds(CRDS)

        async def setup() -> None:
            async with ApiClient(load_connection(str(cluster.kubeconfig)), max_connections=64) as api:
                await populate(api, args.nodes, 10, args.pods, max(1, args.pods // 50))

        asyncio.run(setup())
        svc = Service(cluster).start()
        try:
            samples = asyncio.run(soak(cluster, svc, args))
        finally:
            svc.stop()
    summary = summarize(samples, args.warmup or args.replaced // 5)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": vars(args) | {"out": str(args.out)}, "summary": summary,
                                    "samples": samples}, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    plot(samples, summary, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
