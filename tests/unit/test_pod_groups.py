"""Unit tests of the in-tree Workload API as a root (no cluster): a pod that names a PodGroup
counts for that PodGroup's Workload, the Workload's owner chain above it is followed as any other,
and "the topmost configured kind" stays the rule. Links by name (pod -> PodGroup -> Workload)
follow whatever object bears the name now."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import (
    GangSchedulingPolicy,
    ObjectMeta,
    OwnerReference,
    Pod,
    PodGroup,
    PodGroupSchedulingPolicy,
    PodGroupSpec,
    PodSchedulingGroup,
    WorkloadReference,
)
from kubeindex.model.owners import MISSING
from tests.builders import configured, make_pod

NS = "ns"
JOB = ("batch", "Job")
WORKLOAD = ("scheduling.k8s.io", "Workload")
JOB_REF = OwnerReference("batch/v1", "Job", "train", "job-uid", controller=True)


def grouped_pod(name: str, group: str, owner: OwnerReference | None = JOB_REF) -> Pod:
    pod = make_pod(name, f"uid-{name}", node="n1", owner=owner)
    pod.spec.schedulingGroup = PodSchedulingGroup(group)
    return pod


def pod_group(name: str, workload: str | None, uid: str = "", min_count: int | None = 2) -> PodGroup:
    gang = GangSchedulingPolicy(min_count) if min_count is not None else None
    return PodGroup(ObjectMeta(name=name, namespace=NS, uid=uid or f"pg-{name}"),
                    PodGroupSpec(WorkloadReference(workload, "workers") if workload else None,
                                 PodGroupSchedulingPolicy(gang)))


def add_workload(index: ClusterIndex, name: str, uid: str = "", job: str | None = "job-uid") -> None:
    index.upsert_owner(WORKLOAD, NS, name, uid or f"wl-{name}", ("batch/v1", "Job", job) if job else None)


def compiled_job(*kinds: tuple[str, str]) -> ClusterIndex:
    """A Job compiled into a Workload and a PodGroup (as the Job controller does), two pods, the
    PodGroups watched, and a summarizer of ``kinds``."""
    index = ClusterIndex()
    index.set_workload_summarizer("w", configured(*kinds))
    index.upsert_owner(JOB, NS, "train", "job-uid", None)
    add_workload(index, "train")
    index.upsert_pod_group(pod_group("train-workers", "train"))
    index.set_follow_pod_groups(True)
    for name in ("p0", "p1"):
        index.upsert_pod(grouped_pod(name, "train-workers"))
    return index


def roots(index: ClusterIndex) -> dict[str, str | None]:
    return {key: entry.workload for key, entry in index.pods.items()}


def test_the_projections_read_the_fields_as_the_api_server_writes_them() -> None:
    pod = msgspec.json.decode(b'{"metadata": {"name": "p"}, "spec": {"schedulingGroup": {"podGroupName": "g"}}}',
                              type=Pod)
    assert pod.spec.pod_group() == "g"
    assert msgspec.json.decode(b'{"spec": {"schedulingGroup": {}}}', type=Pod).spec.pod_group() is None
    group = msgspec.json.decode(b'{"metadata": {"name": "g"}, "spec": {"workloadRef": {"workloadName": "w", '
                                b'"templateName": "t"}, "schedulingPolicy": {"gang": {"minCount": 4}}}}', type=PodGroup)
    assert (group.workload(), group.min_count()) == ("w", 4)
    basic = msgspec.json.decode(b'{"spec": {"schedulingPolicy": {"basic": {}}}}', type=PodGroup)
    assert (basic.workload(), basic.min_count()) == ("", None)


def test_a_pod_in_a_pod_group_counts_for_its_workload() -> None:
    index = compiled_job(WORKLOAD)
    assert roots(index) == {"ns/p0": "wl-train", "ns/p1": "wl-train"}
    agg = index.workloads["wl-train"]
    assert (agg.namespace, agg.name, agg.group, agg.kind, sum(agg.pods.values())) == (
        NS, "train", "scheduling.k8s.io", "Workload", 2)
    assert index.pod_groups["ns/train-workers"].min_count == 2


def test_the_topmost_configured_kind_stays_the_rule() -> None:
    assert set(roots(compiled_job(WORKLOAD, JOB)).values()) == {"job-uid"}  # the Job compiled the Workload
    assert set(roots(compiled_job(JOB)).values()) == {"job-uid"}  # through the group, as without it


def test_pods_hang_below_their_controller_until_the_pod_groups_are_watched() -> None:
    index = ClusterIndex()
    index.set_workload_summarizer("w", configured(WORKLOAD, JOB))
    index.upsert_owner(JOB, NS, "train", "job-uid", None)
    index.upsert_pod(grouped_pod("p0", "train-workers"))
    assert roots(index) == {"ns/p0": "job-uid"}  # no PodGroup watch (forbidden, not served): no pod lost
    bare = ClusterIndex()
    bare.set_workload_summarizer("w", configured(WORKLOAD))
    bare.upsert_pod(grouped_pod("p0", "g", owner=None))
    bare.upsert_pod_group(pod_group("g", "direct"))
    add_workload(bare, "direct", job=None)
    assert roots(bare) == {"ns/p0": None}
    bare.set_follow_pod_groups(True)
    assert roots(bare) == {"ns/p0": "wl-direct"}  # a Workload and PodGroup created directly, bare pods
    bare.set_follow_pod_groups(False)  # the PodGroups' version no longer served
    assert roots(bare) == {"ns/p0": None}
    assert sum(bare.workloads["wl-direct"].pods.values()) == 0  # the Workload stays, without the pod


def test_links_by_name_follow_the_object_that_bears_the_name_now() -> None:
    index = compiled_job(WORKLOAD)
    index.delete_owner(WORKLOAD, "ns/train")
    assert set(roots(index).values()) == {None}
    assert {e.status for e in index.pods.values()} == {MISSING}  # counted as a broken chain, not dropped
    add_workload(index, "train", uid="wl-train-2")  # recreated under the same name
    assert set(roots(index).values()) == {"wl-train-2"}
    index.delete_pod_group("ns/train-workers")
    assert set(roots(index).values()) == {None}
    index.upsert_pod_group(pod_group("train-workers", "train", uid="pg-2"))
    assert set(roots(index).values()) == {"wl-train-2"}
    index.upsert_pod_group(pod_group("train-workers", None, uid="pg-2"))  # names no Workload any more
    assert set(roots(index).values()) == {None}


def test_a_pod_that_stops_naming_a_group_is_forgotten_by_the_group_links() -> None:
    index = compiled_job(WORKLOAD)
    index.upsert_pod(make_pod("p0", "uid-p0", node="n1", owner=JOB_REF))
    index.delete_pod("ns/p1")
    index.set_follow_pod_groups(False)
    index.set_follow_pod_groups(True)
    assert roots(index) == {"ns/p0": None}  # below its Job, which is not configured
    assert len(index.graph.vertices) == 6  # p0, the Job, the Workload and the PodGroup, and their names


# -- any sequence of events: the index's roots are those of an independent walk -------------------------


@dataclass
class World:
    follow: bool = False
    pods: dict[str, tuple[str | None, bool]] = field(default_factory=dict)  # name -> (group, owned by the Job)
    groups: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # name -> (uid, workload)
    workloads: dict[str, tuple[str, bool]] = field(default_factory=dict)  # name -> (uid, owned by the Job)
    job: bool = True
    configured: frozenset[tuple[str, str]] = frozenset()

    def root(self, pod: str) -> str | None:
        """The topmost configured object walking up from the pod; at a missing link, the topmost
        configured one below it (owners.py)."""
        group, owned = self.pods[pod]
        found: str | None = None
        chain: list[tuple[tuple[str, str], str] | None] = []  # None: a missing link
        if group is not None and self.follow:
            if group not in self.groups:
                chain.append(None)
            else:
                workload = self.groups[group][1]
                if workload is not None and workload not in self.workloads:
                    chain.append(None)
                elif workload is not None:
                    uid, owned_wl = self.workloads[workload]
                    chain.append((WORKLOAD, uid))
                    if owned_wl:
                        chain.append((JOB, "job-uid") if self.job else None)
        elif owned:
            chain.append((JOB, "job-uid") if self.job else None)
        for link in chain:
            if link is None:
                break
            if link[0] in self.configured:
                found = link[1]
        return found


NAMES = st.sampled_from(["a", "b"])
OPS = st.one_of(
    st.tuples(st.just("pod"), st.sampled_from(["p0", "p1", "p2"]), st.none() | NAMES, st.booleans()),
    st.tuples(st.just("delete_pod"), st.sampled_from(["p0", "p1", "p2"])),
    st.tuples(st.just("group"), NAMES, st.none() | NAMES, st.integers(0, 2)),
    st.tuples(st.just("delete_group"), NAMES),
    st.tuples(st.just("workload"), NAMES, st.booleans(), st.integers(0, 2)),
    st.tuples(st.just("delete_workload"), NAMES),
    st.tuples(st.just("job"), st.booleans()),
    st.tuples(st.just("follow"), st.booleans()),
    st.tuples(st.just("configure"), st.sets(st.sampled_from([WORKLOAD, JOB]))),
)


def apply(index: ClusterIndex, world: World, op: tuple) -> None:
    match op:
        case ("pod", name, group, owned):
            pod = make_pod(name, f"uid-{name}", node="n1", owner=JOB_REF if owned else None)
            pod.spec.schedulingGroup = PodSchedulingGroup(group) if group else None
            index.upsert_pod(pod)
            world.pods[name] = (group, owned)
        case ("delete_pod", name):
            index.delete_pod(f"{NS}/{name}")
            world.pods.pop(name, None)
        case ("group", name, workload, generation):
            uid = f"pg-{name}-{generation}"
            index.upsert_pod_group(pod_group(name, workload, uid=uid))
            world.groups[name] = (uid, workload)
        case ("delete_group", name):
            index.delete_pod_group(f"{NS}/{name}")
            world.groups.pop(name, None)
        case ("workload", name, owned, generation):
            uid = f"wl-{name}-{generation}"
            add_workload(index, name, uid=uid, job="job-uid" if owned else None)
            world.workloads[name] = (uid, owned)
        case ("delete_workload", name):
            index.delete_owner(WORKLOAD, f"{NS}/{name}")
            world.workloads.pop(name, None)
        case ("job", present):
            if present:
                index.upsert_owner(JOB, NS, "train", "job-uid", None)
            else:
                index.delete_owner(JOB, f"{NS}/train")
            world.job = present
        case ("follow", follow):
            index.set_follow_pod_groups(follow)
            world.follow = follow
        case ("configure", kinds):
            index.set_workload_summarizer("w", configured(*sorted(kinds)))
            world.configured = frozenset(kinds)


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=40))
def test_roots_through_pod_groups_equal_an_independent_walk(ops: list[tuple]) -> None:
    index, world = ClusterIndex(), World()
    index.upsert_owner(JOB, NS, "train", "job-uid", None)
    for op in ops:
        apply(index, world, op)
        assert roots(index) == {f"{NS}/{p}": world.root(p) for p in world.pods}, op
        # The links by name go with their objects: nothing is left behind.
        assert len(index.graph.vertices) == len(world.pods) + 2 * (len(world.groups) + len(world.workloads)) + world.job
    pods = {uid for agg in index.workloads.values() for uid in [agg.uid] if sum(agg.pods.values())}
    assert pods == {root for p in world.pods if (root := world.root(p)) is not None}
