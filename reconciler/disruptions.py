"""Events where the app team looks: one rolled-up Event on a WorkloadSummary, in the workload's
namespace, when Karpenter starts disrupting nodes its pods run on, or when the workload (a pod
with karpenter.sh/do-not-disrupt, a PodDisruptionBudget of its namespace) is what keeps Karpenter
from disrupting a node (--karpenter-events=on).

- **Input**: the index's notices (kubeindex/model/disruption.py): a node's state became
  Disrupting (its disruption taint), or Karpenter's DisruptionBlocked Event on a node named a
  blocker (each time Karpenter says it: at most every 2 minutes per node).
- **Keys**: one per workload (its UID) in this controller's queue, paced by the debounce, so the
  notices of a burst (a pool's nodes chosen at once) are one write.
- **Events**: per workload, one per (reason, NodePool, blocker): ``DisruptionStarted`` (Normal)
  or ``DisruptionBlocked`` (Warning, naming the blocker), ``related`` the NodePool. The note names
  no node and no count, so repeats are the same Event: its ``series.count`` counts the nodes (and
  Karpenter's repeats) that made it, written by the recorder of reconciler/events.py (client-go's
  spam filter and correlation; through the manager's writer, so only the leader writes).
- A notice whose WorkloadSummary does not exist yet is kept for a while (the summary is written
  within seconds of the workload's first pods), then dropped; notices a follower saw are dropped
  when it starts to lead: a new leader records what happens from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kubeindex.model.disruption import Blocker, Notice
from kubeindex.model.index import ClusterIndex
from kubeindex.model.resources import WORKLOAD_SUMMARIES
from kubeindex.runtime.logfields import fields

from .events import NORMAL, WARNING, Event, EventRecorder, Ref
from .manager import DONE, Controller, Key, Result
from .writer import Writer

log = logging.getLogger(__name__)
KARPENTER_API = "karpenter.sh/v1"  # of a NodePool, the Events' related object
STARTED, BLOCKED = "DisruptionStarted", "DisruptionBlocked"  # reasons
WAIT_FOR_SUMMARY = 2.0  # seconds between two looks for a workload's summary
MAX_WAITS = 30  # looks before its notices are dropped


@dataclass(frozen=True)
class SummaryRef:
    namespace: str
    name: str
    uid: str


SummaryOf = Callable[[str], SummaryRef | None]  # a workload's UID -> its WorkloadSummary, if it exists


def note(pool: str, blocker: Blocker | None) -> str:
    """The Event's note: no node, no count, so each repeat is the same Event."""
    nodes = f"nodes of NodePool {pool}" if pool else "nodes"
    if blocker is None:
        return f"Karpenter is disrupting {nodes} that run this workload's pods: they are evicted and rescheduled"
    return f"{blocker} keeps Karpenter from disrupting {nodes} that run this workload's pods"


def rolled_up(notices: list[Notice]) -> dict[tuple[str, Blocker | None], list[str]]:
    """(pool, blocker) -> the nodes, in the order they came."""
    out: dict[tuple[str, Blocker | None], list[str]] = {}
    for n in notices:
        out.setdefault((n.pool, n.blocker), []).append(n.node)
    return out


class DisruptionEventController(Controller):
    name = "disruption-events"
    resources = (WORKLOAD_SUMMARIES,)

    def __init__(self, index: ClusterIndex, summary_of: SummaryOf, recorder: EventRecorder, writer: Writer,
                 debounce: float = 1.0) -> None:
        super().__init__(debounce)
        self.index = index
        self.summary_of = summary_of
        self.recorder = recorder
        self.writer = writer
        self.pending: dict[str, list[Notice]] = {}  # workload UID -> notices not yet recorded
        self._waits: dict[str, int] = {}
        index.notices.enabled = True

    def reset(self) -> None:
        super().reset()
        self.pending.clear()
        self._waits.clear()

    def queue_changes(self) -> None:
        notices = self.index.notices.take()
        if self._resync:  # what a follower saw is not this leader's to record
            self._resync = False
            return
        for notice in notices:
            self.pending.setdefault(notice.workload, []).append(notice)
            self.queue.add((WORKLOAD_SUMMARIES.plural, notice.workload))

    async def reconcile(self, key: Key) -> Result:
        uid = key[1]
        notices = self.pending.pop(uid, [])
        if not notices:
            return DONE
        summary = self.summary_of(uid)
        if summary is None:
            waits = self._waits[uid] = self._waits.get(uid, 0) + 1
            if waits < MAX_WAITS and uid in self.index.workloads:
                self.pending.setdefault(uid, [])[:0] = notices  # before any that came meanwhile
                return Result(requeue_after=WAIT_FOR_SUMMARY)
            self._waits.pop(uid, None)
            log.info("%d disruption notices of workload %s dropped: it has no WorkloadSummary", len(notices), uid)
            return DONE
        self._waits.pop(uid, None)
        regarding = Ref(WORKLOAD_SUMMARIES.api_version, WORKLOAD_SUMMARIES.kind, summary.name, summary.uid,
                        summary.namespace)
        for (pool, blocker), nodes in rolled_up(notices).items():
            event = Event(regarding, BLOCKED if blocker else STARTED, "BlockDisruption" if blocker else "Disrupt",
                          note(pool, blocker), WARNING if blocker else NORMAL,
                          Ref(KARPENTER_API, "NodePool", pool) if pool else None)
            result = await self.recorder.record(event, self.writer, times=len(nodes))
            log.info("Event %s on WorkloadSummary %s/%s (%s): %s; nodes %s", event.reason, summary.namespace,
                     summary.name, result, event.note, ", ".join(nodes),
                     extra=fields(WORKLOAD_SUMMARIES.name, summary.namespace, summary.name))
        return DONE
