"""What the service holds per pod: pods fed through the live watch path (a watch line's bytes ->
msgspec decode -> index, as `bench.index_events`) with the identities a real cluster has (UUIDs,
ReplicaSet-hashed names, many namespaces), measured at each size as

- the process's RSS growth per pod (after a full collection), what the Deployment's limit sees;
- tracemalloc's bytes per pod and where they were allocated (file:line), in a second process, for
  the smallest size (tracing costs memory of its own, so it never runs beside the RSS pass).

The slope between the last two sizes projects the pods that fit in --limit-mib. Writes
bench/results/pod-memory.{json,md}.

    python -m bench.pod_memory --pods 50000 150000 300000
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import random
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path

from .common import add_out, sayer, status_kb, write_results
from .index_events import pod_json, watch_path
from .populate import node_manifest, node_status

say = sayer("pod-memory")
KB = 1024
NAMESPACES = 40
PODS_PER_WORKLOAD = 50
PODS_PER_NODE = 15
ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the ReplicaSet controller's suffixes are made of


class Cluster:
    """The index, its reflector and a seeded stream of pod ADDED lines, one line at a time."""

    def __init__(self, seed: int = 1) -> None:
        self.rnd = random.Random(seed)
        self.index, self.reflector, self.node_reflector = watch_path()
        self.nodes = 0
        self.node_name = ""
        self.replicasets: list[tuple[str, dict]] = []  # (namespace, ReplicaSet) per workload
        self.pods = 0

    def _name(self, n: int) -> str:
        return "".join(self.rnd.choice(ALPHABET) for _ in range(n))

    def _uid(self) -> str:
        return str(uuid.UUID(int=self.rnd.getrandbits(128), version=4))

    def _workload(self) -> tuple[str, dict]:
        w = len(self.replicasets)
        namespace, app = f"team-{w % NAMESPACES:02d}", f"service-{w:05d}"
        deployment, rs_name, rs_uid = self._uid(), f"{app}-{self._name(10)}", self._uid()
        self.index.upsert_owner(("apps", "Deployment"), namespace, app, deployment, None)
        self.index.upsert_owner(("apps", "ReplicaSet"), namespace, rs_name, rs_uid,
                                ("apps/v1", "Deployment", deployment))
        self.replicasets.append((namespace, {"metadata": {"name": rs_name, "uid": rs_uid}}))
        return self.replicasets[-1]

    def lines(self, count: int) -> Iterator[bytes]:
        for _ in range(count):
            p = self.pods
            namespace, rs = (self.replicasets[-1] if p % PODS_PER_WORKLOAD else self._workload())
            if p % PODS_PER_NODE == 0:  # nodes grow with the pods, as the Node watch delivers them
                node = node_manifest(self.nodes, 10) | node_status(self.nodes)
                node["metadata"]["resourceVersion"] = "1"
                self.node_reflector._handle(json.dumps({"type": "ADDED", "object": node}).encode())
                self.nodes += 1
                self.node_name = node["metadata"]["name"]
            pod = pod_json(f"{rs['metadata']['name']}-{self._name(5)}", self._uid(), self.node_name,
                           rs, "Running", p + 10)
            pod["metadata"]["namespace"] = namespace
            self.pods += 1
            yield json.dumps({"type": "ADDED", "object": pod}).encode()

    def grow(self, to: int) -> None:
        for line in self.lines(to - self.pods):
            self.reflector._handle(line)


def rss_kb() -> int:
    gc.collect()
    return status_kb(os.getpid(), "VmRSS")


def rss_pass(sizes: list[int]) -> list[dict]:
    cluster = Cluster()
    base = rss_kb()
    rows = []
    for size in sizes:
        cluster.grow(size)
        grown = rss_kb() - base
        rows.append({"pods": size, "nodes": cluster.nodes, "workloads": len(cluster.replicasets),
                     "rss_growth_mib": round(grown / KB, 1), "rss_bytes_per_pod": round(grown * KB / size)})
        say(f"{size:,} pods: RSS +{grown / KB:.1f} MiB, {grown * KB / size:.0f} bytes per pod")
    return rows


def traced(pods: int, top: int) -> dict:
    """Bytes per pod by allocation site, with tracemalloc (in this process: run it alone)."""
    cluster = Cluster()
    cluster.grow(1000)  # the first workloads, nodes and interned vectors: not per pod
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    cluster.grow(1000 + pods)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    stats = after.compare_to(before, "lineno")
    total = sum(s.size_diff for s in stats)
    sites = [{"site": f"{Path(s.traceback[0].filename).name}:{s.traceback[0].lineno}",
              "bytes_per_pod": round(s.size_diff / pods), "blocks_per_pod": round(s.count_diff / pods, 2)}
             for s in stats[:top] if s.size_diff > 0]
    return {"pods": pods, "bytes_per_pod": round(total / pods), "sites": sites}


def project(rows: list[dict], limit_mib: int) -> dict:
    """Per pod between the last two sizes; the pods that fit in the limit on that line."""
    a, b = rows[-2], rows[-1]
    slope = (b["rss_growth_mib"] - a["rss_growth_mib"]) * KB * KB / (b["pods"] - a["pods"])
    intercept = b["rss_growth_mib"] * KB * KB - slope * b["pods"]
    return {"bytes_per_pod": round(slope), "limit_mib": limit_mib,
            "pods_in_limit": int((limit_mib * KB * KB - intercept) / slope)}


def markdown(result: dict) -> str:
    lines = ["| pods | nodes | workloads | RSS growth | per pod |", "|---|---|---|---|---|"]
    lines += [f"| {r['pods']:,} | {r['nodes']:,} | {r['workloads']:,} | {r['rss_growth_mib']} MiB | "
              f"{r['rss_bytes_per_pod']} B |" for r in result["rss"]]
    p = result["projection"]
    lines += ["", f"Between the last two sizes: {p['bytes_per_pod']} bytes per pod; {p['pods_in_limit']:,} pods "
              f"fit in {p['limit_mib']} MiB (beside the process's own baseline).", ""]
    t = result["traced"]
    lines += [f"tracemalloc, {t['pods']:,} pods: {t['bytes_per_pod']} bytes per pod.", "",
              "| allocated at | bytes per pod | blocks per pod |", "|---|---|---|"]
    lines += [f"| `{s['site']}` | {s['bytes_per_pod']} | {s['blocks_per_pod']} |" for s in t["sites"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pod_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, nargs="+", default=[50_000, 150_000, 300_000],
                        help="sizes to measure RSS at, ascending (default: 50000 150000 300000)")
    parser.add_argument("--limit-mib", type=int, default=1024, help="the memory limit to project against")
    parser.add_argument("--top", type=int, default=12, help="allocation sites to list")
    parser.add_argument("--traced-only", type=int, metavar="PODS", help=argparse.SUPPRESS)
    add_out(parser, "pod-memory.json", beside=(".md",))
    args = parser.parse_args(argv)
    if args.traced_only:
        print(json.dumps(traced(args.traced_only, args.top)))
        return 0
    if len(args.pods) < 2 or any(a >= b for a, b in itertools.pairwise(args.pods)):
        parser.error("--pods: at least two sizes, each larger than the one before")
    rows = rss_pass(args.pods)
    say(f"tracing {args.pods[0]:,} pods in a second process ...")
    proc = subprocess.run([sys.executable, "-m", "bench.pod_memory", "--traced-only", str(args.pods[0]),
                           "--top", str(args.top)], capture_output=True, text=True, check=True)
    result = {"rss": rows, "projection": project(rows, args.limit_mib), "traced": json.loads(proc.stdout)}
    write_results(args.out, result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
