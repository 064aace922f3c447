"""Time to ready, peak memory and scrape cost of the exporter against a populated local control
plane, next to the floor: a bare paginated LIST of the same nodes and pods (raw bytes, no decoding).

    python -m bench.sync --nodes 1000 --pods 30000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

from kubeindex.client.api import ApiClient, load_connection
from kubeindex.model.resources import NODES, PODS
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, parse, value, wait_for

from .common import CRDS, RESULTS, add_out, say, status_kb
from .populate import populate


async def _floor(api: ApiClient, path: str, page_size: int) -> tuple[float, int]:
    """Seconds and bytes of a paginated LIST, bodies read but not decoded."""
    started = time.perf_counter()
    total = 0
    params = {"limit": str(page_size)}
    while True:
        body = await api.get(path, params, timeout=300)
        total += len(body)
        marker = body.rfind(b'"continue":"')
        token = body[marker + 12: body.index(b'"', marker + 12)].decode() if marker >= 0 else ""
        if not token:
            return time.perf_counter() - started, total
        params = {"limit": str(page_size), "continue": token}


async def list_floor(api: ApiClient, rounds: int = 2) -> tuple[float, int]:
    """A bare paginated LIST of nodes then pods (500 per page): the best of ``rounds`` (the later
    ones are warm, like the service's), seconds and bytes."""
    best = (float("inf"), 0)
    for _ in range(rounds):
        n, p = await _floor(api, NODES.path(), 500), await _floor(api, PODS.path(), 500)
        best = min(best, (n[0] + p[0], n[1] + p[1]))
    return best


async def _setup_and_floor(cluster: LocalCluster, args: argparse.Namespace) -> dict:
    async with ApiClient(load_connection(str(cluster.kubeconfig)), max_connections=args.concurrency) as api:
        started = time.monotonic()
        await populate(api, args.nodes, args.groups, args.pods, args.workloads, args.concurrency)
        created = time.monotonic() - started
        seconds, size = await list_floor(api)
        return {"populate_seconds": round(created, 1), "list_floor_seconds": round(seconds, 3),
                "list_floor_bytes": size}


def run(args: argparse.Namespace) -> dict:
    with LocalCluster(Options(extra_apiserver_args=["--max-requests-inflight=4000"])) as cluster:
        cluster.install_crds(CRDS)
        say(f"populating {args.nodes} nodes / {args.pods} pods / {args.workloads} workloads")
        result = {"nodes": args.nodes, "pods": args.pods, "groups": args.groups, "workloads": args.workloads}
        result |= asyncio.run(_setup_and_floor(cluster, args))
        say(f"LIST floor: {result['list_floor_seconds']}s for {result['list_floor_bytes'] / 1e6:.1f} MB")
        exporter = Service(cluster)
        started = time.monotonic()
        exporter.start()
        ready = time.monotonic() - started
        assert exporter.proc is not None
        pid = exporter.proc.pid
        samples = exporter.scrape()
        scrape_started = time.perf_counter()
        _, text = exporter.get("/metrics")
        scrape_seconds = time.perf_counter() - scrape_started
        pods_seen = sum(v for (n, _), v in samples.items() if n == "nws_nodegroup_pods")
        wait_for(lambda: sum(v for (n, _), v in parse(exporter.get("/metrics")[1]).items()
                             if n == "nws_nodegroup_pods") == args.pods, timeout=60)
        result |= {
            "ready_seconds": round(ready, 2),
            "initial_sync_seconds": value(samples, "nws_initial_sync_duration_seconds"),
            "ready_vs_floor": round(ready / result["list_floor_seconds"], 2),
            "peak_rss_mb": round(status_kb(pid, "VmHWM") / 1024, 1),
            "rss_mb": round(status_kb(pid, "VmRSS") / 1024, 1),
            "scrape_bytes": len(text.encode()),
            "scrape_series": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
            "scrape_seconds": round(scrape_seconds, 4),
            "pods_counted_at_ready": pods_seen,
        }
        result["peak_rss_kb_per_pod"] = round(result["peak_rss_mb"] * 1024 / max(args.pods, 1), 2)
        exporter.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sync", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=30000)
    parser.add_argument("--groups", type=int, default=10)
    parser.add_argument("--workloads", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=64)
    add_out(parser, "sync-<nodes>n-<pods>p.json")
    parser.set_defaults(out=None)  # named after the size: known once parsed
    args = parser.parse_args(argv)
    out = args.out or RESULTS / f"sync-{args.nodes}n-{args.pods}p.json"
    result = run(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for key, val in result.items():
        print(f"{key:>24}: {val}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
