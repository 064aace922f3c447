"""Karpenter's NodeClaims, as the cluster index joins them to its nodes: where each node stands in
its pool's rollout, and whether Karpenter may disrupt it soon (docs/karpenter.md).

A NodeClaim is kept as a ``ClaimEntry`` of five slots, never as the decoded object. Each event
costs O(1) (O(log claims) for the expiry heap): the entry is replaced and, when what a node shows
changed, the index is told that node's name (``changed``), and it moves that node's facts between
its node groups (O(resources)) and, when its disruption risk changed, the workloads of its pods
(O(pods on that node)), as for a node's own event.

- **Rollout** (``ROLLOUT_STATES``): ``Disrupting`` while Karpenter disrupts it (the condition
  ``DisruptionReason`` True, or the NodeClaim being deleted), else ``Drifted`` (``Drifted`` True),
  else ``UpToDate``.
- **Candidate** (``CANDIDATES``): why Karpenter may disrupt it next: ``Drifted``, ``Expiring``
  (``creationTimestamp + spec.expireAfter`` within the horizon: expiration has no condition, and
  deletes without budget), or ``Consolidatable`` (``consolidateAfter`` passed; empty or not).
  The horizon is time-based: ``tick`` moves the NodeClaims whose horizon came since the last.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable
from datetime import datetime

from .objects import NodeClaim

UP_TO_DATE, DRIFTED, DISRUPTING = "UpToDate", "Drifted", "Disrupting"
ROLLOUT_STATES = (UP_TO_DATE, DRIFTED, DISRUPTING)
EXPIRING, CONSOLIDATABLE = "Expiring", "Consolidatable"
CANDIDATES = (DRIFTED, EXPIRING, CONSOLIDATABLE)  # in precedence order
RISKS = (DISRUPTING, *CANDIDATES)  # why a workload's pods are at risk: their node's, in precedence order
EXPIRY_HORIZON = 3600.0  # seconds before its expiry a node is a candidate (--nodeclaim-expiry-horizon)

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def go_duration(text: str) -> float | None:
    """Seconds of a Go duration ("720h", "1h30m0s"); None for "Never", "" or what does not parse."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNITS[u] for n, u in parts)


def timestamp(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time ("2026-12-02T17:03:52Z"); None when absent."""
    try:
        return datetime.fromisoformat(text).timestamp() if text else None
    except ValueError:
        return None


class ClaimEntry:
    """One NodeClaim as the index keeps it."""

    __slots__ = ("consolidatable", "drifted", "expires_at", "node", "rollout")

    def __init__(self, node: str, rollout: str, drifted: bool, consolidatable: bool, expires_at: float | None) -> None:
        self.node = node  # status.nodeName ("" before its Node registered)
        self.rollout = rollout
        self.drifted = drifted
        self.consolidatable = consolidatable
        self.expires_at = expires_at  # None: never

    def candidate(self, now: float, horizon: float) -> str:
        if self.drifted:
            return DRIFTED
        if self.expires_at is not None and self.expires_at - now <= horizon:
            return EXPIRING
        return CONSOLIDATABLE if self.consolidatable else ""


def entry_of(claim: NodeClaim) -> ClaimEntry:
    drifted = claim.is_true("Drifted")
    if claim.metadata.deletionTimestamp or claim.is_true("DisruptionReason"):
        rollout = DISRUPTING
    else:
        rollout = DRIFTED if drifted else UP_TO_DATE
    created, lifetime = timestamp(claim.metadata.creationTimestamp), go_duration(claim.spec.expireAfter)
    expires_at = created + lifetime if created is not None and lifetime is not None else None
    return ClaimEntry(claim.status.nodeName, rollout, drifted, claim.is_true("Consolidatable"), expires_at)


NodeFacts = tuple[str, str]  # (rollout, candidate) a node shows; ("", "") without a NodeClaim


class NodeClaims:
    """The NodeClaims by name and by node; ``changed`` is called with each node whose facts moved."""

    def __init__(self, changed: Callable[[str], None], now: Callable[[], float],
                 horizon: float = EXPIRY_HORIZON) -> None:
        self.changed = changed
        self.now = now
        self.horizon = horizon
        self.claims: dict[str, ClaimEntry] = {}
        self.by_node: dict[str, ClaimEntry] = {}
        self._horizons: list[tuple[float, str]] = []  # (when it becomes Expiring, claim name): a heap

    def facts(self, node: str) -> NodeFacts:
        entry = self.by_node.get(node)
        if entry is None:
            return "", ""
        return entry.rollout, entry.candidate(self.now(), self.horizon)

    def upsert(self, claim: NodeClaim) -> None:
        name = claim.metadata.name
        new, old = entry_of(claim), self.claims.get(name)
        self.claims[name] = new
        if old is not None and old.node != new.node and self.by_node.get(old.node) is old:
            del self.by_node[old.node]
            self.changed(old.node)
        if new.node:
            self.by_node[new.node] = new
        if new.expires_at is not None and (old is None or old.expires_at != new.expires_at):
            self._push(new.expires_at, name)
        if new.node and (old is None or old.node != new.node or self._shown(old) != self._shown(new)):
            self.changed(new.node)

    def delete(self, name: str) -> None:
        old = self.claims.pop(name, None)
        if old is not None and old.node and self.by_node.get(old.node) is old:
            del self.by_node[old.node]
            self.changed(old.node)

    def tick(self) -> None:
        """NodeClaims whose expiry came within the horizon since the last tick become Expiring."""
        now = self.now()
        while self._horizons and self._horizons[0][0] <= now:
            at, name = heapq.heappop(self._horizons)
            entry = self.claims.get(name)
            if entry is not None and entry.node and entry.expires_at is not None \
                    and entry.expires_at - self.horizon == at:
                self.changed(entry.node)

    def _push(self, expires_at: float, name: str) -> None:
        """Into the heap; rebuilt from the live NodeClaims when those deleted or moved since fill most of
        it (amortized O(1): each rebuild follows as many pushes as it keeps)."""
        if len(self._horizons) > 2 * len(self.claims) + 64:
            self._horizons = [(e.expires_at - self.horizon, n) for n, e in self.claims.items()
                              if e.expires_at is not None and n != name]
            heapq.heapify(self._horizons)
        heapq.heappush(self._horizons, (expires_at - self.horizon, name))

    def _shown(self, entry: ClaimEntry) -> NodeFacts:
        return entry.rollout, entry.candidate(self.now(), self.horizon)
