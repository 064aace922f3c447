"""NotReady -> /metrics against its floor, and where the rest goes.

One control plane populated as `bench.scale` does; the service started from each checkout in turn
(summaries deleted in between) with `bench/trace/sitecustomize.py` loaded (it stamps, inside the
service, each node event handled, each /metrics render, each reconciler pass, each garbage
collection and each event-loop stall); then `bench.scale.not_ready_latency` (with its plain watch
on nodes, the floor). Per round:

    patched -> the plain watch saw it (floor) -> the service handled the event (decode + index)
    -> the next /metrics render began (the bench's poll) -> it ended -> the bench had the text

    python -m bench.latency_floor --nodes 2000 --code /tmp/before . --out bench/results/latency-floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from localkube.cluster import LocalCluster, Options
from localkube.service import Service

from .common import CRDS, ROOT, add_out, clean, p50_p99_ms, percentile_ms, revision, running_from, sayer, writes_settled
from .populate import populate_cluster
from .scale import not_ready_latency

say = sayer("floor")

TRACE = Path(__file__).resolve().parent / "trace"


def breakdown(marks: list[dict], trace: list[dict], node: str) -> dict:
    """Per round, the stages between the PATCH and the bench reading /metrics, from the trace."""
    nodes = [r for r in trace if r["k"] == "node" and r["name"] == node]
    renders = sorted((r for r in trace if r["k"] == "render"), key=lambda r: r["t"])
    rounds = []
    for i, m in enumerate(marks):
        ready = "False" if i % 2 == 0 else "True"
        patched, shown = m["patched"], m["metrics_showed"]
        event = next((r for r in nodes if r["t"] >= patched and r["ready"] == ready), None)
        if event is None:
            continue
        handled = event["t"] + event["d"]
        render = next((r for r in renders if r["t"] >= handled), None)
        inside = [r for r in trace if r["k"] in ("gc", "lag", "refresh") and patched <= r["t"] <= shown]
        rounds.append({
            "total": shown - patched,
            "floor": (m["watch_saw"] or shown) - patched,
            "to_service": event["t"] - patched,  # the line read and its turn on the loop
            "service_minus_floor": event["t"] - (m["watch_saw"] or event["t"]),
            "handle": event["d"],  # decode + index update
            "to_render": (render["t"] - handled) if render else None,  # waiting for the bench's next poll
            "render": render["d"] if render else None,
            "delivered": (shown - render["t"] - render["d"]) if render else None,  # transfer + the bench's search
            "stalls": sum(r["d"] for r in inside if r["k"] == "lag"),
            "gc": [(r["gen"], round(r["d"] * 1000, 1)) for r in inside if r["k"] == "gc" and r["d"] > 0.005],
            "refresh": sum(r["d"] for r in inside if r["k"] == "refresh"),
        })
    stages = ("total", "floor", "to_service", "service_minus_floor", "handle", "to_render", "render", "delivered",
              "stalls", "refresh")
    out: dict = {"rounds": len(rounds)}
    for stage in stages:
        values = [r[stage] for r in rounds if r[stage] is not None]
        if values:
            out[f"{stage}_ms"] = _spread_ms(values)
    out["per_round_ms"] = [{k: (round(v * 1000, 1) if isinstance(v, float) else v) for k, v in r.items()}
                           for r in rounds]
    return out


def _spread_ms(seconds: list[float]) -> dict:
    """p50, p99 (whole ms) and max (0.1 ms) of some durations, at least one."""
    p50, p99 = p50_p99_ms(seconds)
    return {"p50": p50, "p99": p99, "max": round(max(seconds) * 1000, 1)}


def whole_run(trace: list[dict], since: float) -> dict:
    """Over the latency phase: garbage collections, stalls, renders, reconciler passes."""
    phase = [r for r in trace if r["t"] >= since]
    gcs = [r for r in phase if r["k"] == "gc"]
    by_gen = {}
    for gen in (0, 1, 2):
        ds = [r["d"] for r in gcs if r["gen"] == gen]
        if ds:
            by_gen[str(gen)] = {"count": len(ds), "max_ms": round(max(ds) * 1000, 1),
                                "p99_ms": percentile_ms(ds, 0.99, 1),
                                "total_ms": round(sum(ds) * 1000)}
    lags = [r["d"] for r in phase if r["k"] == "lag"]
    # What each stall overlapped: a stall is the loop late for its 5 ms sleep, so anything that ran
    # on the loop between the sleep's start and its end is a suspect.
    suspects = [r for r in phase if r["k"] in ("gc", "render", "refresh", "node")]
    causes: dict[str, float] = {}
    for lag in (r for r in phase if r["k"] == "lag"):
        end = lag["t"] + 0.005 + lag["d"]
        found = {r["k"] + (str(r["gen"]) if r["k"] == "gc" else "") for r in suspects
                 if r["t"] < end and r["t"] + r.get("d", 0) > lag["t"] and r.get("d", 0) > 0.002}
        key = "+".join(sorted(found)) or "other (writes, watch reads, HTTP)"
        causes[key] = causes.get(key, 0) + lag["d"]
    renders = [r for r in phase if r["k"] == "render"]
    refresh = [r["d"] for r in phase if r["k"] == "refresh"]
    seconds = (max(r["t"] for r in phase) - since) if phase else 0
    cpu: dict[str, dict | int] = {}  # traces since the cpu field: the thread's own CPU, against the wall time above
    for kind in ("render", "refresh", "lag"):
        own = [r["cpu"] for r in phase if r["k"] == kind and "cpu" in r]
        if own:
            cpu[f"{kind}_cpu_ms"] = _spread_ms(own)
    waiting = [r for r in phase if r["k"] == "lag" and "cpu" in r and r["cpu"] < r["d"] / 2]
    if waiting:
        cpu["stalls_mostly_waiting_for_a_core"] = len(waiting)
    return {
        "seconds": round(seconds, 1),
        "gc": by_gen,
        "stalls_over_10ms": len(lags), "stall_max_ms": round(max(lags, default=0) * 1000, 1),
        "stall_ms_by_overlap": {k: round(v * 1000) for k, v in sorted(causes.items(), key=lambda kv: -kv[1])},
        "stall_p99_ms": percentile_ms(lags, 0.99, 1) if lags else 0,
        "renders": len(renders),
        "render_ms": dict(zip(("p50", "p99"), p50_p99_ms([r["d"] for r in renders]), strict=True)) if renders else {},
        "render_bytes": renders[-1]["bytes"] if renders else 0,
        "refresh_passes_over_1ms": len(refresh),
        "refresh_ms": _spread_ms(refresh) if refresh else {},
        **cpu,
    }


def measure(cluster: LocalCluster, code: Path, args: argparse.Namespace, node: str, group: str) -> dict:
    trace = Path(cluster.workdir) / f"trace-{len(os.listdir(cluster.workdir))}.jsonl"
    say(f"starting the service from {code} ({revision(code)}) ...")
    svc = Service(cluster, tuple(args.service_args))
    with running_from(code):
        os.environ["PYTHONPATH"] = f"{TRACE}:{code}"
        os.environ["NWS_TRACE"] = str(trace)
        try:
            svc.start()
        finally:
            del os.environ["NWS_TRACE"]
    try:
        summaries = args.groups + max(1, args.nodes * args.pods_per_node // 50)
        say(f"settled after {writes_settled(svc, summaries):.0f} s; NotReady latency, {args.rounds} rounds ...")
        since = time.monotonic()
        latency = not_ready_latency(cluster, svc, node, group, args.rounds)
        time.sleep(1)  # the trace is flushed every 0.5 s
    finally:
        svc.stop()
    records = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    if args.keep_trace:
        args.keep_trace.mkdir(parents=True, exist_ok=True)
        (args.keep_trace / f"{revision(code)}-{trace.name}").write_text(trace.read_text())
    marks = latency.pop("marks")
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {"checkout": str(code), "code": revision(code), "nodes": args.nodes, "pods": args.nodes * args.pods_per_node,
            "service_args": args.service_args, "load_average": load, "latency": latency,
            "breakdown": breakdown(marks, records, node), "phase": whole_run(records, since)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency_floor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=1, help="rounds over --code")
    parser.add_argument("--code", type=Path, nargs="+", default=[ROOT], help="checkouts to run, in turn")
    parser.add_argument("--service-args", nargs="*", default=[], help="more flags for the service")
    add_out(parser, "latency-floor.json")  # every run, rewritten after each
    parser.add_argument("--keep-trace", type=Path, help="copy each run's trace (JSON lines) into this directory")
    args = parser.parse_args(argv)
    pods = args.nodes * args.pods_per_node
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    with LocalCluster(Options(controller_manager=False, extra_apiserver_args=["--max-requests-inflight=4000"])) \
            as cluster:
        cluster.install_crds(CRDS)
        say(f"{args.nodes} nodes / {pods} pods: populating ...")
        populate_cluster(cluster.kubeconfig, args.nodes, args.groups, pods, max(1, pods // 50))
        for _ in range(args.repeat):
            for code in args.code:
                if runs:
                    say("deleting the summaries ...")
                    clean(cluster)
                runs.append(measure(cluster, code.resolve(), args, "node-00001", "pool-1"))
                r = runs[-1]
                say(json.dumps({k: r[k] for k in ("code", "load_average", "phase")}))
                say(json.dumps({k: v for k, v in r["breakdown"].items() if k != "per_round_ms"}))
                args.out.write_text(json.dumps(runs, indent=2) + "\n")
    for r in runs:
        lat, b = r["latency"], r["breakdown"]
        print(f"{r['code']} ({r['checkout']}), load {' '.join(r['load_average'])}: NotReady -> /metrics "
              f"p50/p99 {lat['metric_p50_ms']}/{lat['metric_p99_ms']} ms; floor {lat['floor_p50_ms']}/"
              f"{lat['floor_p99_ms']} ms; ours minus floor {lat['over_floor_p50_ms']}/{lat['over_floor_p99_ms']} ms; "
              + "; ".join(f"{k[:-3]} {v['p50']}/{v['p99']}" for k, v in b.items() if isinstance(v, dict)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
