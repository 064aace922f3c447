"""What both halves of test_bench_smoke (tests/unit and tests/cluster) use."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import BESIDE, RESULTS
from localkube.build import KUBE_STATE_METRICS, KUEUE, KUEUE_019, Component, ensure_binaries
from tests.paths import ROOT

TIMEOUT = 300  # seconds a smoke run may take (each took 1 to 27 here, 2 cores)


@dataclass(frozen=True)
class Smoke:
    args: tuple[str, ...]  # the smallest run; {tmp} is the test's temporary folder
    keys: tuple[str, ...]  # numbers its report is made of, in --out's JSON: keys joined by dots (0: a list's first)
    cluster: bool = True  # starts local control planes of its own (etcd, kube-apiserver: built first)
    needs: tuple[Component, ...] = ()  # more components, built from their Go modules (make test: in the background)
    tools: tuple[str, ...] = ()  # commands it runs: Debian's (make tools), or the bench extra's (make install)


# The smallest sizes that still take every path of the bench: at least two node groups (the
# NotReady rounds flip node-00001 of pool-1), a GPU node (node-00000), a Deployment with pods.
SMALL = ("--nodes", "4", "--pods-per-node", "5", "--groups", "2")


SERVICE_ROUND = ("--idle-seconds", "1", "--churn-seconds", "1", "--latency-rounds", "2", "--flip-nodes", "1")


SMOKE: dict[str, Smoke] = {
    "scale": Smoke((*SMALL, "--pods-per-workload", "10", *SERVICE_ROUND),
                   ("0.read.nodes_over_summaries_bytes", "0.read.pods_over_workloads_bytes", "0.sync_vs_floor",
                    "0.latency.metric_p99_ms", "0.latency.floor_p99_ms", "0.flip_latency.metric_p99_ms",
                    "0.idle_writes", "0.churn.writes_per_minute", "0.scrape.series", "0.peak_rss_mb")),
    "tier": Smoke((*SMALL, "--pods-per-workload", "10", *SERVICE_ROUND, "--settle", "0"),
                  ("rows.0.populate_seconds", "rows.0.etcd_db_mb", "rows.0.list_floor_seconds",
                   "rows.0.kubectl.pods.kubectl_peak_rss_mb", "rows.0.service.initial_sync_seconds",
                   "rows.0.apiserver_peak_rss_during_service_mb", "projections")),
    "sync": Smoke(("--nodes", "4", "--pods", "20", "--groups", "2", "--workloads", "2", "--concurrency", "8"),
                  ("ready_seconds", "initial_sync_seconds", "list_floor_seconds", "peak_rss_mb", "scrape_series")),
    "soak": Smoke(("--nodes", "2", "--pods", "20", "--replaced", "20", "--churn", "10", "--sample-seconds", "1"),
                  ("summary.bytes_per_replaced_pod", "summary.rss_mb_end", "samples.0.rss_mb")),
    "index_events": Smoke(("--pods", "200", "--nodes", "10", "--workloads", "4", "--events", "1000"),
                          ("events_per_second", "avg_event_bytes", "pods"), cluster=False),
    "pod_memory": Smoke(("--pods", "2000", "6000", "--top", "3"),
                        ("rss.1.rss_bytes_per_pod", "projection.pods_in_limit", "traced.bytes_per_pod",
                         "traced.sites.0.site"), cluster=False),
    "nodeclaim_memory": Smoke(("--nodeclaims", "100", "400", "--events", "400", "--pods-per-node", "2"),
                              ("traced.bytes_per_nodeclaim", "traced.sites.0.site", "rows.1.rss_bytes_per_nodeclaim",
                               "rows.1.us_per_event_quiet", "rows.1.us_per_event_drift"), cluster=False),
    "gang_sizes": Smoke(("--objects", "50"), ("objects", "JobSet.bytes_per_event", "JobSet.us_per_event_status_update",
                                               "LeaderWorkerSet.bytes_held_per_object", "JobSet.gang_size"),
                        cluster=False),
    "churn_profile": Smoke((*SMALL, "--seconds", "2", "--settle", "0", "--rate", "50", "--top", "5"),
                           ("cpu_ms_per_1000_events", "pod_updates", "writes.workloadsummaries", "stages",
                            "functions", "samples"), tools=("py-spy",)),
    "watch_path": Smoke(("--pods", "10", "--flips", "2", "--evict", "1", "--rounds", "1"),
                        ("events", "us_per_event.hot", "us_per_event.cold (1 MB read between events)")),
    "write_cost": Smoke(("--writes", "20", "--rounds", "1"),
                        ("median_us.own connections", "median_us.aiohttp", "median_kernel_us.own connections")),
    "gc_pauses": Smoke(("--pods", "300", "--seconds", "1", "--rate", "100"),
                       ("0.variant", "0.loop_late_p99_ms", "1.full_collection_max_ms"), cluster=False),
    "latency_floor": Smoke((*SMALL, "--rounds", "2"),
                           ("0.latency.metric_p99_ms", "0.latency.over_floor_p99_ms", "0.breakdown.rounds",
                            "0.phase.renders")),
    "summary_size": Smoke(SMALL, ("0.objects", "0.object_bytes_median", "0.list_bytes_without_managed_fields",
                                  "0.table_bytes", "0.workloadsummaries.object_bytes_median")),
    "ksm": Smoke((*SMALL, "--pods-per-workload", "10", "--direct-pods-each", "2", "--churn-seconds", "2",
                  "--scrape-interval", "1s", "--scrape-runs", "1", "--query-runs", "1"),
                 ("sizes.0.ours.scrape.gzip.bytes", "sizes.0.ksm.sync.complete_scrape_seconds",
                  "sizes.0.ksm.churn_cpu_ms_per_1000_events", "sizes.0.ours.metrics_only.churn_cpu_seconds",
                  "sizes.0.questions.2.agreement.agree", "sizes.0.ratios.peak_rss"),
                 needs=(KUBE_STATE_METRICS,), tools=("prometheus",)),
    "apiserver_bill": Smoke((*SMALL, "--workloads", "2", "--modes", "auto", "--repeat", "1", "--settle", "0"),
                            ("runs.0.apiserver_cpu_seconds", "runs.0.list_response_bytes",
                             "median.auto.ready_seconds", "median.auto.service_sync_seconds")),
    "neighbours": Smoke(("--minutes", "0.3", "--nodes", "3", "--workloads", "2", "--pods", "6",
                         "--action-seconds", "2", "--check-seconds", "2", "--quiet-every", "0", "--settle", "1",
                         "--logs", "{tmp}/logs"),
                        ("summary.checks", "summary.failed_checks", "summary.worst_converge_s",
                         "summary.by_reason.label.checks",
                         "summary.by_reason.no quota write for the blip.checks",
                         "summary.by_reason.lease kept its annotation and holder.checks",
                         "summary.neighbour_edits", "minutes.0.writes", "rss.0.bytes"),
                        needs=(KUEUE_019,)),
    "fleet": Smoke(("--members", "1", "--rest", "0", "--sample", "1", "--quiet", "1", "--timeout", "60"),
                   ("members_reached", "rows.0.sync_seconds", "rows.0.rss_per_member_kb",
                    "rows.0.summary.quiet_requests_per_minute"),
                   needs=(KUEUE,)),
}


def beside(name: str) -> tuple[str, ...]:
    """The suffixes of the files the bench writes beside its JSON (add_out's ``beside``), read
    from its source."""
    tree = ast.parse((ROOT / "bench" / f"{name}.py").read_text())
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call)
                and ast.unparse(node.func).split(".")[-1] == "add_out")
    given = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "beside"), None)
    return tuple(ast.literal_eval(given)) if given is not None else ()


def lookup(data: object, path: str) -> bool:
    """Whether the JSON ``data`` has ``path`` (keys joined by dots; a number indexes a list)."""
    for key in path.split("."):
        if isinstance(data, list) and key.isdigit() and int(key) < len(data):
            data = data[int(key)]
        elif isinstance(data, dict) and key in data:
            data = data[key]
        else:
            return False
    return True


def results_now() -> dict[str, float]:
    return {str(p.relative_to(RESULTS)): p.stat().st_mtime for p in RESULTS.rglob("*") if p.is_file()}


def smoke(name: str, tmp_path: Path) -> None:
    row = SMOKE[name]
    missing = [tool for tool in row.tools if shutil.which(tool) is None
               and not (Path(sys.executable).parent / tool).exists()]
    assert not missing, f"bench.{name} runs {missing}: `make tools` (Debian's) or `make install` (the bench extra)"
    ensure_binaries(row.needs)  # built, or waited for while make test builds them in the background
    out = tmp_path / f"{name}.json"
    argv = [sys.executable, "-m", f"bench.{name}", *(a.format(tmp=tmp_path) for a in row.args), "--out", str(out)]
    before = results_now()
    started = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as err:
        tail = (err.stderr or b"")[-3000:]
        raise AssertionError(f"bench.{name} did not end within {TIMEOUT}s:\n{tail!r}") from None
    took = time.monotonic() - started
    print(f"bench.{name}: {took:.1f}s")
    log = f"$ {' '.join(argv)}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert proc.returncode == 0, f"bench.{name} exited with {proc.returncode}:\n{log}"
    assert out.exists(), f"bench.{name} wrote no {out.name}:\n{log}"
    data = json.loads(out.read_text())
    assert [k for k in row.keys if not lookup(data, k)] == [], f"bench.{name}'s {out.name}: {json.dumps(data)[:3000]}"
    assert [s for s in beside(name) if not out.with_suffix(s).exists()] == [], f"{BESIDE} beside {out}"
    assert results_now() == before, f"bench.{name} wrote into bench/results/"
