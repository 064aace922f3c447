"""What keeps Karpenter from disrupting a node, in Karpenter's own words, and the notices of
disruption the reconciler turns into Events on WorkloadSummaries.

**Where a blocker is read.** Karpenter v1.14 states a blocker nowhere but in an Event: on each
disruption pass it publishes ``DisruptionBlocked`` on the Node (and its NodeClaim) of every node it
may not disrupt, with the reason as the note (pkg/controllers/disruption/types.go, ``NewCandidate``):

- ``Pod has "karpenter.sh/do-not-disrupt" annotation (Pod=<ns>/<name>)``;
- ``Pdb prevents pod evictions (PodDisruptionBudget=[<ns>/<name>])``;
- ``Eviction does not support multiple PDBs (PodDisruptionBudget(s)=[<ns>/<a> <ns>/<b>])``;
- ``Disruption is blocked through the "karpenter.sh/do-not-disrupt" annotation`` (on the node);
- and reasons that name nothing to act on (not initialized, nominated for a pending pod, ...),
  which are not blockers here.

The service reads those Events (one narrow watch: reason and regarding kind as field selectors)
instead of recomputing Karpenter's checks from every pod's annotations and every PDB, which would
cost a PDB watch, selector matching on pods' whole label sets, and drift from Karpenter's rules.

**How long a word holds.** Karpenter publishes the same node's ``DisruptionBlocked`` at most once
every 2 minutes (its dedupe, per node), and client-go's spam filter lets through 25, then one per 5
minutes, per node. A blocker holds until the word is older than ``BLOCKER_TTL``, its Event is
gone, a newer word on the node names another, the node goes or is being disrupted (Karpenter then
chose it), or, for a pod, the pod leaves the node.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from datetime import datetime

from .objects import DisruptionEvent

BLOCKED_REASON = "DisruptionBlocked"  # Karpenter's Event reason (pkg/events/reason.go)
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
# Seconds a blocker holds without Karpenter saying it again: its 2 min dedupe plus one refill of
# client-go's spam filter (5 min), with a minute to spare.
BLOCKER_TTL = 480.0
MAX_NOTICES = 10_000  # pending notices kept; beyond, the oldest are dropped (and counted)

POD, PDB, NODE = "Pod", "PodDisruptionBudget", "Node"

_POD = re.compile(r'pod has "karpenter\.sh/do-not-disrupt" annotation \(Pod=([^/\s()]+)/([^\s()]+)\)', re.I)
_PDBS = re.compile(r"(?:pdb prevents pod evictions|eviction does not support multiple PDBs) "
                   r"\(PodDisruptionBudget(?:\(s\))?=\[([^\]]*)\]\)", re.I)
_NODE = re.compile(r'disruption is blocked through the "karpenter\.sh/do-not-disrupt" annotation', re.I)


@dataclass(frozen=True)
class Blocker:
    """A pod with karpenter.sh/do-not-disrupt, the PodDisruptionBudget(s) that allow no eviction
    of a pod on the node, or the node's own do-not-disrupt annotation."""

    kind: str  # POD, PDB or NODE
    namespace: str  # "" for NODE
    names: tuple[str, ...]  # one, but for two PDBs on one pod

    def __str__(self) -> str:
        if self.kind == NODE:
            return f"the node's {DO_NOT_DISRUPT} annotation"
        which = ", ".join(f"{self.namespace}/{n}" for n in self.names)
        if self.kind == POD:
            return f"pod {which} ({DO_NOT_DISRUPT})"
        if len(self.names) > 1:
            return f"PodDisruptionBudgets {which} (more than one on a pod: no eviction)"
        return f"PodDisruptionBudget {which} (no disruption allowed)"

    @property
    def pod_key(self) -> str:
        """The blocking pod's store key ("" unless a pod)."""
        return f"{self.namespace}/{self.names[0]}" if self.kind == POD else ""


def parse_blocker(note: str) -> Blocker | None:
    """The blocker a DisruptionBlocked note names; None: none (a reason with nothing to act on)."""
    if (m := _POD.search(note)) is not None:
        return Blocker(POD, m.group(1), (m.group(2),))
    if (m := _PDBS.search(note)) is not None:
        keys = [k.partition("/") for k in m.group(1).split()]
        namespaces = {ns for ns, _, _ in keys}
        if keys and len(namespaces) == 1 and all(name for _, _, name in keys):
            return Blocker(PDB, namespaces.pop(), tuple(name for _, _, name in keys))
        return None
    if _NODE.search(note) is not None:
        return Blocker(NODE, "", ())
    return None


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 time (a metav1.Time or MicroTime) as seconds since the epoch; None: none."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def observed(event: DisruptionEvent) -> float | None:
    """When the Event last happened: its series' last observation, the core Event's lastTimestamp
    (Karpenter records through the core API), or its eventTime."""
    times = [t for t in (parse_time(event.series.lastObservedTime if event.series else None),
                         parse_time(event.deprecatedLastTimestamp), parse_time(event.eventTime),
                         parse_time(event.deprecatedFirstTimestamp)) if t is not None]
    return max(times) if times else None


@dataclass(frozen=True)
class Block:
    """A node's current blocker, and the Event that said it, when."""

    event: str  # the Event's store key
    observed: float
    blocker: Blocker


@dataclass(frozen=True)
class Notice:
    """A workload's pods met a disruption: on a node being disrupted (``blocker`` None), or the
    workload holds a node Karpenter may not disrupt (its pod, or a PDB of its namespace)."""

    workload: str  # the index's workload key (an owner's UID)
    node: str
    pool: str  # the node's karpenter.sh/nodepool, "" if none
    blocker: Blocker | None = None


class Notices:
    """Pending notices, oldest first, bounded: the reconciler's Events take them (``take``)."""

    def __init__(self, limit: int = MAX_NOTICES) -> None:
        self.enabled = False  # nothing is kept while no one takes them
        self.pending: deque[Notice] = deque(maxlen=limit)
        self.dropped = 0

    def add(self, notice: Notice) -> None:
        if not self.enabled:
            return
        if len(self.pending) == self.pending.maxlen:
            self.dropped += 1
        self.pending.append(notice)

    def take(self) -> list[Notice]:
        taken = list(self.pending)
        self.pending.clear()
        return taken
