"""Garbage collection pauses on the service's event loop, without an API server: the index built
from watch lines (`bench.index_events`), then for ``--seconds`` pod events at ``--rate`` per
second, a reconciler pass every 0.2 s and a /metrics render every 0.5 s on one asyncio loop, with
a 5 ms ticker measuring how late the loop is (wall time) and how much of that was this thread's
own CPU (thread_time: what preemption by other processes does not explain). Each variant in turn
in a fresh process: ``plain`` (Python's collector as it is) and ``freeze``
(node_workload_summary.gcfreeze.Freezer, as the service runs it).

    python -m bench.gc_pauses --pods 150000 --seconds 60 --repeat 2 --out bench/results/gc-pauses.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import time

import prometheus_client

from exporter.metrics import Renderer
from kubeindex.model.revision import Stamped
from node_workload_summary.gcfreeze import Freezer
from reconciler.desired import Naming, TypeInfo, desired_state

from .common import add_out
from .index_events import build


def _at(values: list[float], q: float) -> float:
    """Milliseconds at rank int(n * q) (the higher neighbour; 0.0 for a run of no ticks): not
    bench.common.percentile's nearest rank, so that new runs compare with the recorded ones."""
    values = sorted(values)
    return round(values[min(len(values) - 1, int(len(values) * q))] * 1000, 1) if values else 0.0


async def _run(args: argparse.Namespace) -> dict:
    build_args = argparse.Namespace(pods=args.pods, nodes=args.pods // 30, workloads=args.pods // 50,
                                    events=args.pods + int(args.rate * args.seconds))
    index, reflector, lines = build(build_args)
    for i, line in enumerate(lines[:args.pods]):  # the initial sync, the loop a turn per 200 events (FRAMES_PER_TURN)
        reflector._handle(line)
        if i % 200 == 0:
            await asyncio.sleep(0)
    churn = lines[args.pods:]
    infos = {("apps", "Deployment"): TypeInfo("apps/v1", "deploy", "deployment.apps/v1")}
    cache: Stamped = Stamped()
    naming = Naming.empty()
    renderer = Renderer(index, 100_000, registry=prometheus_client.CollectorRegistry())
    ready = asyncio.Event()
    freezer = asyncio.create_task(Freezer().run(ready)) if args.variant == "freeze" else None
    ready.set()
    await asyncio.sleep(0.5)  # the Freezer's first full collection is part of the start, not measured
    full: list[float] = []
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif info["generation"] == 2:
            full.append(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)
    end = time.monotonic() + args.seconds
    lags: list[float] = []
    own: list[float] = []

    async def feed() -> None:
        i = 0
        while time.monotonic() < end:
            for _ in range(max(1, int(args.rate // 20))):
                reflector._handle(churn[i % len(churn)])
                i += 1
            await asyncio.sleep(0.05)

    async def passes() -> None:
        while time.monotonic() < end:
            desired_state(index, {"pool": "u", "zone": "z"}, infos, cache, naming)
            await asyncio.sleep(0.2)

    async def scrapes() -> None:
        while time.monotonic() < end:
            renderer.render()
            await asyncio.sleep(0.5)

    async def ticker() -> None:
        while time.monotonic() < end:
            t, c = time.monotonic(), time.thread_time()
            await asyncio.sleep(0.005)
            lags.append(time.monotonic() - t - 0.005)
            own.append(time.thread_time() - c)

    await asyncio.gather(feed(), passes(), scrapes(), ticker())
    gc.callbacks.remove(on_gc)
    if freezer is not None:
        freezer.cancel()
    return {"variant": args.variant, "pods": args.pods, "seconds": args.seconds, "pod_events_per_second": args.rate,
            "full_collections": len(full), "full_collection_max_ms": round(max(full, default=0) * 1000, 1),
            "full_collection_total_ms": round(sum(full) * 1000),
            "loop_late_p99_ms": _at(lags, 0.99), "loop_late_p999_ms": _at(lags, 0.999),
            "loop_late_max_ms": _at(lags, 1.0), "loop_late_over_50ms": sum(1 for x in lags if x > 0.05),
            "own_cpu_per_tick_max_ms": _at(own, 1.0), "ticks_with_over_50ms_own_cpu": sum(1 for x in own if x > 0.05)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gc_pauses", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=60000)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rate", type=float, default=400, help="pod events per second")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--variant", choices=["plain", "freeze"],
                        help="one run of one variant, in this process (prints, writes no file)")
    add_out(parser, "gc-pauses.json")
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(asyncio.run(_run(args))))
        return 0
    runs = []
    for _ in range(args.repeat):
        for variant in ("plain", "freeze"):
            with open("/proc/loadavg") as f:
                load = f.read().split()[:3]
            command = [sys.executable, "-m", "bench.gc_pauses", "--variant", variant, "--pods", str(args.pods),
                       "--seconds", str(args.seconds), "--rate", str(args.rate)]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            runs.append(json.loads(out) | {"load_average_before": load})
            print(json.dumps(runs[-1]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
