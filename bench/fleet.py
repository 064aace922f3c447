"""What a fleet hub costs per member: memory, time to the members' claims, and the API load it puts
on each member.

Member clusters, each a real control plane (etcd + kube-apiserver, this project's CRDs and
Kueue's), populated as a member running node-workload-summary would be: NodeSummarizers `pool`,
`zone` and `machine`, and their 10 NodeSummaries written as the service writes them (the bodies and
statuses from the reconciler's own code, reconciler/desired.py, over the product's index fed 160
synthetic nodes and 1,312 pods; server-side applied as field manager node-workload-summary, so
their managedFields are the service's), 4 ResourceFlavors `pool-a` .. `pool-d` on `pool=a` .. `d`
whose nodeLabels equal the `pool` NodeSummaries' selectors, some nodes NotReady. No service runs
in the members: the objects are created directly through the API. A hub control plane with the
same CRDs, its kubeconfig Secrets in kueue-system (the members' admin kubeconfigs, inline).

The largest member count is started once; for each count N, in turn: a fresh hub service
(`--fleet --fleet-namespace=kueue-system --quota-settle=5`, reconciler on) with no members; its
RSS and CPU at rest (the baseline); N MultiKueueClusters created one POST after the other (their
Secrets before); the time from the first until every member's `<member>-<flavor>` claims exist
with `status.nominalResources` (and per member, from its own MultiKueueCluster); the hub's RSS
after --rest seconds; a quiet window of --quiet seconds: the hub's CPU and, per member, its
kube-apiserver's counts for the hub's requests on nodesummaries and resourceflavors
(apiserver_request_total counts a request when it ends, so a WATCH still open counts through
apiserver_longrunning_requests: requests started = ended + the change in open ones) and the bytes
it sent (apiserver_response_sizes for LIST and GET, the watch events' apiserver_watch_events_sizes:
a WatchList's initial state comes as watch events), for the initial sync (from before the
MultiKueueClusters to --rest seconds after the claims) and the quiet window. Then the hub service
stops and the MultiKueueClusters, Secrets and claims are deleted.

Stops starting members when the machine's MemAvailable falls under --min-available, and measures
the counts that fit (the results say how many members were reached).

    python -m bench.fleet                                  # 1, 5 and 20 members
    python -m bench.fleet --members 2 --quiet 10 --show-claims --out /tmp/fleet-2.json
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from demo.kueue import API as KUEUE_API
from demo.kueue import install_kueue
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import API_VERSION, KUEUE_GROUP, KUEUE_VERSION, Node, Pod
from kubeindex.model.resources import CLAIMS, NODE_SUMMARIES, NODE_SUMMARIZERS
from localkube.cluster import ClusterError, LocalCluster
from localkube.service import Service, parse, wait_for
from reconciler.desired import MANAGER, node_summary

from .common import CRDS, add_out, cpu_seconds, say, status_kb
from .plot import pyplot

NAMESPACE = "kueue-system"
HUB_ARGS = ("--fleet", f"--fleet-namespace={NAMESPACE}", "--quota-settle=5")
APPLY = "application/apply-patch+yaml"
KUEUE_PATH = f"/apis/{KUEUE_GROUP}/{KUEUE_VERSION}"

# What a member holds: NodeSummarizers (name -> label key) and its nodes, pool by pool:
# (pool, machine type, nodes, NotReady nodes, cordoned nodes, pods per node).
SUMMARIZERS = {"pool": "pool", "zone": "topology.kubernetes.io/zone", "machine": "node.kubernetes.io/instance-type"}
POOLS = (("a", "a3-highgpu-8g", 48, 0, 1, 8), ("b", "a3-highgpu-8g", 32, 2, 0, 8),
         ("c", "n2-standard-32", 48, 0, 0, 10), ("d", "n2-highmem-16", 32, 1, 1, 6))
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c")
MACHINES = {  # allocatable, capacity
    "a3-highgpu-8g": ({"cpu": "207", "memory": "1843Gi", "nvidia.com/gpu": "8", "pods": "110",
                       "ephemeral-storage": "5500Gi"},
                      {"cpu": "208", "memory": "1872Gi", "nvidia.com/gpu": "8", "pods": "110",
                       "ephemeral-storage": "5950Gi"}),
    "n2-standard-32": ({"cpu": "31850m", "memory": "120Gi", "pods": "110", "ephemeral-storage": "95Gi"},
                       {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "100Gi"}),
    "n2-highmem-16": ({"cpu": "15890m", "memory": "121Gi", "pods": "110", "ephemeral-storage": "95Gi"},
                      {"cpu": "16", "memory": "128Gi", "pods": "110", "ephemeral-storage": "100Gi"}),
}
FLAVORS = tuple(f"pool-{pool[0]}" for pool in POOLS)  # ResourceFlavor pool-a: nodeLabels pool=a

# Per member kube-apiserver: the hub's two resources, and the metrics read for them.
RESOURCES = ("nodesummaries", "resourceflavors")
READS = ("LIST", "WATCH", "GET")
METRICS = ("apiserver_request_total", "apiserver_longrunning_requests", "apiserver_response_sizes_sum",
           "apiserver_watch_events_total", "apiserver_watch_events_sizes_sum")
# In the hub: the claims the service writes and the Secrets it reads again every minute.
HUB_RESOURCES = ("clusterresourceclaims", "secrets")


# -- a member ------------------------------------------------------------------------------------

def member_name(i: int) -> str:
    return f"m{i + 1:02d}"


def synthetic_nodes(member: str) -> tuple[list[Node], list[Pod]]:
    """The member's nodes and pods, as the product's index decodes them (never created in the API)."""
    nodes: list[Node] = []
    pods: list[Pod] = []
    for pool, machine, count, not_ready, cordoned, per_node in POOLS:
        allocatable, capacity = MACHINES[machine]
        for n in range(count):
            name = f"gke-{member}-pool-{pool}-{n:04d}"
            ready = "False" if n >= count - not_ready else "True"
            nodes.append(msgspec.convert({
                "metadata": {"name": name, "uid": f"uid-{name}", "labels": {
                    "pool": pool, SUMMARIZERS["zone"]: ZONES[n % len(ZONES)], SUMMARIZERS["machine"]: machine}},
                "spec": {"unschedulable": n < cordoned},
                "status": {"allocatable": allocatable, "capacity": capacity,
                           "conditions": [{"type": "Ready", "status": ready}]}}, Node))
            for p in range(per_node):
                gpu = {"nvidia.com/gpu": "1"} if "nvidia.com/gpu" in allocatable else {}
                pods.append(msgspec.convert({
                    "metadata": {"name": f"{name}-{p}", "namespace": "ml", "uid": f"uid-{name}-{p}"},
                    "spec": {"nodeName": name, "containers": [{"resources": {"requests": {
                        "cpu": "2", "memory": "8Gi", **gpu}}}]},
                    "status": {"phase": "Pending" if p == 0 and ready == "False" else "Running"}}, Pod))
    return nodes, pods


def request(cluster: LocalCluster, path: str, method: str = "GET", body: object | None = None,
            content_type: str = "application/json") -> Any:
    code, answer = cluster.request(path, method, body, content_type)
    if code >= 300:
        raise ClusterError(f"{method} {path}: {code} {answer}")
    return answer


def populate_member(cluster: LocalCluster, member: str) -> int:
    """NodeSummarizers, their NodeSummaries as the service writes them, and the ResourceFlavors;
    returns the bytes of the member's NodeSummaries as its API server lists them."""
    index = ClusterIndex()
    uids = {}
    for name, label in SUMMARIZERS.items():
        created = request(cluster, NODE_SUMMARIZERS.path(), "POST", {
            "apiVersion": API_VERSION, "kind": "NodeSummarizer", "metadata": {"name": name},
            "spec": {"labelKey": label}})
        uids[name] = created["metadata"]["uid"]
        index.set_node_summarizer(name, label)
    nodes, pods = synthetic_nodes(member)
    for node in nodes:
        index.upsert_node(node)
    for pod in pods:
        index.upsert_pod(pod)
    params = f"fieldManager={MANAGER}&force=true"
    for (summarizer, value), agg in sorted(index.node_groups.items()):
        desired = node_summary(agg, f"{summarizer}-{value}", SUMMARIZERS[summarizer], uids[summarizer])
        path = NODE_SUMMARIES.path(name=desired.name)
        request(cluster, f"{path}?{params}", "PATCH", desired.body, APPLY)
        request(cluster, f"{path}/status?{params}", "PATCH", {
            "apiVersion": API_VERSION, "kind": "NodeSummary", "metadata": {"name": desired.name},
            "status": desired.status}, APPLY)
    for flavor in FLAVORS:
        request(cluster, f"{KUEUE_PATH}/resourceflavors", "POST", {
            "apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": flavor},
            "spec": {"nodeLabels": {"pool": flavor.removeprefix("pool-")}}})
    listed = request(cluster, NODE_SUMMARIES.path())
    return len(json.dumps(listed, separators=(",", ":")).encode())


def start_members(stack: contextlib.ExitStack, count: int, min_available_mb: int) -> list[LocalCluster]:
    """Up to ``count`` populated member control planes; fewer when memory runs short."""
    members: list[LocalCluster] = []
    for i in range(count):
        available = mem_available_mb()
        if available < min_available_mb:
            say(f"MemAvailable {available} MB < {min_available_mb} MB: stopping at {len(members)} members")
            break
        started = time.monotonic()
        cluster = stack.enter_context(LocalCluster())
        cluster.install_crds(CRDS)
        install_kueue(cluster)
        size = populate_member(cluster, member_name(i))
        members.append(cluster)
        say(f"member {member_name(i)} at {cluster.server}: {time.monotonic() - started:.1f}s, NodeSummaries "
            f"{size:,} bytes listed, kube-apiserver {rss_mb(cluster, 'kube-apiserver'):.0f} MB, etcd "
            f"{rss_mb(cluster, 'etcd'):.0f} MB, MemAvailable {mem_available_mb():,} MB")
    return members


# -- readings -------------------------------------------------------------------------------------

def mem_available_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def rss_mb(cluster: LocalCluster, process: str) -> float:
    pid = cluster.processes[process].pid
    return status_kb(pid, "VmRSS") / 1024 if pid is not None else 0.0


def api_counters(cluster: LocalCluster, resources: tuple[str, ...]) -> dict[str, float]:
    """The kube-apiserver's counters for ``resources``, keyed "<resource> <metric>[ <verb>]"
    (summed over the other labels); the /metrics lines filtered before parsing (it is MBs)."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    wanted = re.compile(rf"^({'|'.join(METRICS)})\{{.*resource=\"({'|'.join(resources)})\"")
    counters: dict[str, float] = {}
    for (name, labels), val in parse("\n".join(line for line in text.splitlines() if wanted.match(line))).items():
        label = dict(labels)
        key = f"{label['resource']} {name}" + (f" {label['verb']}" if "verb" in label else "")
        counters[key] = counters.get(key, 0.0) + val
    return counters


def member_load(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per resource: requests started (ended + change in open WATCHes) by verb, and bytes sent."""
    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    out: dict[str, float] = {}
    for resource in RESOURCES:
        for verb in READS:
            started = delta(f"{resource} apiserver_request_total {verb}")
            if verb == "WATCH":
                started += delta(f"{resource} apiserver_longrunning_requests WATCH")
            out[f"{resource}_{verb.lower()}"] = started
        out[f"{resource}_watch_events"] = delta(f"{resource} apiserver_watch_events_total")
        out[f"{resource}_bytes"] = (delta(f"{resource} apiserver_watch_events_sizes_sum")
                                    + sum(delta(f"{resource} apiserver_response_sizes_sum {v}") for v in READS))
    out["requests"] = sum(out[f"{r}_{v.lower()}"] for r in RESOURCES for v in READS)
    out["bytes"] = sum(out[f"{r}_bytes"] for r in RESOURCES)
    out["open_watches"] = sum(after.get(f"{r} apiserver_longrunning_requests WATCH", 0.0) for r in RESOURCES)
    return out


def members_load(members: list[LocalCluster], before: list[tuple[float, dict[str, float]]]
                 ) -> list[dict[str, float]]:
    """Each member's load since ``before`` (its own reading time), with the window's seconds."""
    loads = []
    for cluster, (then, counters) in zip(members, before, strict=True):
        load = member_load(counters, api_counters(cluster, RESOURCES))
        load["seconds"] = time.monotonic() - then
        loads.append(load)
    return loads


def read_members(members: list[LocalCluster]) -> list[tuple[float, dict[str, float]]]:
    return [(time.monotonic(), api_counters(cluster, RESOURCES)) for cluster in members]


def rest_rss_kb(pid: int, seconds: float) -> int:
    """The median VmRSS over ``seconds`` (a reading a second)."""
    samples = []
    for _ in range(max(1, round(seconds))):
        samples.append(status_kb(pid, "VmRSS"))
        time.sleep(1)
    return round(statistics.median(samples))


def hub_writes(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The hub API server's writes to claims and GETs of Secrets between two readings."""
    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    writes = [k for k in after if k.startswith("clusterresourceclaims apiserver_request_total ")
              and k.rsplit(" ", 1)[1] not in READS]
    return {"claim_writes": sum(delta(k) for k in writes),
            "secret_gets": delta("secrets apiserver_request_total GET")}


# -- the hub --------------------------------------------------------------------------------------

def claims(hub: LocalCluster) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in request(hub, CLAIMS.path())["items"]}


def join(hub: LocalCluster, members: list[LocalCluster]) -> dict[str, float]:
    """The members' Secrets (one kubectl apply), then their MultiKueueClusters one POST after the
    other; returns when each MultiKueueCluster was created (time.monotonic())."""
    secrets = [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"member-{member_name(i)}",
                                                                   "namespace": NAMESPACE},
                "data": {"kubeconfig": base64.b64encode(m.inline_kubeconfig().encode()).decode()}}
               for i, m in enumerate(members)]
    hub.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": secrets}))
    created = {}
    for i in range(len(members)):
        member = member_name(i)
        created[member] = time.monotonic()
        request(hub, f"{KUEUE_PATH}/multikueueclusters", "POST", {
            "apiVersion": KUEUE_API, "kind": "MultiKueueCluster", "metadata": {"name": member},
            "spec": {"kubeConfig": {"locationType": "Secret", "location": f"member-{member}"}}})
    return created


def wait_claims(hub: LocalCluster, created: dict[str, float], timeout: float) -> dict[str, float]:
    """Per member, seconds from its MultiKueueCluster's creation until its claims all have
    nominalResources."""
    done: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(done) < len(created):
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"claims of {len(created) - len(done)} members missing after {timeout:.0f}s: "
                                 f"{sorted(claims(hub))}")
        have = {n for n, c in claims(hub).items() if c.get("status", {}).get("nominalResources")}
        for member, since in created.items():
            if member not in done and all(f"{member}-{f}" in have for f in FLAVORS):
                done[member] = now - since
        time.sleep(0.2)
    return done


def clear_hub(hub: LocalCluster) -> None:
    """No MultiKueueClusters, member Secrets or claims: the next hub service starts with no members."""
    hub.kubectl("delete", "multikueueclusters.kueue.x-k8s.io,clusterresourceclaims", "--all", "--wait=false")
    hub.kubectl("delete", "secrets", "--all", "-n", NAMESPACE, "--wait=false")
    wait_for(lambda: not claims(hub) and not request(hub, f"{KUEUE_PATH}/multikueueclusters")["items"],
             timeout=120, interval=0.5)


def show_claims(hub: LocalCluster) -> str:
    return hub.kubectl("get", "clusterresourceclaims", "-o", "wide").stdout


def measure(hub: LocalCluster, members: list[LocalCluster], args: argparse.Namespace) -> dict[str, Any]:
    """One member count: a fresh hub service, its baseline, the join, the rest, the quiet window."""
    n = len(members)
    row: dict[str, Any] = {"members": n, "claims": n * len(FLAVORS), "load_average": os.getloadavg()[0]}
    svc = Service(hub, HUB_ARGS).start()
    try:
        assert svc.proc is not None
        pid = svc.proc.pid
        cpu, rested = cpu_seconds(pid), time.monotonic()
        time.sleep(args.rest)
        row["baseline_rss_kb"] = rest_rss_kb(pid, args.sample)
        row["baseline_cpu_seconds_per_minute"] = (cpu_seconds(pid) - cpu) * 60 / (time.monotonic() - rested)
        say(f"{n} members: hub service at rest with none: RSS {row['baseline_rss_kb'] / 1024:.1f} MB")
        before, hub_before = read_members(members), api_counters(hub, HUB_RESOURCES)
        created = join(hub, members)
        per_member = wait_claims(hub, created, args.timeout)
        first = min(created.values())
        row["sync_seconds"] = max(created[m] - first + s for m, s in per_member.items())
        row["member_sync_seconds"] = per_member
        say(f"{n} members: every claim with its nominalResources {row['sync_seconds']:.2f}s after the "
            f"first MultiKueueCluster (per member, from its own: p50 {statistics.median(per_member.values()):.2f}s)")
        if args.show_claims:
            row["claims_table"] = show_claims(hub)
            print(f"$ kubectl get clusterresourceclaims -o wide\n{row['claims_table']}", flush=True)
        time.sleep(args.rest)
        row["sync_load"] = members_load(members, before)
        row["sync_hub"] = hub_writes(hub_before, api_counters(hub, HUB_RESOURCES))
        row["rss_kb"] = rest_rss_kb(pid, args.sample)
        row["rss_per_member_kb"] = (row["rss_kb"] - row["baseline_rss_kb"]) / n
        say(f"{n} members: hub RSS {row['rss_kb'] / 1024:.1f} MB at rest, {row['rss_per_member_kb']:+.0f} KB per "
            f"member; per member in the sync: {per_member_text(row['sync_load'])}; claim writes in the hub "
            f"{row['sync_hub']['claim_writes']:.0f}")
        before, hub_before = read_members(members), api_counters(hub, HUB_RESOURCES)
        cpu, started = cpu_seconds(pid), time.monotonic()
        time.sleep(args.quiet)
        row["quiet_seconds"] = time.monotonic() - started
        row["quiet_cpu_seconds"] = cpu_seconds(pid) - cpu
        row["quiet_load"] = members_load(members, before)
        row["quiet_hub"] = hub_writes(hub_before, api_counters(hub, HUB_RESOURCES))
        row["rss_end_kb"] = status_kb(pid, "VmRSS")
        row["hwm_kb"] = status_kb(pid, "VmHWM")
        row["summary"] = summarize(row)
        s = row["summary"]
        say(f"{n} members: quiet {row['quiet_seconds']:.0f}s: hub CPU {row['quiet_cpu_seconds']:.2f}s "
            f"({s['hub_cpu_seconds_per_minute']:.3f}/min), per member {s['quiet_requests_per_minute']:.2f} "
            f"requests/min, {s['quiet_bytes_per_minute']:.0f} bytes/min; claim writes "
            f"{row['quiet_hub']['claim_writes']:.0f}, Secret GETs {row['quiet_hub']['secret_gets']:.0f}; RSS at the "
            f"end {row['rss_end_kb'] / 1024:.1f} MB")
    finally:
        svc.stop()
    clear_hub(hub)
    return row


def per_member_text(loads: list[dict[str, float]]) -> str:
    def mean(key: str) -> float:
        return statistics.mean(load[key] for load in loads)

    verbs = ", ".join(f"{mean(f'{r}_{v.lower()}'):g} {v} {r}" for r in RESOURCES for v in READS
                      if mean(f"{r}_{v.lower()}"))
    return f"{verbs or 'no requests'}; {mean('bytes'):,.0f} bytes ({mean('nodesummaries_bytes'):,.0f} of NodeSummaries)"


def summarize(row: dict[str, Any]) -> dict[str, float]:
    """Per member means, the quiet window as rates per minute."""
    sync, quiet = row["sync_load"], row["quiet_load"]

    def mean(loads: list[dict[str, float]], key: str, per_minute: bool = False) -> float:
        return statistics.mean(load[key] * (60 / load["seconds"] if per_minute else 1) for load in loads)

    return {
        "sync_requests": mean(sync, "requests"),
        "sync_watches": mean(sync, "nodesummaries_watch") + mean(sync, "resourceflavors_watch"),
        "sync_lists": mean(sync, "nodesummaries_list") + mean(sync, "resourceflavors_list"),
        "sync_bytes": mean(sync, "bytes"),
        "quiet_requests_per_minute": mean(quiet, "requests", True),
        "quiet_bytes_per_minute": mean(quiet, "bytes", True),
        "quiet_watch_events_per_minute": mean(quiet, "nodesummaries_watch_events", True)
        + mean(quiet, "resourceflavors_watch_events", True),
        "open_watches": mean(quiet, "open_watches"),
        "hub_cpu_seconds_per_minute": row["quiet_cpu_seconds"] * 60 / row["quiet_seconds"],
    }


# -- reports --------------------------------------------------------------------------------------

def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = [
        f"{result['members_reached']} member control planes reached (asked: {result['members_asked']}); each "
        f"member: {len(FLAVORS)} ResourceFlavors, {result['summaries_per_member']} NodeSummaries "
        f"({result['summaries_bytes_per_member']:,} bytes listed); a fresh hub service per row; quiet window "
        f"{result['quiet']:.0f} s. Per member: means over the members.", "",
        "| members (claims) | first MultiKueueCluster -> every claim (per member p50) | hub RSS: none -> "
        "synced (per member) | per member, initial sync: requests (WATCH / LIST), bytes | per member, quiet: "
        "requests/min, bytes/min (open watches) | hub CPU s/min: none, quiet | hub, quiet: claim writes, "
        "Secret GETs/min |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        s = row["summary"]
        p50 = statistics.median(row["member_sync_seconds"].values())
        hub = row["quiet_hub"]
        lines.append(
            f"| {row['members']} ({row['claims']}) | {row['sync_seconds']:.2f} s ({p50:.2f} s) | "
            f"{row['baseline_rss_kb'] / 1024:.1f} -> {row['rss_kb'] / 1024:.1f} MB "
            f"({row['rss_per_member_kb']:+,.0f} KB) | {s['sync_requests']:g} ({s['sync_watches']:g} / "
            f"{s['sync_lists']:g}), {s['sync_bytes']:,.0f} B | {s['quiet_requests_per_minute']:.2f}, "
            f"{s['quiet_bytes_per_minute']:,.0f} B ({s['open_watches']:g}) | "
            f"{row['baseline_cpu_seconds_per_minute']:.3f}, {s['hub_cpu_seconds_per_minute']:.3f} | "
            f"{hub['claim_writes']:.0f}, {hub['secret_gets'] * 60 / row['quiet_seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], out: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    rows = result["rows"]
    xs = [r["members"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(xs, [r["baseline_rss_kb"] / 1024 for r in rows], "o--", label="no members (baseline)")
    left.plot(xs, [r["rss_kb"] / 1024 for r in rows], "o-", label="members synced")
    left.set_xlabel("members"), left.set_ylabel("hub RSS (MB)"), left.set_ylim(bottom=0)
    left.legend(loc="lower right")
    left.set_title("hub memory")
    right.plot(xs, [r["sync_seconds"] for r in rows], "o-", label="every claim (max)")
    right.plot(xs, [statistics.median(r["member_sync_seconds"].values()) for r in rows], "o--",
               label="per member p50")
    right.set_xlabel("members"), right.set_ylabel("seconds"), right.set_ylim(bottom=0)
    right.legend(loc="lower right")
    right.set_title("MultiKueueClusters -> claims with capacity")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=100)


# -- main -----------------------------------------------------------------------------------------

def run(args: argparse.Namespace, report: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    counts = sorted(set(args.members))
    result: dict[str, Any] = {"members_asked": counts, "quiet": args.quiet, "rest": args.rest, "rows": []}
    with contextlib.ExitStack() as stack:
        say(f"starting {max(counts)} member control planes ...")
        members = start_members(stack, max(counts), args.min_available)
        result["members_reached"] = len(members)
        listed = request(members[0], NODE_SUMMARIES.path())["items"]
        result["summaries_per_member"] = len(listed)
        result["summaries_bytes_per_member"] = len(json.dumps(listed, separators=(",", ":")).encode())
        result["member_rss_mb"] = {"kube-apiserver": statistics.mean(rss_mb(m, "kube-apiserver") for m in members),
                                   "etcd": statistics.mean(rss_mb(m, "etcd") for m in members)}
        say("starting the hub control plane ...")
        hub = stack.enter_context(LocalCluster())
        hub.install_crds(CRDS)
        install_kueue(hub)
        hub.kubectl("create", "namespace", NAMESPACE)
        for n in counts:
            if n > len(members):
                say(f"{n} members: only {len(members)} started, skipped")
                continue
            result["rows"].append(measure(hub, members[:n], args))
            report(result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=lambda s: [int(x) for x in s.split(",")], default=[1, 5, 20],
                        help="member counts, comma-separated (default 1,5,20)")
    parser.add_argument("--rest", type=float, default=30.0,
                        help="seconds the hub rests before its baseline and after the sync (default 30)")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds of RSS readings at rest (median)")
    parser.add_argument("--quiet", type=float, default=60.0, help="seconds of the quiet window (default 60)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds the claims may take")
    parser.add_argument("--min-available", type=int, default=3072,
                        help="MB of MemAvailable needed to start another member (default 3072)")
    parser.add_argument("--show-claims", action="store_true",
                        help="print `kubectl get clusterresourceclaims -o wide` of the hub after each sync")
    add_out(parser, "fleet.json", (".md", ".png"))
    args = parser.parse_args(argv)

    def report(result: dict[str, Any]) -> None:  # after every row: a partial run keeps what it measured
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(markdown(result))

    result = run(args, report)
    report(result)
    plot(result, args.out)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
