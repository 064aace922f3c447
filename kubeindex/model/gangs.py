"""Gangs: sets of pods that must run together, with a minimum (docs/gangs.md).

A pod belongs to at most one gang, named by (first match):
- an in-tree PodGroup it names (spec.schedulingGroup.podGroupName), whose gang policy sets minCount;
- a pod-label gang of a WorkloadSummarizer's spec.gangs.podLabels: the group label's value, with
  the minimum in the min-available label (KubeNexus's pod-group.scheduling.kubenexus.io/name and
  .../min-available, say);
- its JobSet (label jobset.sigs.k8s.io/jobset-name): every pod of the JobSet, the sum over its
  replicatedJobs of replicas x min(parallelism, completions);
- its LeaderWorkerSet group (leaderworkerset.sigs.k8s.io/name and /group-index): the leader and
  its workers, leaderWorkerTemplate.size.

Objects that size a gang (PodGroups, JobSets, LeaderWorkerSets) are its ``source``: the index holds
their sizes by source (ClusterIndex.gang_sizes), so a pod event never reads an object. A gang is
counted per root workload (WorkloadAgg.gangs); a pod event moves one gang's counts by one: O(1).

A gang is Whole while its ready (and succeeded) members reach its minimum. Short of it, it is
Broken when members are *lost* and have been for longer than the grace, else Pending (still being
scheduled or started; or its minimum not known: its object not seen yet, or deleted with its pods
still terminating). A member is ready when its Ready condition is True and its node is Ready; lost
when it is bound to a node that is not Ready (or gone), or Running but not Ready (crashed, failing
its probe): a node lost takes its members at once, before the node lifecycle controller marks the
pods. A member still starting (phase Pending: pulling its image) or not scheduled yet is neither.
The verdict reads only what the objects say now, never what one replica remembers: every replica,
and one started during the break, says the same once the grace has passed for it.

Where the missing members were is kept per place (the node's node groups, and its value of the
topology label): the members lost now, and those deleted since the gang was last whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .objects import share

PODGROUP, JOBSET, LWS = "PodGroup", "JobSet", "LeaderWorkerSet"
GANG_KINDS = (PODGROUP, JOBSET, LWS)  # a WorkloadSummarizer's spec.gangs.kinds
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
WHOLE, PENDING, BROKEN = "Whole", "Pending", "Broken"
GANG_STATES = (WHOLE, PENDING, BROKEN)
GANG_GRACE = 60.0  # seconds a Whole gang may be short before it is Broken (--gang-grace)
TOPOLOGY_LABEL = "topology.kubernetes.io/zone"  # where members were lost, besides node groups (--gang-topology-label)

NodeGroupKey = tuple[str, str]
Place = tuple[tuple[NodeGroupKey, ...], str]  # a node's node groups, and its value of the topology label


@dataclass(frozen=True, slots=True)
class Member:
    """Which gang a pod is in: the gang's key (unique per namespace), its name as shown, the source
    that sizes it ("" for a pod-label gang), and the minimum the pod's own label declares."""

    key: str
    name: str
    source: str = ""
    declared: int | None = None


@dataclass(frozen=True)
class GangConfig:
    """The gangs the WorkloadSummarizers ask for, merged: the kinds that size gangs, and the
    (group label, min-available label) pairs, in precedence order."""

    kinds: frozenset[str] = frozenset()
    labels: tuple[tuple[str, str], ...] = ()
    # One Member per gang (and declared minimum), made once: a pod event of a gang member costs a
    # tuple and a lookup, the members of a gang share one object. Bounded: cleared when full.
    _made: dict[tuple[str, ...], Member] = field(default_factory=dict, compare=False, repr=False)

    def __bool__(self) -> bool:
        return bool(self.kinds or self.labels)

    def member(self, namespace: str, labels: dict[str, str], pod_group: str | None) -> Member | None:
        """The pod's gang: O(configured label pairs)."""
        if pod_group is not None and PODGROUP in self.kinds:
            return self._made.get((PODGROUP, namespace, pod_group)) or self._make(PODGROUP, namespace, pod_group)
        if not labels:
            return None
        for group_key, min_key in self.labels:
            value = labels.get(group_key)
            if value:
                minimum = labels.get(min_key, "")
                return self._made.get(("label", group_key, namespace, value, minimum)) or \
                    self._make(group_key, namespace, value, minimum)
        if JOBSET in self.kinds and (name := labels.get(JOBSET_NAME_LABEL)):
            return self._made.get((JOBSET, namespace, name)) or self._make(JOBSET, namespace, name)
        if LWS in self.kinds and (name := labels.get(LWS_NAME_LABEL)) and (index := labels.get(LWS_GROUP_LABEL)):
            return self._made.get((LWS, namespace, name, index)) or self._make(LWS, namespace, name, index)
        return None

    def _make(self, kind: str, namespace: str, name: str, extra: str | None = None) -> Member:
        if kind in (PODGROUP, JOBSET):
            key = share(f"{kind}:{namespace}/{name}")
            member = Member(key, name, key)
        elif kind == LWS:
            member = Member(share(f"{LWS}:{namespace}/{name}/{extra}"), f"{name}-{extra}",
                            share(f"{LWS}:{namespace}/{name}"))
        else:  # a pod-label gang: ``kind`` is its label key, ``extra`` the declared minimum as written
            member = Member(share(f"label/{kind}:{namespace}/{name}"), name, "", declared(extra))
        if len(self._made) >= 100_000:
            self._made.clear()
        if kind in (PODGROUP, JOBSET):
            self._made[(kind, namespace, name)] = member
        elif kind == LWS:
            self._made[(kind, namespace, name, extra or "")] = member
        else:
            self._made[("label", kind, namespace, name, extra or "")] = member
        return member


def declared(value: str | None) -> int | None:
    """A min-available label's value: a positive decimal integer, else none (the gang's minimum is
    then what its other members declare, or unknown)."""
    if value is None or not value.isdigit() or len(value) > 9:
        return None
    number = int(value)
    return number if number > 0 else None


def source_key(kind: str, namespace: str, name: str) -> str:
    """The source key of a PodGroup, JobSet or LeaderWorkerSet, as Member.source names it."""
    return share(f"{kind}:{namespace}/{name}")


class Gang:
    """One gang of one root workload: its members' counts, and its state (``judge``)."""

    __slots__ = ("at_risk", "broken", "declared", "departed", "entries", "key", "lost", "lost_members", "name",
                 "pods", "ready", "required", "scheduled", "short_since", "source", "succeeded")

    def __init__(self, member: Member) -> None:
        self.key = member.key
        self.name = member.name
        self.source = member.source
        self.declared: dict[int, int] = {}  # minimum declared by members' labels -> members
        self.entries = 0  # pods counted, in any phase: the gang goes when none is left
        self.pods = 0  # unfinished members
        self.scheduled = 0  # unfinished members bound to a node
        self.ready = 0  # of those, Ready on a Ready node
        self.succeeded = 0  # finished members that succeeded: they count towards the minimum
        self.at_risk = 0  # unfinished members on nodes Karpenter is disrupting or may disrupt next (karpenter.RISKS)
        self.lost: dict[Place, int] = {}  # lost members, by where they are
        self.lost_members = 0  # sum of ``lost``
        self.departed: dict[Place, int] = {}  # members deleted since the gang was last whole, by where they were
        self.required: int | None = None  # the minimum; None: not known (its source not seen)
        self.short_since: float | None = None  # since when short with members lost (this replica's clock)
        self.broken = False  # short with members lost for longer than the grace

    @property
    def whole(self) -> bool:
        return self.required is not None and self.ready + self.succeeded >= self.required

    @property
    def state(self) -> str:
        if self.whole:
            return WHOLE
        return BROKEN if self.broken else PENDING

    @property
    def missing(self) -> int:
        """Members short of the minimum (0 when whole or unknown)."""
        if self.required is None:
            return 0
        return max(0, self.required - self.ready - self.succeeded)

    def judge(self, required: int | None, now: Callable[[], float]) -> bool:
        """Take the minimum as it is now; say whether the gang is short with members lost (the
        caller times its grace from ``short_since``)."""
        self.required = required
        if self.whole and self.departed:
            self.departed.clear()  # where members were is news only while it is short
        if required is None or self.whole or not self.lost_members:
            self.short_since, self.broken = None, False
            return False
        if self.short_since is None:
            self.short_since = now()
        return True

    def places(self) -> dict[Place, int]:
        """Where the missing members were: those lost now, and those deleted since the gang was last
        whole. O(places)."""
        out = dict(self.lost)
        for place, n in self.departed.items():
            out[place] = out.get(place, 0) + n
        return out


_RANK = {BROKEN: 0, PENDING: 1, WHOLE: 2}


def gang_order(gang: Gang) -> tuple[int, int, str]:
    """Worst first: Broken, then Pending, then Whole; within a state, most members missing; then by name."""
    return _RANK[gang.state], -gang.missing, gang.name
