"""The status of each NodeSummarizer and WorkloadSummarizer: a Ready condition and a count, and a
WorkloadSummarizer's KindsServed condition.

Computed from the index and from what the sources can read (``Sources.kind_problem``); the
summarizer controller looks every ``summarizer_interval`` for the summarizers whose status is not
what it should be (``stale``), queues them, and applies ``status_to_write``.

Ready says whether the summarizer works for the kinds the API server serves:
a configured kind that is served but cannot be summarized makes a WorkloadSummarizer
``Ready=False`` with the reason (KindForbidden, KindNotNamespaced). A kind not served (its CRD not
installed, or not at the listed version) is a warning, not a failure: ``KindsServed=False``, reason
KindNotServed, naming the kinds, while Ready stays True for the others. Each problem is said once in
the log per summarizer and message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container, Mapping
from typing import Any

from kubeindex.model.index import ClusterIndex, WorkloadAgg
from kubeindex.model.objects import (
    GROUP,
    LABEL_WORKLOAD_PREFIX,
    NodeSummarizer,
    WorkloadSummarizer,
    WorkloadSummarizerSpec,
)
from kubeindex.model.owners import GroupKind
from kubeindex.model.resources import BY_PLURAL, SUMMARIZERS
from kubeindex.model.revision import Stamped
from kubeindex.runtime.logfields import fields
from kubeindex.watch.sources import Summarizers

from .conditions import with_times
from .manager import DONE, RETRY, Controller, Key, Result
from .writer import Failed, Writer

log = logging.getLogger(__name__)

Summarizer = NodeSummarizer | WorkloadSummarizer
Condition = tuple[str, str, str]  # (status, reason, message) of the Ready condition
NOT_SERVED = "KindNotServed"  # a warning (KindsServed), not a failure (Ready)
# Why a configured kind cannot be summarized, as (reason, message); None when it can.
KindProblem = Callable[[str, str, str | None], tuple[str, str] | None]


class SummarizerStatuses:
    """``usable`` in the methods: the kinds whose WorkloadSummaries can be written now (the
    reconciler's type infos); only their workloads count."""

    def __init__(self, index: ClusterIndex, summarizers: Summarizers, kind_problem: KindProblem) -> None:
        self.index = index
        self.summarizers = summarizers
        self.kind_problem = kind_problem
        self._logged: set[tuple[str, str]] = set()  # (summarizer uid, message) said once in the log (pruned)
        # Workload counts by (kinds, label keys), good while the index's sets and the usable kinds
        # are those they were counted at: the status is evaluated every second, the count is O(workloads).
        self._counts: Stamped[tuple[frozenset[GroupKind], frozenset[str]], int] = Stamped()

    def stale(self, usable: Container[GroupKind]) -> list[tuple[str, str]]:
        """(plural, name) of the summarizers whose status differs from what it should be."""
        if self._logged:  # the marks of summarizers gone: none outlives its object
            live = {obj.metadata.uid for obj in self.summarizers.workload.values()}
            self._logged = {(uid, message) for uid, message in self._logged if uid in live}
        objects: list[tuple[str, Mapping[str, Summarizer]]] = [("nodesummarizers", self.summarizers.node),
                                                               ("workloadsummarizers", self.summarizers.workload)]
        return [(plural, name) for plural, by_name in objects
                for name, obj in by_name.items() if obj.status != self._status(obj, usable)]

    def status_to_write(self, plural: str, name: str, usable: Container[GroupKind]) -> dict[str, Any] | None:
        """The status the summarizer should have; None when it has it already, or is gone."""
        by_name: Mapping[str, Summarizer] = (self.summarizers.node if plural == "nodesummarizers"
                                              else self.summarizers.workload)
        obj = by_name.get(name)
        if obj is None:
            return None
        status = self._status(obj, usable)
        # Compared with the live object: a recreated one (new UID) is seen as new.
        return None if obj.status == status else status

    def _status(self, obj: Summarizer, usable: Container[GroupKind]) -> dict[str, Any]:
        if isinstance(obj, NodeSummarizer):
            cond, counts = self._node_condition(obj)
            conds = {"Ready": cond}
        else:
            conds, counts = self._workload_conditions(obj, usable)
        generation = obj.metadata.generation
        conditions = [{"type": type_, "status": status_value, "reason": reason, "message": message}
                      for type_, (status_value, reason, message) in conds.items()]
        conditions = with_times(conditions, obj.status.get("conditions"), generation, time.time())
        return {"observedGeneration": generation, "conditions": conditions, **counts}

    def _node_condition(self, obj: NodeSummarizer) -> tuple[Condition, dict[str, int]]:
        name, label = obj.metadata.name, obj.spec.labelKey
        count = sum(1 for summarizer, _ in self.index.node_groups if summarizer == name)
        if count:
            return ("True", "Summarizing", f"{count} node groups from the values of node label {label}"), \
                {"groupCount": count}
        return ("True", "NoMatchingNodes", f"no node carries the label {label}"), {"groupCount": 0}

    def _workload_conditions(self, obj: WorkloadSummarizer,
                             usable: Container[GroupKind]) -> tuple[dict[str, Condition], dict[str, int]]:
        """Ready and KindsServed, and the workload count."""
        types, labels = obj.spec.workloadTypes, obj.spec.podLabelWorkloads
        problems = [p for t in types if (p := self.kind_problem(t.group, t.kind, t.version)) is not None]
        count = self._workload_count({(t.group, t.kind) for t in types}, {p.labelKey for p in labels}, usable)
        if problems:
            self._log_once(obj, problems)
        not_served = [message for reason, message in problems if reason == NOT_SERVED]
        failing = [(reason, message) for reason, message in problems if reason != NOT_SERVED]
        served: Condition = (("False", NOT_SERVED, "; ".join(not_served) + "; their workloads are summarized once"
                              " the API server serves them") if not_served
                             else ("True", "AllKindsServed", "every listed kind is served") if types
                             else ("True", "AllKindsServed", "no workload kinds listed"))
        if failing:
            reasons = dict.fromkeys(reason for reason, _ in failing)
            ready: Condition = ("False", next(iter(reasons)), "; ".join(message for _, message in failing))
            return {"Ready": ready, "KindsServed": served}, {"workloadCount": count}
        message = (f"{count} root workloads of the configured types" + (" that are served" if not_served else "")
                   + (" and pod labels" if labels else ""))
        overlaps = self._overlaps(obj)
        if overlaps:
            message += (f"; also listed by {overlaps} (a workload counts for each summarizer that lists its kind "
                        f"or label key)")
        return {"Ready": ("True", "Summarizing", message), "KindsServed": served}, {"workloadCount": count}

    def _workload_count(self, kinds: set[GroupKind], label_keys: set[str], usable: Container[GroupKind]) -> int:
        return self._counts.made((frozenset(kinds), frozenset(label_keys)), (self.index.sets_revision, usable),
                                 lambda: sum(1 for w in self.index.workloads.values()
                                             if _counts_for(w, kinds, label_keys, usable)))

    def _overlaps(self, obj: WorkloadSummarizer) -> str:
        """The other WorkloadSummarizers that list a kind or label key this one lists, and which."""
        mine = _listed(obj.spec)
        others = []
        for name, other in sorted(self.summarizers.workload.items()):
            shared = sorted(mine.keys() & _listed(other.spec).keys())
            if name != obj.metadata.name and shared:
                others.append(f"{name} ({', '.join(mine[k] for k in shared)})")
        return ", ".join(others)

    def _log_once(self, obj: WorkloadSummarizer, problems: list[tuple[str, str]]) -> None:
        for reason, message in problems:
            if (obj.metadata.uid, message) not in self._logged:
                self._logged.add((obj.metadata.uid, message))
                log.warning("%s: %s", reason, message,
                            extra=fields(f"workloadsummarizers.{GROUP}", name=obj.metadata.name, reason=reason))


class SummarizerController(Controller):
    """Writes a summarizer's status when it is not what it should be, looked at every ``interval``.
    ``usable``: the kinds whose WorkloadSummaries can be written now (the summary controller's)."""

    name = "summarizers"
    resources = SUMMARIZERS

    def __init__(self, statuses: SummarizerStatuses, writer: Writer, usable: Callable[[], Container[GroupKind]],
                 debounce: float, interval: float) -> None:
        super().__init__(debounce)
        self.statuses = statuses
        self.writer = writer
        self.usable = usable
        self.interval = interval
        self._next = 0.0

    def queue_changes(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.interval
            for key in self.statuses.stale(self.usable()):
                self.queue.add(key)

    async def reconcile(self, key: Key) -> Result:
        plural, name = key
        status = self.statuses.status_to_write(plural, name, self.usable())
        if status is None:
            return DONE
        self.queue.wrote(key)
        resource = BY_PLURAL[plural]
        body = {"apiVersion": resource.api_version, "kind": resource.kind, "metadata": {"name": name}, "status": status}
        return RETRY if isinstance(await self.writer.apply_status(resource.path(name=name), body),
                                   Failed) else DONE


def _counts_for(w: WorkloadAgg, kinds: set[GroupKind], label_keys: set[str], usable: Container[GroupKind]) -> bool:
    if w.is_object:
        return (w.group, w.kind) in kinds and (w.group, w.kind) in usable
    return w.label_key in label_keys


def _listed(spec: WorkloadSummarizerSpec) -> dict[tuple[str, str], str]:
    """What a WorkloadSummarizer lists, each as the status names it: kinds by (group, kind),
    label keys by (LABEL_WORKLOAD_PREFIX, key), which no (group, kind) equals."""
    return {**{(t.group, t.kind): t.kind for t in spec.workloadTypes},
            **{(LABEL_WORKLOAD_PREFIX, p.labelKey): p.labelKey for p in spec.podLabelWorkloads}}
