"""What reading JobSets and LeaderWorkerSets in full costs, for their gangs' sizes (docs/gangs.md):
their objects (a pod template each, managedFields: a few KB of JSON) through the live watch path
(a watch line's bytes -> msgspec decode into the size projection -> index), against the metadata-only
projection the same objects are read with as owners.

- **Bytes on the wire** per object event, as the API server sends it (JSON).
- **Microseconds per event**: the size projection (a few integers) and the metadata projection,
  decoding the same lines; and a status-only update (the common event: nothing sized moves).
- **Memory**: tracemalloc's bytes held per object (the reflector's store and the index's size).

    python -m bench.gang_sizes --objects 5000
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
import uuid
from typing import Any

from kubeindex.model.gangs import JOBSET, LWS, source_key
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import JobSet, LeaderWorkerSet, PartialObject
from kubeindex.watch.reflector import Handler, Reflector

from .common import add_out, run_and_write, sayer
from .index_events import watch_path

say = sayer("gang-sizes")
AT = "2026-11-22T10:00:00Z"


def pod_template(name: str) -> dict[str, Any]:
    container = {"name": "trainer", "image": "registry.invalid/train:v1", "command": ["python", "train.py"],
                 "env": [{"name": f"VAR_{k}", "value": "x" * 16} for k in range(8)],
                 "resources": {"requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "8"},
                               "limits": {"nvidia.com/gpu": "8"}},
                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    return {"metadata": {"labels": {"app": name}},
            "spec": {"restartPolicy": "Never", "containers": [container],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}}


def meta(kind: str, i: int, rv: int) -> dict[str, Any]:
    return {"name": f"{kind.lower()}-{i:06d}", "namespace": "bench", "uid": str(uuid.UUID(int=i, version=4)),
            "resourceVersion": str(rv), "generation": 1, "creationTimestamp": AT,
            "managedFields": [{"manager": m, "operation": "Update", "apiVersion": "v1", "time": AT,
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {f"f:{k}": {} for k in range(20)}}}
                              for m in ("kubectl", "controller")]}


def jobset_json(i: int, rv: int) -> dict[str, Any]:
    """A JobSet of a driver and workers (1 + 4 Jobs of parallelism 4), with its status."""
    jobs = [{"name": n, "replicas": r, "template": {"spec": {"parallelism": p, "completions": p, "backoffLimit": 0,
                                                              "template": pod_template(n)}}}
            for n, r, p in (("driver", 1, 1), ("workers", 4, 4))]
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": JOBSET, "metadata": meta(JOBSET, i, rv),
            "spec": {"replicatedJobs": jobs, "successPolicy": {"operator": "All"}},
            "status": {"replicatedJobsStatus": [{"name": n, "ready": rv % 5, "active": 4, "succeeded": 0,
                                                 "failed": 0, "suspended": 0} for n in ("driver", "workers")],
                       "restarts": 0, "terminalState": ""}}


def lws_json(i: int, rv: int) -> dict[str, Any]:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": LWS, "metadata": meta(LWS, i, rv),
            "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 8, "workerTemplate": pod_template("worker"),
                                                              "leaderTemplate": pod_template("leader")}},
            "status": {"readyReplicas": rv % 3, "replicas": 2, "updatedReplicas": 2}}


def reflectors(index: ClusterIndex) -> dict[str, Reflector]:
    api = watch_path()[1].api  # never asked anything: only _handle(line) runs

    def sized(kind: str) -> Handler:
        return Handler(lambda o: index.set_gang_size(source_key(kind, o.metadata.namespace, o.metadata.name),
                                                     o.gang_size()),
                       lambda key: index.set_gang_size(source_key(kind, *key.split("/")), None))

    return {JOBSET: Reflector(api, "jobsets.gangs", "", JobSet, sized(JOBSET)),
            LWS: Reflector(api, "leaderworkersets.gangs", "", LeaderWorkerSet, sized(LWS))}


def lines(kind: str, objects: int, rv: int, event: str) -> list[bytes]:
    make = jobset_json if kind == JOBSET else lws_json
    return [json.dumps({"type": event, "object": make(i, rv + i)}).encode() for i in range(objects)]


def timed(reflector: Reflector, batch: list[bytes]) -> float:
    started = time.perf_counter()
    for line in batch:
        reflector._handle(line)
    return (time.perf_counter() - started) * 1e6 / len(batch)


def run(args: argparse.Namespace) -> dict:
    result: dict[str, Any] = {"objects": args.objects}
    for kind in (JOBSET, LWS):
        index = ClusterIndex()
        sizes = reflectors(index)[kind]
        owners = Reflector(sizes.api, "owners", "", PartialObject, Handler(lambda o: None, lambda k: None),
                           metadata_only=True)
        added, updated = lines(kind, args.objects, 10, "ADDED"), lines(kind, args.objects, 10 + args.objects,
                                                                       "MODIFIED")
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        us_added = timed(sizes, added)
        gc.collect()
        held = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
        tracemalloc.stop()
        row = {"bytes_per_event": round(sum(map(len, updated)) / len(updated)),
               "us_per_event_added_traced": round(us_added, 1),
               "us_per_event_status_update": round(timed(sizes, updated), 2),
               "us_per_event_metadata_projection": round(timed(owners, updated), 2),
               "bytes_held_per_object": round(held / args.objects),
               "gang_size": next(iter(index.gang_sizes.values()))}
        result[kind] = row
        say(f"{kind}: {row}")
    return result


def markdown(result: dict) -> str:
    rows = ["| kind | bytes per event (JSON) | µs per status update, size projection | µs, metadata projection "
            "| bytes held per object |", "|---|---|---|---|---|"]
    rows += [f"| {kind} | {r['bytes_per_event']:,} | {r['us_per_event_status_update']} | "
             f"{r['us_per_event_metadata_projection']} | {r['bytes_held_per_object']} |"
             for kind, r in result.items() if isinstance(r, dict)]
    return f"{result['objects']:,} objects of each kind.\n\n" + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gang_sizes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=5000, help="JobSets, and LeaderWorkerSets (default: 5000)")
    add_out(parser, "gang-sizes.json", beside=(".md",))
    return run_and_write(parser, argv, run, markdown)


if __name__ == "__main__":
    raise SystemExit(main())
