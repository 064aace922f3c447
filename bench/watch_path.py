"""A pod's watch event through the service's code, with the CPU's caches warm and cold.

Real protobuf watch events (pods created, then their phases flipped, as `bench.populate.churn`
does) are read from a local control plane, then replayed through the code a live watch runs after
the socket: the reflector (decode), Sources and the index. No network.

- **hot**: the events back to back, as a microbenchmark runs them;
- **cold**: N MB of memory read between two events, as the API server's and the other processes'
  work between two events does to the caches on a shared machine (under churn the service wakes
  for each event: they come one by one).

    python -m bench.watch_path --pods 300 --evict 2 16

Prints µs per event (the best of --rounds) and writes bench/results/watch-path.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable

from kubernetes import client

from kubeindex.client import protobuf
from kubeindex.client.api import ApiClient, Connection, load_connection
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import Pod, WorkloadType
from kubeindex.model.resources import PODS
from kubeindex.watch.reflector import Handler, Reflector
from kubeindex.watch.sources import Sources
from localkube.cluster import LocalCluster, Options

from .common import add_out, run_and_write, sayer
from .populate import pod_manifest

say = sayer("watch-path")
NS = "bench"
REPLICASET = {"metadata": {"name": "web-5d8f", "uid": "5d8f0000-0000-4000-8000-000000000001"}}


async def capture(cluster: LocalCluster, pods: int, flips: int, namespace: str = NS) -> list[bytes]:
    """The watch's frames: ``pods`` ADDED, then ``flips`` rounds of MODIFIED (a phase flip each),
    in a new namespace."""
    frames: list[bytes] = []
    async with ApiClient(load_connection(str(cluster.kubeconfig))) as api:
        await api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": namespace}})
        watch = asyncio.create_task(api.watch(PODS.path(namespace), {"watch": "1"},
                                              protobuf.ACCEPT_WATCH, 60, frames.append))
        for i in range(pods):
            pod = pod_manifest(f"web-5d8f-{i:05d}", f"node-{i % 10:05d}", REPLICASET, "web")
            pod["metadata"]["namespace"] = namespace
            await api.request("POST", PODS.path(namespace), pod)
        for n in range(flips):
            for i in range(pods):
                await api.request("PATCH", PODS.path(namespace, f"web-5d8f-{i:05d}", "status"),
                                  {"status": {"phase": "Pending" if n % 2 else "Running"}},
                                  content_type="application/merge-patch+json")
        deadline = time.monotonic() + 30
        while len(frames) < pods * (1 + flips) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    return frames


def replayer(api: ApiClient, frames: list[bytes],
             namespace: str = NS) -> tuple[Callable[[bytes], None], list[bytes], Sources]:
    """The reflector's frame handler, fed the ADDED events; the MODIFIED ones to replay; and the
    Sources and index they go to, where the pods' ReplicaSet is a summarized workload. Runs in an
    event loop (Sources may start lookups, which ``api`` fails: ``Sources.stop`` when done)."""
    index = ClusterIndex()
    index.set_node_summarizer("pool", "cloud.google.com/gke-nodepool")
    index.set_workload_summarizer("apps", [WorkloadType(kind="ReplicaSet", group="apps")])
    meta = REPLICASET["metadata"]
    index.upsert_owner(("apps", "ReplicaSet"), namespace, meta["name"], meta["uid"], None)
    sources = Sources(api, index)
    reflector = Reflector(api, "pods", "", Pod, Handler(sources._pod_upsert, sources._pod_delete))
    reflector._opened(protobuf.ACCEPT_WATCH)
    modified = []
    for frame in frames:
        if protobuf.event(frame)[0] == "MODIFIED":
            modified.append(frame)
        else:
            reflector._on_frame(frame)
    return reflector._on_frame, modified, sources


def nowhere() -> ApiClient:
    """A client for the replay: the port is closed, so a lookup it starts fails at once."""
    return ApiClient(Connection("https://127.0.0.1:1", False, client.Configuration()))


def per_event(on_frame: Callable[[bytes], None], frames: list[bytes], evict: bytearray | None) -> float:
    """µs of CPU per event, the caches evicted (``evict`` read) between events if given."""
    spent = 0.0
    for frame in frames:
        if evict is not None:
            bytes(evict)  # a copy reads every cache line of it (and writes as many)
        started = time.thread_time()
        on_frame(frame)
        spent += time.thread_time() - started
    return spent / len(frames) * 1e6


def run(args: argparse.Namespace) -> dict:
    with LocalCluster(Options(controller_manager=False)) as cluster:
        say(f"capturing the watch events of {args.pods} pods and {args.flips} phase flips of each ...")
        frames = asyncio.run(capture(cluster, args.pods, args.flips))

    async def replay() -> dict:
        async with nowhere() as api:
            on_frame, modified, sources = replayer(api, frames)
            decode = protobuf.CODECS[Pod]
            results = {"hot": min(per_event(on_frame, modified, None) for _ in range(args.rounds)),
                       "decode only, hot": min(per_event(lambda f: decode.object(protobuf.event(f)[1]), modified, None)
                                               for _ in range(args.rounds))}
            for mb in args.evict:
                buffer = bytearray(mb << 20)
                results[f"cold ({mb} MB read between events)"] = min(
                    per_event(on_frame, modified, buffer) for _ in range(args.rounds))
            await sources.stop()
        return {"events": len(modified), "avg_event_bytes": round(sum(map(len, modified)) / len(modified)),
                "us_per_event": {k: round(v, 1) for k, v in results.items()}}

    return asyncio.run(replay())


def markdown(r: dict) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in r["us_per_event"].items())
    return (f"{r['events']} pod watch events (phase flips, {r['avg_event_bytes']} bytes each in protobuf), "
            f"through decode, Sources and the index:\n\n| run | µs per event |\n|---|---|\n{rows}\n")


def even(text: str) -> int:
    """--flips' type."""
    if int(text) % 2:
        raise argparse.ArgumentTypeError(f"{text} is odd")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.watch_path", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--flips", type=even, default=2,
                        help="phase flips of each pod, even: each replay then ends in the phase it began with, "
                             "so every replayed event changes the phase")
    parser.add_argument("--evict", type=int, nargs="*", default=[2, 16], metavar="MB",
                        help="memory read between events in the cold runs")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each; the best is kept")
    add_out(parser, "watch-path.json", beside=(".md",))
    return run_and_write(parser, argv, run, markdown)


if __name__ == "__main__":
    sys.exit(main())
