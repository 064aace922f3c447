"""Soak: pod churn at a constant population for a long time; the service's RSS must stay flat.
Every second K pods are deleted and K new ones (new names, new UIDs) created; RSS is sampled.
Writes bench/results/soak.{json,png}.

    python -m bench.soak --minutes 30 --nodes 200 --pods 6000 --churn 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from kubeindex.api import ApiClient, load_connection
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, parse, value

from .populate import pod_manifest, populate
from .sync import _status_kb

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parent.parent


async def soak(cluster: LocalCluster, svc: Service, args: argparse.Namespace) -> list[dict]:
    samples: list[dict] = []
    async with ApiClient(load_connection(str(cluster.kubeconfig)), max_connections=64) as api:
        body = json.loads((await api.request("GET", "/apis/apps/v1/namespaces/bench/replicasets"))[1])
        replicasets = body["items"]
        names = [f"{rs['metadata']['name'].rsplit('-', 1)[0]}-{p:06d}" for p, rs in
                 ((p, replicasets[p % len(replicasets)]) for p in range(args.pods))]
        serial = args.pods
        started = time.monotonic()
        next_sample = started
        while time.monotonic() - started < args.minutes * 60:
            tick = time.monotonic()
            victims, names = names[: args.churn], names[args.churn:]
            fresh = []
            for _ in victims:
                rs = replicasets[serial % len(replicasets)]
                app = rs["metadata"]["name"].rsplit("-", 1)[0]
                name = f"{app}-{serial:06d}"
                fresh.append((name, pod_manifest(name, f"node-{serial % args.nodes:05d}", rs, app)))
                serial += 1
            pods = "/api/v1/namespaces/bench/pods"
            await asyncio.gather(*(api.request("DELETE", f"{pods}/{n}", {"gracePeriodSeconds": 0}) for n in victims),
                                 *(api.request("POST", pods, m) for _, m in fresh))
            names.extend(n for n, _ in fresh)
            if time.monotonic() >= next_sample:
                metrics = parse(svc.get("/metrics")[1])
                rss = _status_kb(svc.proc.pid, "VmRSS") / 1024  # type: ignore[union-attr]
                samples.append({"t": round(time.monotonic() - started), "rss_mb": round(rss, 1),
                                "pods": value(metrics, "nws_watch_objects", resource="pods"),
                                "replaced": serial - args.pods})
                print(json.dumps(samples[-1]), flush=True)
                next_sample += args.sample_seconds
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=6000)
    parser.add_argument("--churn", type=int, default=50, help="pods replaced per second")
    parser.add_argument("--sample-seconds", type=float, default=15)
    args = parser.parse_args(argv)
    with LocalCluster(Options()) as cluster:
        cluster.install_crds(ROOT / "crds")

        async def setup() -> None:
            async with ApiClient(load_connection(str(cluster.kubeconfig)), max_connections=64) as api:
                await populate(api, args.nodes, 10, args.pods, max(1, args.pods // 50))

        asyncio.run(setup())
        svc = Service(cluster).start()
        try:
            samples = asyncio.run(soak(cluster, svc, args))
        finally:
            svc.stop()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "soak.json").write_text(json.dumps({"args": vars(args), "samples": samples}, indent=2) + "\n")
    first, last = samples[len(samples) // 5], samples[-1]  # after warm-up
    print(f"RSS {first['rss_mb']} MB at {first['t']} s -> {last['rss_mb']} MB at {last['t']} s, "
          f"{last['replaced']} pods replaced")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 0
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot([s["t"] / 60 for s in samples], [s["rss_mb"] for s in samples], "-")
    ax.set_xlabel("minutes"), ax.set_ylabel("RSS (MB)"), ax.set_ylim(bottom=0)
    ax.set_title(f"node-workload-summary RSS, {args.pods} pods, {args.churn} replaced per second")
    fig.tight_layout()
    fig.savefig(RESULTS / "soak.png", dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
