"""Two replicas of node-workload-summary beside neighbours, for a long time.

Two replicas (a short lease; replica "b" reaches the API server through a StallingProxy) run
against a local control plane with pod churn, while on a schedule (one action every
--action-seconds, in turn) neighbours label, annotate and server-side apply summaries under
another field manager, edit their status and delete them; the API server restarts; the proxied
replica's connections stall; the leader is SIGKILLed and replaced by a new replica (new identity,
new port); node summarizers come and go, two of them with colliding plain names (`gke` on label
`gke` = `pool-a`, `gke-pool` on label `gke-pool` = `a`) and one with odd label values (`a..b`, `A_b`).

Every --check-seconds, and right after every action, churn pauses and the bench waits (at most
--timeout seconds) until both replicas' metrics (nws_nodegroup_nodes, _nodes_by_condition, _pods,
nws_workload_pods) and the summaries (one per node group / workload, valid names, nodeCount,
Ready / NotReady, podCount) equal a recomputation (tests/reference.py) from the objects the API
server has now (the latency counts from the action's end; the proxied replica's metrics are not
checked for --read-timeout seconds after its connections stall, as nothing but that timeout can
notice a silent connection). Every minute the replicas' writes (nws_reconciler_writes_total) must stay within
the summaries changed in that minute plus the neighbours' expected writes plus --slack; every
--quiet-every-th minute has no churn and no actions, so it must have about no writes.

Writes bench/results/neighbours.{json,md,png} (`--out` puts them elsewhere); exit code 1 if any
check failed.

    nice -n 10 python -m bench.neighbours --minutes 20
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from demo import kueue
from demo.workloads import deployment_chain, node_summarizer, ok, owner_ref, workload_summarizer
from kubeindex.model.objects import Node, Pod
from kubeindex.model.resources import (
    BY_PLURAL,
    LEASES,
    NODE_SUMMARIES,
    NODE_SUMMARIZERS,
    NODES,
    PODS,
    WORKLOAD_SUMMARIES,
    WORKLOAD_SUMMARIZERS,
)
from localkube.cluster import LocalCluster, Options
from localkube.service import Samples, select, value
from reconciler.leader import LeaseSettings
from reconciler.names import is_dns1123_subdomain
from tests.paths import FAILED_LOGS
from tests.reference import Owner, World, recompute

from .common import CRDS, add_out, percentile
from .neighbours_quota import FLAVOR, GITOPS, QUEUES, Neighbour, quota_probe
from .neighbours_quota import setup as quota_setup
from .neighbours_quota import versions as quota_versions
from .neighbours_replicas import Processes, Replica, Runner
from .plot import pyplot

NS = "bench"
POOL_LABEL = "cloud.google.com/gke-nodepool"
# Optional node summarizers: name -> label key; each node carries all these labels from the start.
COLLIDING = {"gke": "gke", "gke-pool": "gke-pool"}  # plain names gke-pool-a and gke-pool-a
ODD = {"odd": "odd"}  # values a..b and A_b: not valid names as they are
NEIGHBOUR = "neighbour"
LEASE_NAME = LeaseSettings.name
WARM_UP = 120.0  # seconds of a replica's life left out of its RSS slope
METRIC_FAMILIES = ("nws_nodegroup_nodes", "nws_nodegroup_nodes_by_condition", "nws_nodegroup_pods",
                   "nws_workload_pods")

Expected = dict[tuple[str, ...], float]


def log(started: float, msg: str) -> None:
    """A line of the run's log, on stdout, stamped with the minutes and seconds since ``started``."""
    elapsed = int(time.monotonic() - started)
    print(f"[neighbours] {elapsed // 60:02d}:{elapsed % 60:02d} {msg}", flush=True)


# -- the truth -------------------------------------------------------------------------------------

def items(cluster: LocalCluster, path: str) -> list[dict]:
    return ok(cluster.request(path))["items"]


def read_world(cluster: LocalCluster) -> World:
    """The objects as the API server has them now, in tests/reference.py's shape."""
    nodes = {n["metadata"]["name"]: msgspec.convert(n, Node) for n in items(cluster, NODES.path())}
    pods = {p["metadata"]["uid"]: msgspec.convert(p, Pod) for p in items(cluster, PODS.path())}
    owners: dict[str, Owner] = {}
    for kind, plural in (("Deployment", "deployments"), ("ReplicaSet", "replicasets")):
        for o in items(cluster, f"/apis/apps/v1/{plural}"):
            meta = o["metadata"]
            parent = next((r["uid"] for r in meta.get("ownerReferences", []) if r.get("controller")), None)
            owners[meta["uid"]] = Owner(meta["uid"], "apps", kind, meta["namespace"], meta["name"], parent)
    summarizers = {s["metadata"]["name"]: s["spec"]["labelKey"] for s in items(cluster, NODE_SUMMARIZERS.path())}
    configured = {(t.get("group", ""), t["kind"]) for s in items(cluster, WORKLOAD_SUMMARIZERS.path())
                  for t in s["spec"]["workloadTypes"]}
    return World(nodes, pods, owners, summarizers, configured)


def expected_metrics(world: World) -> Expected:
    groups, workloads, _, _ = recompute(world)
    out: Expected = {}
    for (summarizer, group), g in groups.items():
        out[("nws_nodegroup_nodes", summarizer, group)] = g.nodes
        for condition, n in g.conditions.items():
            out[("nws_nodegroup_nodes_by_condition", summarizer, group, condition)] = n
        for phase, n in g.pods.items():
            out[("nws_nodegroup_pods", summarizer, group, phase)] = n
    for w in workloads.values():
        for phase, n in w.pods.items():
            out[("nws_workload_pods", w.namespace, w.name, w.kind, phase)] = n
    return out


def scraped_metrics(samples: Samples) -> Expected:
    """The replica's series of the checked families, zeros left out (as the recomputation does)."""
    order = {"nws_nodegroup_nodes": ("summarizer", "group"),
             "nws_nodegroup_nodes_by_condition": ("summarizer", "group", "condition"),
             "nws_nodegroup_pods": ("summarizer", "group", "phase"),
             "nws_workload_pods": ("namespace", "workload", "kind", "phase")}
    out: Expected = {}
    for family, keys in order.items():
        for labels, v in select(samples, family).items():
            if v:
                lbl = dict(labels)
                out[(family, *(lbl[k] for k in keys))] = v
    return out


def expected_summaries(world: World) -> Expected:
    groups, workloads, _, _ = recompute(world)
    out: Expected = {}
    for (summarizer, group), g in groups.items():
        out[("node", summarizer, group)] = g.nodes
        out[("ready", summarizer, group)] = g.conditions.get("Ready", 0)
        out[("notready", summarizer, group)] = g.conditions.get("NotReady", 0) + g.conditions.get("Unknown", 0)
        out[("nodepods", summarizer, group)] = sum(g.pods.values())
    for uid, w in workloads.items():
        if (w.group, w.kind) in world.configured:
            out[("workload", w.namespace, uid)] = sum(w.pods.values())
    return out


def actual_summaries(cluster: LocalCluster) -> tuple[Expected, list[str]]:
    """What the summaries say, in expected_summaries' shape, and the problems no shape can hold
    (two summaries for one group or workload, invalid names)."""
    out: Expected = {}
    problems: list[str] = []
    for s in items(cluster, NODE_SUMMARIES.path()):
        name = s["metadata"]["name"]
        refs = s["metadata"].get("ownerReferences", [])
        owner = next((r["name"] for r in refs if r["kind"] == "NodeSummarizer"), "?")
        (value_,) = s["spec"]["selector"]["matchLabels"].values()
        status = s.get("status", {})
        conditions = {c["type"]: c["count"] for c in status.get("conditions", [])}
        if ("node", owner, value_) in out:
            problems.append(f"second NodeSummary {name} for {owner}={value_}")
        if not is_dns1123_subdomain(name):
            problems.append(f"invalid name {name}")
        out[("node", owner, value_)] = status.get("nodeCount", 0)
        out[("ready", owner, value_)] = conditions.get("Ready", 0)
        out[("notready", owner, value_)] = conditions.get("NotReady", 0)
        out[("nodepods", owner, value_)] = status.get("podCount", 0)
    for s in items(cluster, WORKLOAD_SUMMARIES.path()):
        meta = s["metadata"]
        key = ("workload", meta["namespace"], s["spec"]["workloadRef"]["uid"])
        if key in out:
            problems.append(f"second WorkloadSummary {meta['namespace']}/{meta['name']}")
        if not is_dns1123_subdomain(meta["name"]):
            problems.append(f"invalid name {meta['name']}")
        out[key] = s.get("status", {}).get("podCount", 0)
    return out, problems


def diff(want: Expected, got: Expected, limit: int = 6) -> list[str]:
    keys = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
    return [f"{'/'.join(k)}: want {want.get(k)} got {got.get(k)}" for k in keys[:limit]]


def reconciler_state(replica: Replica) -> dict[str, Any]:
    """What a replica says of its reconciler and watches: the evidence kept with a failed check."""
    try:
        samples = replica.scrape()
    except Exception as err:
        return {"error": str(err)[:200]}
    keep = ("nws_reconciler_", "nws_watch_last_event_age_seconds", "nws_watch_relists_total")
    return {f"{name}{dict(sorted(labels))}": v for (name, labels), v in samples.items() if name.startswith(keep)}


# -- the bench -------------------------------------------------------------------------------------

@dataclass
class Bench:
    cluster: LocalCluster
    runner: Runner
    args: argparse.Namespace
    pods: list[tuple[str, str, str]] = field(default_factory=list)  # name, node, workload
    replicasets: dict[str, dict] = field(default_factory=dict)  # workload -> its ReplicaSet
    checks: list[dict] = field(default_factory=list)
    actions: list[dict] = field(default_factory=list)
    minutes: list[dict] = field(default_factory=list)
    deaths: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)  # churn pauses while held
    stop: threading.Event = field(default_factory=threading.Event)
    started: float = 0.0
    serial: int = 0
    changed: int = 0  # summaries changed by churn and actions this minute (each change once)
    expected_writes: int = 0  # writes the neighbours' actions call for this minute
    rng: random.Random = field(default_factory=random.Random)
    neighbour: Neighbour = field(default_factory=Neighbour)
    killed_writes: float = 0.0  # this minute's writes of the leaders killed in it
    rss: list[dict] = field(default_factory=list)  # t, identity, started (its process's start time), bytes

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def quiet(self, lead: float) -> bool:
        """In a quiet minute, or within ``lead`` seconds before one."""
        if self.args.quiet_every <= 0:
            return False
        now = self.elapsed()
        return any((int(t // 60) + 1) % self.args.quiet_every == 0 for t in (now, now + lead))

    # -- replicas --

    @property
    def replicas(self) -> list[Replica]:
        return self.runner.replicas

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if not r.gone]

    def watch_deaths(self) -> None:
        for r, how in self.runner.deaths():
            self.deaths.append({"t": round(self.elapsed(), 1), "identity": r.identity, "log": str(r.log), **how})
            log(self.started, f"replica {r.identity} DIED ({how.get('code', '')}); log {r.log}")

    # -- churn --

    def node_groups(self, node: str) -> int:
        """Summaries a change on this node touches: one per node summarizer whose label it has."""
        labels = ok(self.cluster.request(NODES.path(name=node)))["metadata"].get("labels", {})
        keys = {s["spec"]["labelKey"] for s in items(self.cluster, NODE_SUMMARIZERS.path())}
        return len(keys & labels.keys())

    def claim_writes(self, node: str) -> int:
        """Writes a Ready flip of this node may cause for the claim: its status when the live
        capacity changes and when it settles, both ClusterQueues' quota, an Event per queue write."""
        return 2 + 2 * len(QUEUES) if node_labels(int(node.removeprefix("node-")))[POOL_LABEL] == FLAVOR else 0

    def create_pod(self, workload: str, node: str, phase: str) -> None:
        name = f"{workload}-{self.serial:06d}"
        self.serial += 1
        ok(self.cluster.request(PODS.path(NS), "POST", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": workload},
                         "ownerReferences": [owner_ref(self.replicasets[workload])]},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x",
                                                       "resources": {"requests": {"cpu": "100m"}}}]}}))
        self.pods.append((name, node, workload))
        if phase != "Pending":
            ok(self.cluster.request(PODS.path(NS, name, "status"), "PATCH",
                                    {"status": {"phase": phase}}, content_type="application/merge-patch+json"))

    def churn_once(self) -> None:
        """Replace a pod (new name, new UID, maybe another node and workload), or flip a node's Ready."""
        if self.rng.random() < 0.1:
            node = f"node-{self.rng.randrange(self.args.nodes):02d}"
            self.set_ready(node, self.rng.choice(["True", "False", "Unknown"]))
            self.changed += self.node_groups(node) + self.claim_writes(node)
            return
        name, node, _ = self.pods.pop(self.rng.randrange(len(self.pods)))
        ok(self.cluster.request(PODS.path(NS, name), "DELETE", {"gracePeriodSeconds": 0}))
        self.changed += 1 + self.node_groups(node)
        node = f"node-{self.rng.randrange(self.args.nodes):02d}"
        self.create_pod(self.rng.choice(sorted(self.replicasets)), node,
                        self.rng.choice(["Running", "Running", "Pending", "Succeeded"]))
        self.changed += 2 * (1 + self.node_groups(node))  # created, then its phase set

    def set_ready(self, node: str, ready: str) -> None:
        ok(self.cluster.request(NODES.path(name=node, subresource="status"), "PATCH", {"status": {"conditions": [
            {"type": "Ready", "status": ready, "reason": "Bench"}]}},
            content_type="application/strategic-merge-patch+json"))

    def churn(self) -> None:
        while not self.stop.wait(self.args.churn_seconds):
            if self.quiet(lead=5 + self.args.settle):  # a flip's quota write lands before the quiet minute
                continue
            with self.lock:
                try:
                    self.churn_once()
                except Exception as err:  # the API server may be restarting: the next round retries
                    print(f"[neighbours] churn: {err}", file=sys.stderr, flush=True)

    # -- checks --

    def check(self, reason: str, timeout: float | None = None) -> dict:
        """Wait until every live replica's metrics and the summaries equal the recomputation.
        Called with churn paused, so the truth stays put while the service catches up."""
        since = time.monotonic()
        self.watch_deaths()
        world = read_world(self.cluster)
        want_metrics, want_summaries = expected_metrics(world), expected_summaries(world)
        skipped = [r.identity for r in self.live() if time.monotonic() < r.stalled_until]
        down = [r.identity for r in self.live() if r.identity not in skipped and not r.ready()]

        def metrics(r: Replica) -> list[str]:
            return diff(want_metrics, scraped_metrics(r.scrape()))

        pending: dict[str, Callable[[], list[str]]] = {
            f"metrics {r.identity}": partial(metrics, r) for r in self.live() if r.identity not in skipped + down}

        def summaries() -> list[str]:
            got, problems = actual_summaries(self.cluster)
            return problems + diff(want_summaries, got)

        pending["summaries"] = summaries
        pending["quota"] = quota_probe(self.cluster, POOL_LABEL, self.neighbour)
        latency: dict[str, float] = {}
        last: dict[str, list[str]] = {}
        deadline = time.monotonic() + (timeout or self.args.timeout)
        # A capacity change the leader sees at the end of that time is written a settle time later,
        # by design: the quota has that much more.
        deadlines = {what: deadline + (self.args.settle if what == "quota" else 0) for what in pending}
        while pending and time.monotonic() < max(deadlines[what] for what in pending):
            for what, probe in list(pending.items()):
                if time.monotonic() >= deadlines[what]:
                    continue  # out of time: stays pending, with its last differences
                try:
                    last[what] = probe()
                except Exception as err:  # a replica mid-relist, a refused connection: poll on
                    last[what] = [f"{type(err).__name__}: {err}"]
                if not last[what]:
                    latency[what] = round(time.monotonic() - since, 2)
                    del pending[what]
            time.sleep(0.1)
        record = {"t": round(self.elapsed(), 1), "reason": reason, "ok": not pending,
                  "latency": latency, "converged_s": max(latency.values(), default=0.0),
                  "failed": {what: last[what] for what in pending}, "skipped_stalled": skipped,
                  "skipped_restarting": down}
        if pending:
            record["logs"] = {r.identity: str(r.log) for r in self.replicas}
            record["replicas"] = {r.identity: reconciler_state(r) for r in self.live()}
        self.checks.append(record)
        self.runner.settle()
        return record

    def verdict(self, reason: str, problems: list[str], took: float) -> dict:
        """A check that is one observation, not a wait (a blip, the Lease): recorded like the others."""
        record = {"t": round(self.elapsed(), 1), "reason": reason, "ok": not problems, "latency": {},
                  "converged_s": round(took, 2), "failed": {reason: problems} if problems else {},
                  "skipped_stalled": [], "skipped_restarting": []}
        self.checks.append(record)
        return record

    # -- actions --

    def random_summary(self, plural: str) -> dict:
        return self.rng.choice(items(self.cluster, BY_PLURAL[plural].path()))

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return self.cluster.kubectl(*args, input=input).stdout.strip()

    def label(self) -> str:
        s = self.random_summary("nodesummaries")
        self.kubectl("label", "nodesummaries", s["metadata"]["name"], f"team={self.serial}", "--overwrite")
        return f"labelled NodeSummary {s['metadata']['name']}"

    def annotate(self) -> str:
        s = self.random_summary("workloadsummaries")
        self.kubectl("annotate", "workloadsummaries", "-n", s["metadata"]["namespace"], s["metadata"]["name"],
                     f"note=seen-{self.serial}", "--overwrite")
        return f"annotated WorkloadSummary {s['metadata']['name']}"

    def apply(self) -> str:
        s = self.random_summary("nodesummaries")
        body = {"apiVersion": s["apiVersion"], "kind": s["kind"], "metadata": {
            "name": s["metadata"]["name"], "labels": {"cost-center": f"cc-{self.serial}"},
            "annotations": {"owner": "platform-team"}}}
        self.kubectl("apply", "--server-side", f"--field-manager={NEIGHBOUR}", "-f", "-", input=json.dumps(body))
        return f"server-side applied labels to NodeSummary {s['metadata']['name']} as {NEIGHBOUR}"

    def edit_status(self) -> str:
        s = self.random_summary("nodesummaries")
        self.kubectl("patch", "nodesummaries", s["metadata"]["name"], "--subresource=status", "--type=merge",
                     "-p", json.dumps({"status": {"nodeCount": 999, "podCount": 999}}))
        self.expected_writes += 1
        return f"edited the status of NodeSummary {s['metadata']['name']}"

    def delete(self) -> str:
        plural = self.rng.choice(["nodesummaries", "workloadsummaries"])
        s = self.random_summary(plural)
        ns = ["-n", s["metadata"]["namespace"]] if plural == "workloadsummaries" else []
        self.kubectl("delete", plural, *ns, s["metadata"]["name"], "--wait=false")
        self.expected_writes += 2  # apply, apply_status
        return f"deleted {s['kind']} {s['metadata']['name']}"

    def restart_apiserver(self) -> str:
        self.cluster.restart_apiserver()
        self.churn_once()  # a change only a resumed watch can see
        return "restarted the API server"

    def stall(self) -> str:
        """The stalled replicas' metrics are not checked until their read timeout has passed; the
        summaries must stay right meanwhile (a stalled leader must give way)."""
        stalled = self.runner.stall()
        for r in stalled:
            r.stalled_until = time.monotonic() + self.args.read_timeout
        self.churn_once()
        return f"stalled the API connections of {', '.join(r.identity for r in stalled) or 'no replica'}"

    def leader(self, timeout: float) -> Replica | None:
        """The replica that says it leads, waiting up to ``timeout`` seconds for one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in self.live():
                try:
                    if r.leader():
                        return r
                except Exception:  # restarting, or mid-relist: ask the next one
                    continue
            time.sleep(0.2)
        return None

    def rollout(self) -> str:
        leader = self.leader(timeout=10)
        if leader is None:
            return "rollout skipped: no leader"
        self.killed_writes += leader.scrape_writes()  # what it wrote this minute, before the kill
        killed_at = time.monotonic()
        what = self.runner.kill(leader)
        took = time.monotonic() - killed_at if self.leader(timeout=30) else float("nan")
        self.churn_once()
        return f"{what}; a leader in {took:.1f} s"

    def blip(self) -> str:
        """A node of the claim's flavor NotReady for a third of the settle time: no quota write."""
        ready = [n["metadata"]["name"] for n in items(self.cluster, NODES.path())
                 if n["metadata"].get("labels", {}).get(POOL_LABEL) == FLAVOR
                 and {c["type"]: c["status"] for c in n["status"].get("conditions", [])}.get("Ready") == "True"]
        if not ready:
            return "blip skipped: no Ready node in the flavor"
        self.check("before blip")  # the quota follows the capacity before the blip starts
        before, started = quota_versions(self.cluster), time.monotonic()
        node = self.rng.choice(ready)
        self.set_ready(node, "False")
        time.sleep(self.args.settle / 3)
        self.set_ready(node, "True")
        time.sleep(self.args.settle + 2)  # what a blip could trigger would have happened by now
        after = quota_versions(self.cluster)
        problems = [f"ClusterQueue {q} written (resourceVersion {before[q]} -> {after.get(q)}) after a "
                    f"{self.args.settle / 3:.1f} s blip" for q in before if after.get(q) != before[q]]
        self.verdict("no quota write for the blip", problems, time.monotonic() - started)
        self.changed += 2 * (self.node_groups(node) + 1)  # the node's groups and the claim's status, twice
        outcome = "QUOTA WRITTEN" if problems else "no quota write"
        return f"{node} NotReady for {self.args.settle / 3:.1f} s: {outcome}"

    def edit_queues(self) -> str:
        return self.neighbour.edit(self.cluster)

    def annotate_lease(self) -> str:
        """Another writer annotates the Lease: the leader keeps leading and the annotation stays."""
        (lease,) = [x for x in items(self.cluster, LEASES.path())
                    if x["metadata"]["name"] == LEASE_NAME]
        meta, started = lease["metadata"], time.monotonic()
        holder = lease["spec"].get("holderIdentity")
        self.kubectl("annotate", "lease", "-n", meta["namespace"], LEASE_NAME, f"{NEIGHBOUR}/seen={self.serial}",
                     "--overwrite")
        time.sleep(4)  # a lease duration: every replica has renewed or tried to since
        after = ok(self.cluster.request(f"/apis/coordination.k8s.io/v1/namespaces/{meta['namespace']}/leases/"
                                        f"{LEASE_NAME}"))
        problems = []
        if after["metadata"].get("annotations", {}).get(f"{NEIGHBOUR}/seen") != str(self.serial):
            problems.append(f"the annotation {NEIGHBOUR}/seen={self.serial} is gone: {after['metadata']}")
        if after["spec"].get("holderIdentity") != holder:
            problems.append(f"the leader changed from {holder} to {after['spec'].get('holderIdentity')}")
        self.verdict("lease kept its annotation and holder", problems, time.monotonic() - started)
        self.serial += 1
        return f"annotated the Lease held by {holder}" + ("" if not problems else f": {problems}")

    def toggle(self, summarizers: dict[str, str]) -> str:
        existing = {s["metadata"]["name"] for s in items(self.cluster, NODE_SUMMARIZERS.path())}
        workloads = len(self.replicasets)
        groups_before = len(expected_summaries(read_world(self.cluster)))
        if summarizers.keys() <= existing:
            for name in summarizers:
                self.kubectl("delete", "nodesummarizers", name, "--wait=false")
            verb = "removed"
        else:
            for name, key in summarizers.items():
                if name not in existing:
                    node_summarizer(self.cluster, name, key)
            verb = "added"
        time.sleep(0.5)  # let the API server settle the objects before counting
        groups = abs(len(expected_summaries(read_world(self.cluster))) - groups_before) // 4
        # new summaries: apply + apply_status each; every workload's nodeSummaryRefs; summarizers' status
        self.expected_writes += 2 * groups + workloads + 2 * len(summarizers)
        self.changed += groups
        return f"{verb} NodeSummarizers {', '.join(summarizers)} ({groups} node groups)"

    def schedule(self) -> list[tuple[str, Callable[[], str]]]:
        return [("label", self.label), ("blip", self.blip), ("annotate_lease", self.annotate_lease),
                ("restart_apiserver", self.restart_apiserver), ("edit_queues", self.edit_queues),
                ("collide", lambda: self.toggle(COLLIDING)), ("annotate", self.annotate),
                ("stall", self.stall), ("edit_status", self.edit_status), ("rollout", self.rollout),
                ("apply", self.apply), ("odd", lambda: self.toggle(ODD)), ("delete", self.delete)]

    def act(self, kind: str, action: Callable[[], str]) -> None:
        with self.lock:
            started = time.monotonic()
            try:
                what = action()
            except Exception as err:
                what = f"{kind} failed: {err}"
            took = time.monotonic() - started
            record = self.check(kind)  # latency from the action's end: a restart itself takes seconds
        self.actions.append({"t": round(self.elapsed(), 1), "kind": kind, "what": what, "action_s": round(took, 2),
                             "ok": record["ok"], "converged_s": record["converged_s"]})
        if record["ok"]:
            log(self.started, f"{what}; converged in {record['converged_s']:.1f} s")
        else:
            log(self.started, f"{what}; NOT converged in {self.args.timeout:g} s: {record['failed']}")

    def baseline(self) -> None:
        """Once the replicas have summarized what populate made: their writes so far are not the
        first minute's."""
        self.started = time.monotonic()
        record = self.check("start", timeout=60)  # the pods' discovery looks for new kinds every 30 s
        log(self.started, f"replicas in step after {record['converged_s']:.1f} s" if record["ok"]
            else f"replicas NOT in step after {self.args.timeout:g} s: {record['failed']}")
        for r in self.live():
            r.scrape_writes()

    def sample_rss(self) -> None:
        for r in self.live():
            try:
                samples = r.scrape()
            except Exception:  # restarting: the next minute samples it
                continue
            self.rss.append({"t": round(self.elapsed(), 1), "identity": r.identity,
                             "started": value(samples, "process_start_time_seconds"),
                             "bytes": value(samples, "process_resident_memory_bytes")})

    # -- writes per minute --

    def close_minute(self, minute: int, quiet: bool) -> None:
        writes, self.killed_writes = self.killed_writes, 0.0
        for r in self.live():
            try:
                writes += r.scrape_writes()
            except Exception:  # restarting: its writes count in the next minute
                self.watch_deaths()
        self.sample_rss()
        bound = self.changed + self.expected_writes + self.args.slack
        self.minutes.append({"minute": minute, "quiet": quiet, "writes": writes, "changed": self.changed,
                             "expected_action_writes": self.expected_writes, "bound": bound,
                             "ok": writes <= bound})
        log(self.started, f"minute {minute}{' (quiet)' if quiet else ''}: {writes:g} writes, "
                          f"{self.changed} summary changes, bound {bound}" + ("" if writes <= bound else " EXCEEDED"))
        self.changed = self.expected_writes = 0

    # -- the run --

    def run(self) -> None:
        self.started = time.monotonic()
        churn = threading.Thread(target=self.churn, daemon=True)
        churn.start()
        schedule = self.schedule()
        next_action, next_check, turn, minute = self.args.action_seconds, self.args.check_seconds, 0, 0
        quiet_minute = self.quiet(lead=0)
        try:
            while self.elapsed() < self.args.minutes * 60:
                if int(self.elapsed() // 60) != minute:
                    self.close_minute(minute, quiet_minute)
                    minute, quiet_minute = int(self.elapsed() // 60), self.quiet(lead=0)
                if self.elapsed() >= next_action:
                    next_action += self.args.action_seconds
                    if not self.quiet(lead=20):  # actions end early: their writes stay in their minute
                        self.act(*schedule[turn % len(schedule)])
                        turn += 1
                elif self.elapsed() >= next_check:
                    with self.lock:
                        record = self.check("periodic")
                    if not record["ok"]:
                        log(self.started, f"check NOT converged in {self.args.timeout:g} s: {record['failed']}")
                    next_check = self.elapsed() + self.args.check_seconds
                time.sleep(0.1)
            self.close_minute(minute, quiet_minute)
        finally:
            self.stop.set()
            churn.join()


# -- setup -----------------------------------------------------------------------------------------

def node_labels(i: int) -> dict[str, str]:
    labels = {POOL_LABEL: f"pool-{i % 3}"}
    labels.update([("gke", "pool-a"), ("gke-pool", "a"), ("odd", "a..b"), ("odd", "A_b")][i % 4:i % 4 + 1])
    return labels


def populate(bench: Bench) -> None:
    cluster, args = bench.cluster, bench.args
    node_summarizer(cluster, "pool", POOL_LABEL)
    workload_summarizer(cluster, "apps", [("apps", "Deployment")])
    ok(cluster.request("/api/v1/namespaces", "POST", {"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": NS}}))
    # Pods need it where the ServiceAccount admission plugin runs (a control plane with a real node),
    # and no controller makes it there once the soak has stopped kube-controller-manager.
    ok(cluster.request(f"/api/v1/namespaces/{NS}/serviceaccounts", "POST", {
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}))
    for i in range(args.nodes):
        alloc = {"cpu": "32", "memory": "128Gi", "pods": "110"}
        ok(cluster.request(NODES.path(), "POST", {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": f"node-{i:02d}", "labels": node_labels(i)}}))
        ok(cluster.request(NODES.path(name=f"node-{i:02d}", subresource="status"), "PATCH", {"status": {
            "allocatable": alloc, "capacity": alloc,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Bench"}]}},
            content_type="application/merge-patch+json"))
    for w in range(args.workloads):
        _, rs = deployment_chain(cluster, NS, f"app-{w}")
        bench.replicasets[f"app-{w}"] = rs
    for p in range(args.pods):
        bench.create_pod(f"app-{p % args.workloads}", f"node-{p % args.nodes:02d}", "Running")
    quota_setup(cluster, POOL_LABEL)


# -- results ---------------------------------------------------------------------------------------

def summarize(bench: Bench) -> dict[str, Any]:
    by_reason: dict[str, list[dict]] = {}
    for c in bench.checks:
        by_reason.setdefault(c["reason"], []).append(c)
    rows = {reason: {"checks": len(cs), "failed": sum(not c["ok"] for c in cs),
                     "p50_s": percentile([c["converged_s"] for c in cs if c["ok"]], 0.5),
                     "max_s": max((c["converged_s"] for c in cs if c["ok"]), default=0.0)}
            for reason, cs in sorted(by_reason.items())}
    busy = [m["writes"] for m in bench.minutes if not m["quiet"]]
    return {"checks": len(bench.checks), "failed_checks": sum(not c["ok"] for c in bench.checks),
            # of the checks that wait (a verdict's time is the watch it keeps, not a convergence)
            "worst_converge_s": max((c["converged_s"] for c in bench.checks if c["ok"] and c["latency"]), default=0.0),
            "minutes_over_bound": sum(not m["ok"] for m in bench.minutes), "deaths": len(bench.deaths),
            "neighbour_edits": bench.neighbour.serial, "rss": rss_lives(bench.rss),
            "writes_per_busy_minute_median": statistics.median(busy) if busy else 0,
            "writes_per_quiet_minute_max": max((m["writes"] for m in bench.minutes if m["quiet"]), default=None),
            "by_reason": rows}


def rss_lives(samples: list[dict]) -> list[dict]:
    """Per process that ran (a replica's identity and its start time: a container restarted in place
    is a new one), its RSS at its first and last sample and the least-squares slope per hour after
    WARM_UP seconds (None with fewer than 3 samples after it). Longest-lived first."""
    lives: dict[tuple[str, float | None], list[dict]] = {}
    for sample in samples:
        if sample["bytes"] is not None:
            lives.setdefault((sample["identity"], sample["started"]), []).append(sample)
    out = []
    for (identity, _), ss in lives.items():
        warm = [x for x in ss if x["t"] - ss[0]["t"] >= WARM_UP - 60]  # the first sample is a minute in
        slope = (statistics.linear_regression([x["t"] for x in warm], [x["bytes"] for x in warm]).slope * 3600
                 if len(warm) >= 3 else None)
        out.append({"identity": identity, "minutes": round((ss[-1]["t"] - ss[0]["t"]) / 60, 1),
                    "start_mb": round(ss[0]["bytes"] / 1e6, 1), "end_mb": round(ss[-1]["bytes"] / 1e6, 1),
                    "slope_mb_per_hour": None if slope is None else round(slope / 1e6, 2)})
    return sorted(out, key=lambda life: -life["minutes"])


def rss_text(lives: list[dict]) -> str:
    if not lives:
        return "not sampled"
    top = lives[0]
    slope = "-" if top["slope_mb_per_hour"] is None else f"{top['slope_mb_per_hour']:+.2f} MB/h"
    return (f"{top['identity']} ({top['minutes']:g} min) {top['start_mb']:g} -> {top['end_mb']:g} MB, "
            f"slope {slope}")


def keep_logs(bench: Bench, dest: Path) -> None:
    """The control plane's and the processes' logs, copied to ``dest`` before the cluster's working
    directory goes."""
    shutil.copytree(bench.cluster.workdir / "logs", dest, dirs_exist_ok=True)


def report_failure(result: dict[str, Any], where: str, logs: Path, root: Path = FAILED_LOGS) -> list[str]:
    """What a person reads first when the soak fails (``result``: the --out JSON's checks, deaths and
    minutes): the last failed check's differences, the deaths, the minutes over the bound, and
    where the logs are kept: copied under ``root``, where a failed test keeps its own."""
    kept = root / f"bench.neighbours-{where}-{time.strftime('%Y%m%d-%H%M%S')}"
    shutil.copytree(logs, kept, dirs_exist_ok=True)
    failed = [c for c in result["checks"] if not c["ok"]]
    lines = [f"FAILED: {len(failed)} of {len(result['checks'])} checks"]
    if failed:
        last = failed[-1]
        lines.append(f"the last failed check ({last['reason']}, at {last['t']:g} s):")
        lines += [f"    {what}: {line}" for what, problems in last["failed"].items() for line in problems]
    lines += [f"death: {d['identity']} at {d['t']:g} s ({d.get('code', '')}); log {d['log']}" for d in result["deaths"]]
    lines += [f"minute {m['minute']}: {m['writes']:g} writes over the bound {m['bound']}"
              for m in result["minutes"] if not m["ok"]]
    lines.append(f"component logs kept in {kept}")
    return lines


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def write_markdown(bench: Bench, summary: dict[str, Any], path: Path) -> None:
    lines = [f"# neighbours: {bench.args.minutes:g} minutes as {bench.runner.where}, {bench.args.nodes} nodes, "
             f"{bench.args.pods} pods, {len(bench.replicas)} replicas in all, Kueue {bench.args.kueue}", "",
             f"{summary['checks']} checks, {summary['failed_checks']} failed (worst converged in "
             f"{summary['worst_converge_s']:.2f} s); {summary['minutes_over_bound']} minutes over the write bound; "
             f"{summary['deaths']} replica deaths; {summary['neighbour_edits']} edits of the ClusterQueues by "
             f"`{GITOPS}`, none reverted.", "",
             "| check after | checks | not converged in 10 s | converged p50 | max |", "|---|---|---|---|---|"]
    # p50_s is None where no check after that action converged.
    lines += [f"| {reason} | {r['checks']} | {r['failed']} | {seconds(r['p50_s'])} | {r['max_s']:.2f} s |"
              for reason, r in summary["by_reason"].items()]
    lines += ["", "| minute | quiet | summary changes | action writes expected | writes | bound | ok |",
              "|---|---|---|---|---|---|---|"]
    lines += [f"| {m['minute']} | {'yes' if m['quiet'] else ''} | {m['changed']} | {m['expected_action_writes']} | "
              f"{m['writes']:g} | {m['bound']} | {'yes' if m['ok'] else 'NO'} |" for m in bench.minutes]
    lines += ["", "| process (replica, life) | minutes sampled | RSS first | RSS last | slope after warm-up |",
              "|---|---|---|---|---|"]
    lines += [f"| {life['identity']} | {life['minutes']:g} | {life['start_mb']:g} MB | {life['end_mb']:g} MB | "
              + ("-" if life["slope_mb_per_hour"] is None else f"{life['slope_mb_per_hour']:+.2f} MB/h") + " |"
              for life in summary["rss"]]
    path.write_text("\n".join(lines) + "\n")


def plot(bench: Bench, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for reason in sorted({c["reason"] for c in bench.checks}):
        cs = [c for c in bench.checks if c["reason"] == reason]
        top.plot([c["t"] / 60 for c in cs], [c["converged_s"] if c["ok"] else bench.args.timeout for c in cs],
                 "." if reason == "periodic" else "o", label=reason, markersize=3 if reason == "periodic" else 5)
    top.axhline(bench.args.timeout, color="red", linewidth=0.8)
    top.set_ylabel("seconds to converge"), top.legend(fontsize=6, ncol=4)
    xs = [m["minute"] + 0.5 for m in bench.minutes]
    bottom.bar(xs, [m["writes"] for m in bench.minutes], width=0.6, label="writes")
    bottom.step(xs, [m["bound"] for m in bench.minutes], where="mid", color="red", label="bound")
    bottom.set_xlabel("minutes"), bottom.set_ylabel("writes per minute"), bottom.legend(fontsize=7)
    fig.suptitle("node-workload-summary: two replicas beside neighbours")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.neighbours", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20, help="length of the run (default 20)")
    parser.add_argument("--nodes", type=int, default=12, help="nodes, in 3 pools (default 12)")
    parser.add_argument("--workloads", type=int, default=5, help="Deployments (default 5)")
    parser.add_argument("--pods", type=int, default=60, help="pods, kept constant by the churn (default 60)")
    parser.add_argument("--churn-seconds", type=float, default=1.0, help="seconds between churn steps (default 1)")
    parser.add_argument("--action-seconds", type=float, default=10.0,
                        help="seconds between neighbour actions; 10 kinds in turn (default 10)")
    parser.add_argument("--check-seconds", type=float, default=4.0, help="seconds between checks (default 4)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds a check may take to converge (default 10)")
    parser.add_argument("--quiet-every", type=int, default=5,
                        help="every Nth minute has no churn and no actions; 0: none (default 5)")
    parser.add_argument("--slack", type=int, default=5, help="writes allowed per minute beyond the bound (default 5)")
    parser.add_argument("--read-timeout", type=float, default=70.0,
                        help="--read-timeout of the replicas: above the API server's bookmark interval "
                             "(about 60 s), or idle watches time out and reconnect with backoff (default 70)")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="--quota-settle of the replicas: seconds a flavor's capacity must hold before the "
                             "claim's quota follows it (default 5)")
    parser.add_argument("--quota-writes-per-hour", type=int, default=600,
                        help="--quota-max-writes-per-hour of the replicas: the churn flaps pool-0 far more often than "
                             "a real pool flaps (default 600)")
    parser.add_argument("--kueue", choices=sorted(kueue.CELLS), default=kueue.NEWEST,
                        help=f"the Kueue whose CRDs the claim's flavor and queues are made with (default "
                             f"{kueue.NEWEST}: what Kueue v0.20 and later serve)")
    parser.add_argument("--as-pods", action="store_true",
                        help="run the replicas as the chart's two pods on a real node (root; `make node-tools`): "
                             "the image is built, the leader's container killed, its connections dropped in its "
                             "network namespace")
    parser.add_argument("--initial-list", choices=("list", "watchlist"), default="list",
                        help="with --as-pods: the pods' --initial-list (processes take both, in turn; default list)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--logs", type=Path, default=Path("/tmp/neighbours-logs"),
                        help="where the replicas' and the control plane's logs are copied at the end")
    add_out(parser, "neighbours.json", (".md", ".png"))
    args = parser.parse_args(argv)
    kueue.select(args.kueue)
    if args.as_pods:
        from .neighbours_pods import Pods, cluster_options  # needs root and the node's tools
        options = cluster_options()
    with LocalCluster(options if args.as_pods else Options()) as cluster:
        cluster.install_crds(CRDS)
        runner: Runner = Pods(cluster, args) if args.as_pods else Processes(cluster, args)
        bench = Bench(cluster, runner, args, rng=random.Random(args.seed))
        try:
            runner.prepare()
            populate(bench)
            runner.start()
            bench.baseline()
            bench.run()
        finally:
            shutil.rmtree(args.logs, ignore_errors=True)
            runner.logs(args.logs)  # the pods' logs go with the node
            runner.stop()
            keep_logs(bench, args.logs)
    summary = summarize(bench)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "summary": summary, "minutes": bench.minutes, "actions": bench.actions, "deaths": bench.deaths,
              "replicas": [{"identity": r.identity, "initial_list": r.initial_list, "stallable": r.stallable,
                            "gone": r.gone, "writes": r.written} for r in bench.replicas],
              "rss": bench.rss, "checks": bench.checks}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    write_markdown(bench, summary, args.out.with_suffix(".md"))
    plot(bench, args.out.with_suffix(".png"))
    failed = summary["failed_checks"] or summary["minutes_over_bound"] or summary["deaths"]
    if failed:
        for line in report_failure(result, runner.where, args.logs):
            print(f"[neighbours] {line}", flush=True)
    print(f"[neighbours] {runner.where}: {summary['checks']} checks, {summary['failed_checks']} failed; worst "
          f"converge {summary['worst_converge_s']:.2f} s; writes per minute: median "
          f"{summary['writes_per_busy_minute_median']:g} busy, at most {summary['writes_per_quiet_minute_max']} quiet; "
          f"{summary['minutes_over_bound']} minutes over the bound; {summary['deaths']} deaths; "
          f"RSS {rss_text(summary['rss'])}; logs in {args.logs}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
