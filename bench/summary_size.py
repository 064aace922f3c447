"""Bytes per NodeSummary as the API server returns them, with and without managedFields.

One small control plane populated as `bench.scale` does (20 node groups, a tenth of the nodes
with 8 GPUs, 30 pods per node), the service started from each checkout in turn (summaries
deleted in between), then for each checkout:

- `GET /apis/.../nodesummaries` as the API server sends it (managedFields included: the server
  always returns them; kubectl drops them unless `--show-managed-fields`);
- the same list with `metadata.managedFields` removed (what `kubectl get -o json` prints);
- `kubectl get nodesummaries -o json` and `--show-managed-fields` (kubectl re-indents);
- the Table that plain `kubectl get nodesummaries` asks for (rows, and each object's metadata,
  managedFields included);
- per object: the median size of one `GET .../nodesummaries/<name>`, with and without managedFields,
  and the managers and operations in its managedFields.

    python -m bench.summary_size --nodes 200 --code /tmp/before . --out bench/results/summary-size.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from kubeindex.model.resources import NODE_SUMMARIES, WORKLOAD_SUMMARIES
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, wait_for

from .common import CRDS, ROOT, add_out, clean, revision, running_from, sayer
from .populate import populate_cluster

say = sayer("size")

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"  # what `kubectl get` asks for


def raw(cluster: LocalCluster, path: str, accept: str = "application/json") -> bytes:
    """The response body exactly as the API server sends it (JSON, no re-encoding)."""
    request = urllib.request.Request(f"{cluster.server}{path}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=30, context=cluster._ssl) as resp:
        return resp.read()


def compact(obj: object) -> int:
    """Bytes of ``obj`` encoded as the API server encodes JSON (no spaces)."""
    return len(json.dumps(obj, separators=(",", ":")).encode())


def without_managed_fields(obj: dict) -> dict:
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"}}


def workload_bytes(cluster: LocalCluster) -> dict:
    """The WorkloadSummaries of namespace bench as the API server returns them."""
    listed = json.loads(raw(cluster, WORKLOAD_SUMMARIES.path("bench")))
    items = listed["items"]
    sizes = sorted(compact(i) for i in items)
    bare = sorted(compact(without_managed_fields(i)) for i in items)
    return {"objects": len(items), "object_bytes_median": sizes[len(sizes) // 2] if sizes else 0,
            "object_bytes_without_managed_fields_median": bare[len(bare) // 2] if bare else 0,
            "sample": items[0] if items else None}


def measure(cluster: LocalCluster, code: Path, groups: int, workloads: int) -> dict:
    say(f"starting the service from {code} ({revision(code)}) ...")
    svc = Service(cluster)
    with running_from(code):
        svc.start()
    try:
        def written() -> bool:
            items = json.loads(raw(cluster, NODE_SUMMARIES.path()))["items"]
            return len(items) == groups and all(i.get("status", {}).get("nodeCount") for i in items)

        wait_for(written, timeout=120, interval=0.5)
        wait_for(lambda: workload_bytes(cluster)["objects"] == workloads, timeout=300, interval=1)
        time.sleep(3)  # past the write debounce: the status settled
        listed = raw(cluster, NODE_SUMMARIES.path())
        items = json.loads(listed)["items"]
        stripped = {**json.loads(listed), "items": [without_managed_fields(i) for i in items]}
        singles, singles_bare = [], []
        for item in items:
            one = raw(cluster, NODE_SUMMARIES.path(name=item['metadata']['name']))
            singles.append(len(one))
            singles_bare.append(compact(without_managed_fields(json.loads(one))))
        sample = next(i for i in items if "nvidia.com/gpu" in i["status"].get("allocatable", {}))
        managers = [{k: e.get(k) for k in ("manager", "operation", "subresource")} | {"bytes": compact(e)}
                    for e in sample["metadata"].get("managedFields", [])]
        result = {
            "checkout": str(code), "code": revision(code), "objects": len(items),
            "list_bytes": len(listed), "list_bytes_without_managed_fields": compact(stripped),
            "table_bytes": len(raw(cluster, NODE_SUMMARIES.path(), TABLE)),  # kubectl get, printed as a table
            "kubectl_json_bytes": len(cluster.kubectl("get", "nodesummaries", "-o", "json").stdout.encode()),
            "kubectl_json_managed_fields_bytes": len(cluster.kubectl(
                "get", "nodesummaries", "-o", "json", "--show-managed-fields").stdout.encode()),
            "object_bytes_median": statistics.median(singles),
            "object_bytes_without_managed_fields_median": statistics.median(singles_bare),
            "managed_fields": managers,
            "workloadsummaries": workload_bytes(cluster),
            "sample": without_managed_fields(sample),
            "printer_columns": cluster.kubectl("get", "nodesummaries", "-o", "wide").stdout.splitlines()[:3],
        }
    finally:
        svc.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.summary_size", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--code", type=Path, nargs="+", default=[ROOT], help="checkouts to run, in turn")
    add_out(parser, "summary-size.json")
    args = parser.parse_args(argv)
    pods = args.nodes * args.pods_per_node
    runs: list[dict] = []
    with LocalCluster(Options(controller_manager=False)) as cluster:
        cluster.install_crds(CRDS)
        say(f"{args.nodes} nodes / {pods} pods ...")
        populate_cluster(cluster.kubeconfig, args.nodes, args.groups, pods, max(1, pods // 50), concurrency=32)
        for code in args.code:
            if runs:
                clean(cluster)
            # Each checkout installs its own CRDs (a schema change is part of the checkout).
            cluster.install_crds(code.resolve() / "crds")
            runs.append(measure(cluster, code.resolve(), args.groups, max(1, pods // 50)))
            summary = {k: v for k, v in runs[-1].items() if k not in ("sample", "managed_fields")}
            say(json.dumps(summary))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs, indent=2) + "\n")
    for r in runs:
        print(f"{r['code']}: {r['objects']} NodeSummaries; per object {r['object_bytes_median']:.0f} B "
              f"({r['object_bytes_without_managed_fields_median']:.0f} B without managedFields); list "
              f"{r['list_bytes']} B ({r['list_bytes_without_managed_fields']} B); kubectl -o json "
              f"{r['kubectl_json_bytes']} B ({r['kubectl_json_managed_fields_bytes']} B with managedFields); "
              f"kubectl get (Table) {r['table_bytes']} B; WorkloadSummary "
              f"{r['workloadsummaries']['object_bytes_median']} B "
              f"({r['workloadsummaries']['object_bytes_without_managed_fields_median']} B without managedFields)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
