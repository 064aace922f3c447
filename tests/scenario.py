"""Random events applied to both the index and the truth (tests/reference.py): nodes, pods and
owners come, change and go, summarizers are edited; tests compare the two after any prefix."""

from __future__ import annotations

import random

import msgspec

from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import Node, OwnerReference, PodStatus, Taint
from tests.builders import (
    DISRUPTED,
    GPU,
    add_owner,
    configured,
    device_status,
    labels_of,
    make_node,
    make_nodeclaim,
    make_pod,
    ref,
)
from tests.reference import Owner, World

KINDS = [("apps", "Deployment"), ("apps", "ReplicaSet"), ("apps", "StatefulSet"), ("batch", "Job"),
         ("jobset.x-k8s.io", "JobSet"), ("leaderworkerset.x-k8s.io", "LeaderWorkerSet")]
PHASES = ["Pending", "Running", "Succeeded", "Failed", "Unknown"]


class Scenario:
    """Random events applied to both the index and the truth (World)."""

    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd
        self.world = World({}, {}, {}, {}, set(), pod_labels=("team/job",), max_depth=4,
                           disruption_taints=("karpenter.sh/disrupted", "example.com/drain:NoExecute"),
                           accelerator_resources=(GPU, "aws.amazon.com/neuron*"), nodeclaims={},
                           now=1767225600.0)  # 2026-01-01T00:00:00Z
        w = self.world
        self.index = ClusterIndex(workload_pod_labels=w.pod_labels, max_depth=4,
                                  disruption_taints=w.disruption_taints, problem_conditions=w.problem_conditions,
                                  accelerator_resources=w.accelerator_resources,
                                  expiry_horizon=w.expiry_horizon, now=lambda: self.world.now)
        self.serial = 0

    def uid(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}{self.serial}"

    def random_parent(self) -> str | None:
        r = self.rnd.random()
        candidates = list(self.world.owners) + [p.metadata.uid for p in self.world.pods.values()]
        if r < 0.25 or not candidates:
            return None
        if r < 0.3:
            return "dangling-" + str(self.rnd.randint(0, 2))
        return self.rnd.choice(candidates)

    def _parent_ref(self, uid: str | None) -> OwnerReference | None:
        if uid is None:
            return None
        if uid in self.world.owners:
            return ref(self.world.owners[uid])
        return OwnerReference("v1", "Pod", uid, uid, controller=True)

    def random_node(self, name: str, labels: dict[str, str]) -> Node:
        """Mostly Ready, so that the other states come and go on nodes with pods."""
        rnd = self.rnd
        capacity = {"cpu": "8", GPU: "2", "aws.amazon.com/neuroncore": "4", "example.com/fpga": "2"}
        allocatable = {r: str(int(q) - rnd.choice([0, 0, 0, 1])) for r, q in capacity.items()}
        if rnd.random() < 0.1:
            del allocatable[GPU]
        taints = rnd.sample([DISRUPTED, Taint("example.com/drain", "NoExecute"),
                             Taint("example.com/drain", "NoSchedule"), Taint("example.com/other", "NoSchedule")],
                            rnd.choice([0, 0, 0, 1, 2]))
        conditions = {t: rnd.choice(["True", "False"]) for t in ("KernelDeadlock", "MemoryPressure")
                      if rnd.random() < 0.3}
        return make_node(name, labels, ready=rnd.choice(["True", "True", "True", "False", "Unknown", None]),
                         unschedulable=rnd.random() < 0.2, allocatable=allocatable, capacity=capacity,
                         taints=taints, conditions=conditions)

    def random_devices(self) -> dict[str, list[str]]:
        """Most pods hold no device; some hold GPUs (or TPUs), each Healthy, Unhealthy or Unknown."""
        if self.rnd.random() < 0.6:
            return {}
        return {r: [self.rnd.choice(["Healthy", "Unhealthy", "Unknown"]) for _ in range(self.rnd.randint(1, 3))]
                for r in ("nvidia.com/gpu", "google.com/tpu") if self.rnd.random() < 0.6}

    def step(self) -> None:
        rnd, w, idx = self.rnd, self.world, self.index
        action = rnd.choice(["node", "node", "node_del", "pod", "pod", "pod", "pod", "phase", "devices", "pod_del",
                             "owner", "owner", "owner_del", "nsum", "wsum", "recreate", "claim", "claim", "claim_del",
                             "time"])
        if action == "node":
            name = f"n{rnd.randint(0, 5)}"
            labels = {k: rnd.choice(["a", "b", "c"]) for k in ("pool", "zone") if rnd.random() < 0.8}
            node = self.random_node(name, labels)
            w.nodes[name] = node
            idx.upsert_node(node)
        elif action == "node_del" and w.nodes:
            name = rnd.choice(list(w.nodes))
            del w.nodes[name]
            idx.delete_node(name)
        elif action == "pod":
            name = f"p{rnd.randint(0, 14)}"
            existing = w.pods.get(f"ns/{name}")
            uid = existing.metadata.uid if existing else self.uid("pod")
            parent = self.random_parent() if not existing or rnd.random() < 0.3 else (
                existing.metadata.ownerReferences[0].uid if existing.metadata.ownerReferences else None)
            labels = {k: rnd.choice(["x", "y"]) for k in ("team/job", "team/gang", "team/other")
                      if rnd.random() < 0.3}
            pod = make_pod(name, uid, node=rnd.choice(["", "n0", "n1", "n2", "n3", "n4", "n5", "n9"]),
                           phase=rnd.choice(PHASES), owner=self._parent_ref(parent),
                           cpu=rnd.choice(["100m", "1", "250m"]), labels=labels, devices=self.random_devices())
            w.pods[f"ns/{name}"] = pod
            idx.upsert_pod(pod)
        elif action == "phase" and w.pods:  # most pod churn: the phase alone changes
            key = rnd.choice(list(w.pods))
            pod = msgspec.structs.replace(w.pods[key], status=PodStatus(phase=rnd.choice(PHASES)))
            w.pods[key] = pod
            idx.upsert_pod(pod)
        elif action == "devices" and w.pods:  # the kubelet reports a device's health alone
            key = rnd.choice(list(w.pods))
            status = msgspec.structs.replace(w.pods[key].status,
                                             containerStatuses=[device_status(self.random_devices())])
            pod = msgspec.structs.replace(w.pods[key], status=status)
            w.pods[key] = pod
            idx.upsert_pod(pod)
        elif action == "pod_del" and w.pods:
            key = rnd.choice(list(w.pods))
            del w.pods[key]
            idx.delete_pod(key)
        elif action == "owner":
            if w.owners and rnd.random() < 0.5:
                old = w.owners[rnd.choice(list(w.owners))]
                owner = Owner(old.uid, old.group, old.kind, old.namespace, old.name, self.random_parent())
            else:
                group, kind = rnd.choice(KINDS)
                owner = Owner(self.uid("own"), group, kind, "ns", f"o{self.serial}", self.random_parent())
            w.owners[owner.uid] = owner
            add_owner(idx, owner)
        elif action == "owner_del" and w.owners:
            owner = w.owners.pop(rnd.choice(list(w.owners)))
            idx.delete_owner((owner.group, owner.kind), f"{owner.namespace}/{owner.name}")
        elif action == "recreate" and w.owners:  # same name, new UID: references to the old UID dangle
            old = w.owners.pop(rnd.choice(list(w.owners)))
            owner = Owner(self.uid("own"), old.group, old.kind, old.namespace, old.name, old.parent)
            w.owners[owner.uid] = owner
            add_owner(idx, owner)
        elif action == "claim":  # Karpenter's NodeClaim of node n<i>: c<i>, before or after its Node registered
            i = rnd.randint(0, 5)
            conditions = {t: rnd.choice(["True", "False", "Unknown"]) for t in ("Drifted", "Consolidatable",
                                                                                "DisruptionReason", "Ready")
                          if rnd.random() < 0.4}
            claim = make_nodeclaim(f"c{i}", rnd.choice(["", f"n{i}", f"n{i}"]), conditions, deleting=rnd.random() < 0.1,
                                   expire_after=rnd.choice(["720h", "1h30m", "2h", "Never", "10m"]))
            assert w.nodeclaims is not None
            w.nodeclaims[claim.metadata.name] = claim
            idx.upsert_nodeclaim(claim)
        elif action == "claim_del" and w.nodeclaims:
            name = rnd.choice(list(w.nodeclaims))
            del w.nodeclaims[name]
            idx.delete_nodeclaim(name)
        elif action == "time":  # the clock moves on: NodeClaims come within the expiry horizon
            w.now += rnd.choice([60.0, 600.0, 1800.0])
            idx.tick()
        elif action == "nsum":
            name = rnd.choice(["s-pool", "s-zone", "s-pool2"])
            if rnd.random() < 0.3:
                w.node_summarizers.pop(name, None)
                idx.delete_node_summarizer(name)
            else:
                key = rnd.choice(["pool", "zone"])
                w.node_summarizers[name] = key
                idx.set_node_summarizer(name, key)
        elif action == "wsum":
            name = rnd.choice(["w1", "w2"])
            types = rnd.sample(KINDS, rnd.randint(1, 3))
            keys = labels_of(*rnd.sample(["team/gang", "team/other", "team/job"], rnd.randint(0, 2)))
            before = set(idx.label_keys)
            idx.set_workload_summarizer(name, configured(*types), keys) if rnd.random() < 0.7 else (
                idx.delete_workload_summarizer(name))
            w.configured = {(t.group, t.kind) for ts in idx.workload_summarizers.values() for t in ts}
            w.pod_labels = idx.label_keys
            if set(idx.label_keys) - before:  # as Sources does: every pod again
                for pod in w.pods.values():
                    idx.upsert_pod(pod)
