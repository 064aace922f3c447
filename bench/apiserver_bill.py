"""What a start of the service costs the API server (kube-apiserver + etcd), for each way of the
initial list (--initial-list) and each encoding of pods and nodes (--encoding), on one populated
local control plane. A mode is an --initial-list mode, with pods and nodes in protobuf (the
default), or with ``-json`` after it in JSON, and ``:N`` for a --page-size of N: `auto` (the
default), `watchlist`, `watchlist-json`, `list`, `list:5000`, `list-json:5000`, ... The started program's own peak RSS
is recorded too (what a larger page costs the service's side).

For each start: kube-apiserver and etcd CPU seconds (utime + stime from /proc/<pid>/stat) and
peak RSS increase (VmRSS sampled every 100 ms, peak minus the baseline just before the start),
bytes the API server wrote (/proc/<pid>/io wchar: TLS on the wire to the service, gzip included
where the server compressed; plus the API server's own uncompressed count of LIST responses and
watch events), its LIST/WATCH requests, the watch cache's and etcd's answers, and the time from
the process start to /readyz 200. The service runs with --no-reconciler (no summary writes, which
only the first start would make). Modes alternate in order between repeats; the API server is left
to settle between starts (CPU idle, then a garbage collection it is asked for: `settle`), and
what a start allocates on its Go heap is counted (the collections it will cost, which would
otherwise land on whichever start happens to be running). Another program can be measured the same way:
start_and_measure() takes any command line and the URL that answers 200 once it is ready (or a
readiness check of its own). Mode `ksm` starts
kube-state-metrics instead (built from its Go module on first use; bench/ksm.py's flags), ready at
its first complete scrape: every node, pod, Deployment and ReplicaSet in it (its /readyz says only
that its self-metrics registry is not empty).

    python -m bench.apiserver_bill --nodes 1000 --repeat 2
    python -m bench.apiserver_bill --nodes 1000 --repeat 2 --modes watchlist watchlist-json ksm \\
        --out bench/results/apiserver-bill-ksm.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from localkube.cluster import LocalCluster, Options, free_port, set_parent_death_signal
from localkube.ksm import KubeStateMetrics
from localkube.service import parse, value

from .common import CRDS, Sampler, add_out, control_plane_pids, cpu_seconds, run_and_write, say, status_kb
from .populate import POOL_LABEL, populate_cluster

MODES = ("auto", "watchlist", "list", "cache")  # auto: the default (pages of 20,000 on this version)
JSON_MODES = tuple(f"{m}-json" for m in MODES)  # the same, with pods and nodes in JSON
KSM = "ksm"  # not an --initial-list mode: kube-state-metrics started instead of the service
READY_TIMEOUT = 600.0


def written_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


# API server metrics summed over their labels (a label filter each: only the watched resources).
COUNTERS = {
    "list_requests": ("apiserver_request_total", {"verb": "LIST"}),
    "watch_requests": ("apiserver_request_total", {"verb": "WATCH"}),
    "list_response_bytes": ("apiserver_response_sizes_sum", {"verb": "LIST"}),
    "watch_event_bytes": ("apiserver_watch_events_sizes_sum", {}),
    "cache_lists": ("apiserver_cache_list_total", {}),
    "cache_list_objects": ("apiserver_cache_list_fetched_objects_total", {}),
    "consistent_reads_from_cache": ("apiserver_watch_cache_consistent_read_total", {}),
    "etcd_requests": ("etcd_requests_total", {}),
    "etcd_list_objects": ("apiserver_storage_list_fetched_objects_total", {}),
    "allocated_bytes": ("go_memstats_alloc_bytes_total", {}),  # the Go heap's allocations: the GC's work
}


def apiserver_counters(cluster: LocalCluster) -> dict[str, float]:
    _, text = _get(f"{cluster.server}/metrics", cluster)
    samples = parse(text)
    out = {}
    for key, (name, labels) in COUNTERS.items():
        want = set(labels.items())
        out[key] = sum(v for (n, lbl), v in samples.items() if n == name and want <= lbl)
    return out


def _get(url: str, cluster: LocalCluster | None = None) -> tuple[int, str]:
    context = cluster._ssl if cluster is not None else None
    try:
        with urllib.request.urlopen(url, timeout=30, context=context) as resp:
            return resp.status, resp.read().decode()
    except OSError as err:
        return 0, str(err)


def settle(cluster: LocalCluster, pids: dict[str, int], least: float, idle: float = 0.05) -> None:
    """Wait at least ``least`` seconds, then until the control plane is idle (under ``idle`` CPU
    seconds per second over 2 s), then have kube-apiserver collect its garbage: every start
    begins from the same heap, so a collection that the previous start's garbage (or the Go
    runtime's two-minute timer) would have brought is not billed to this one. What a start makes
    the collector do later is its ``allocated_bytes``."""
    time.sleep(least)
    for _ in range(60):
        before = sum(cpu_seconds(p) for p in pids.values())
        time.sleep(2)
        if (sum(cpu_seconds(p) for p in pids.values()) - before) / 2 < idle:
            break
    code, text = _get(f"{cluster.server}/debug/pprof/heap?gc=1&debug=1", cluster)  # runtime.GC(), then a profile
    if code != 200:
        raise RuntimeError(f"kube-apiserver's /debug/pprof/heap answered {code}: {text[:200]}")
    time.sleep(2)  # the collection's background work done


def start_and_measure(cluster: LocalCluster, argv: list[str], ready_url: str, after: float = 2.0,
                      ready_check: Callable[[], bool] | None = None) -> dict:
    """Start ``argv``, wait until ``ready_url`` answers 200 (or ``ready_check()`` is true), keep
    measuring ``after`` seconds more, stop it; the API server's and etcd's bill for that start."""
    is_ready = ready_check or (lambda: _get(ready_url)[0] == 200)
    pids = control_plane_pids(cluster, "apiserver", "etcd")
    base_rss = {name: status_kb(pid, "VmRSS") for name, pid in pids.items()}
    base_cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
    base_counters = apiserver_counters(cluster)
    base_written = written_bytes(pids["apiserver"])
    sampler = Sampler(pids)
    sampler.start()
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=lambda: set_parent_death_signal(9))
    try:
        while not is_ready():
            if proc.poll() is not None or time.monotonic() - started > READY_TIMEOUT:
                raise RuntimeError(f"{argv[0]} exited or was not ready in time ({proc.poll()})")
            time.sleep(0.05)
        ready = time.monotonic() - started
        time.sleep(after)
        extra = _extra_metrics(ready_url) if ready_check is None else {}
    finally:
        peak = sampler.stop()
        cpu = {name: cpu_seconds(pid) - base_cpu[name] for name, pid in pids.items()}
        written = written_bytes(pids["apiserver"]) - base_written
        started_peak_mb = status_kb(proc.pid, "VmHWM") / 1024 if proc.poll() is None else None
        proc.terminate()
        proc.wait(30)
    counters = apiserver_counters(cluster)
    return {
        "ready_seconds": round(ready, 2),
        "apiserver_cpu_seconds": round(cpu["apiserver"], 2),
        "etcd_cpu_seconds": round(cpu["etcd"], 2),
        "apiserver_peak_rss_increase_mb": round((peak["apiserver"] - base_rss["apiserver"]) / 1024, 1),
        "etcd_peak_rss_increase_mb": round((peak["etcd"] - base_rss["etcd"]) / 1024, 1),
        "apiserver_baseline_rss_mb": round(base_rss["apiserver"] / 1024, 1),
        "apiserver_wrote_mb": round(written / 1e6, 1),
        "apiserver_allocated_mb": round((counters["allocated_bytes"] - base_counters["allocated_bytes"]) / 1e6, 1),
        **{k: round(counters[k] - base_counters[k]) for k in COUNTERS},
        **({"started_peak_rss_mb": round(started_peak_mb, 1)} if started_peak_mb is not None else {}),
        **extra,
    }


def _extra_metrics(ready_url: str) -> dict:
    """The service's own view of the sync, when it serves one."""
    code, text = _get(ready_url.replace("/readyz", "/metrics"))
    sync = value(parse(text), "nws_initial_sync_duration_seconds") if code == 200 else None
    return {"service_sync_seconds": round(sync, 2)} if sync is not None else {}


def parse_mode(text: str) -> tuple[str, str, str]:
    """A --modes word -> (--initial-list mode, encoding, page size or ""); ksm -> ("ksm", "", "")."""
    mode, colon, page_size = text.partition(":")
    if mode not in (*MODES, *JSON_MODES, KSM) or (colon and (mode == KSM or not page_size.isdigit())):
        raise argparse.ArgumentTypeError(f"not a mode: {text!r} (one of {', '.join((*MODES, *JSON_MODES, KSM))}, "
                                         "an --initial-list mode may take :PAGE_SIZE)")
    initial_list, _, encoding = mode.partition("-")
    return initial_list, encoding or ("" if mode == KSM else "protobuf"), page_size


def mode_name(text: str) -> str:
    """A --modes word, checked (parse_mode)."""
    parse_mode(text)
    return text


def service_argv(cluster: LocalCluster, mode: str, port: int) -> list[str]:
    initial_list, encoding, page_size = parse_mode(mode)
    return [sys.executable, "-m", "node_workload_summary.main", f"--kubeconfig={cluster.kubeconfig}",
            "--listen-address=127.0.0.1", f"--port={port}", "--no-reconciler", f"--initial-list={initial_list}",
            f"--encoding={encoding}", *([f"--page-size={page_size}"] if page_size else [])]


def run(args: argparse.Namespace) -> dict:
    pods = args.nodes * args.pods_per_node
    result: dict = {"nodes": args.nodes, "pods": pods, "modes": args.modes, "repeat": args.repeat, "runs": []}
    # --profiling: /debug/pprof/heap?gc=1 collects the garbage before each start (settle)
    with LocalCluster(Options(extra_apiserver_args=["--max-requests-inflight=4000", "--profiling=true"])) as cluster:
        cluster.install_crds(CRDS)
        say(f"populating {args.nodes} nodes / {pods} pods")
        seconds = populate_cluster(cluster.kubeconfig, args.nodes, args.groups, pods, args.workloads)
        result["populate_seconds"] = round(seconds, 1)
        pids = control_plane_pids(cluster, "apiserver", "etcd")
        for r in range(args.repeat):
            order = args.modes if r % 2 == 0 else list(reversed(args.modes))
            for mode in order:
                settle(cluster, pids, args.settle)
                port = free_port()
                if mode == KSM:
                    run_ = {"mode": mode, "round": r} | measure_ksm(cluster, args)
                else:
                    run_ = {"mode": mode, "round": r} | start_and_measure(
                        cluster, service_argv(cluster, mode, port), f"http://127.0.0.1:{port}/readyz")
                say(json.dumps(run_))
                result["runs"].append(run_)
    result["median"] = summary(result["runs"], args.modes)
    return result


def measure_ksm(cluster: LocalCluster, args: argparse.Namespace) -> dict:
    """A start of kube-state-metrics, ready at its first complete scrape."""
    ksm = KubeStateMetrics(cluster, node_labels=(POOL_LABEL,))  # bench/ksm.py's flags
    expected = {"kube_node_info": args.nodes, "kube_pod_info": args.nodes * args.pods_per_node,
                "kube_deployment_created": args.workloads, "kube_replicaset_created": args.workloads}
    return start_and_measure(cluster, ksm.argv, ksm.metrics_url,
                             ready_check=lambda: ksm.complete(expected)[0])


def summary(runs: list[dict], modes: list[str]) -> dict:
    out = {}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode]
        out[mode] = {k: round(statistics.median(r[k] for r in mine), 2) for k in mine[0]
                     if k not in ("mode", "round") and all(k in r for r in mine)}
    return out


ROWS: list[tuple[str, str | tuple[str, str]]] = [  # (label, a run's key, or two keys: a / b)
    ("kube-apiserver CPU s", "apiserver_cpu_seconds"),
    ("etcd CPU s", "etcd_cpu_seconds"),
    ("kube-apiserver peak RSS increase MB", "apiserver_peak_rss_increase_mb"),
    ("etcd peak RSS increase MB", "etcd_peak_rss_increase_mb"),
    ("kube-apiserver wrote MB (wchar: TLS, gzip)", "apiserver_wrote_mb"),
    ("kube-apiserver allocated MB (Go heap: the collector's work to come)", "apiserver_allocated_mb"),
    ("LIST response bytes (server's count)", "list_response_bytes"),
    ("watch event bytes (server's count)", "watch_event_bytes"),
    ("LIST / WATCH requests", ("list_requests", "watch_requests")),
    ("LISTs from the watch cache / objects", ("cache_lists", "cache_list_objects")),
    ("consistent reads from cache", "consistent_reads_from_cache"),
    ("etcd requests / objects listed from etcd", ("etcd_requests", "etcd_list_objects")),
    ("start -> ready s (/readyz; `ksm`: first complete scrape)", "ready_seconds"),
    ("service's initial sync s", "service_sync_seconds"),
    ("the started program's peak RSS MB (the service's, or KSM's)", "started_peak_rss_mb"),
]


def _cell(run: dict, key: str | tuple[str, str]) -> str:
    if isinstance(key, tuple):
        return " / ".join(_cell(run, k) for k in key)
    val = run.get(key)
    if val is None:
        return "-"
    return f"{val:,.0f}" if abs(val) >= 1000 else f"{val:g}"


def markdown(result: dict) -> str:
    modes = result["modes"]
    lines = [f"{result['nodes']:,} nodes / {result['pods']:,} pods, {result['repeat']} starts per mode, "
             "medians (every run in the JSON):", "",
             "| per start | " + " | ".join(f"`{m}`" for m in modes) + " |",
             "|---|" + "---|" * len(modes)]
    for label, key in ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(result["median"][m], key) for m in modes) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.apiserver_bill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--workloads", type=int, default=300)
    parser.add_argument("--modes", nargs="+", default=list(MODES), type=mode_name,
                        help="--initial-list modes of the service (-json: pods and nodes in JSON; :N: "
                             "--page-size N, e.g. list:5000); ksm: kube-state-metrics")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds to wait before each start (at least)")
    add_out(parser, "apiserver-bill.json", (".md",))
    return run_and_write(parser, argv, run, markdown)


if __name__ == "__main__":
    sys.exit(main())
