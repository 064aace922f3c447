"""The ClusterResourceClaim and ClusterQueue controllers: keep the ClusterQueues' nominalQuota
equal to what the claims assign, and each claim's status, through the manager's writer (its
leadership checks, its token bucket).

- **Keys.** ("clusterresourceclaims", name) in ``ClaimController``'s queue, ("clusterqueues", name)
  in ``ClusterQueueController``'s. Each one's pass queues every claim, or every queue a claim
  names, when a claim or a ClusterQueue changed (``KueueIndex.objects_revision``) or a claimed flavor's
  capacity did since that controller last looked (``Claims.changed``); a settle timer or a
  throttled queue queues its key again when it is due.
- **At take time** (client-go style) the whole plan is evaluated again (reconciler/quota.py's
  ``evaluate``: claims are few), from the index as it is then: the claims, the ClusterQueue objects,
  and each claim's capacity. Capacity: for clusterName ``local``, the allocatable of the flavor's
  nodes whose Ready condition is True (``KueueIndex.capacity``); for a member cluster (a hub run
  with --fleet), from its NodeSummary of the flavor's nodes (kubeindex/watch/fleet.py: None while connecting,
  zero once unreachable past the grace), Ready saying why; without --fleet a claim naming another
  cluster is held with Ready=False, reason ClusterUnknown.
- **Members' claims**: a member flavor of known capacity that no claim is on gets one
  (``<member>-<flavor>``, no assignments), created at take time like every other write.
- **State in the claim's status**, so a new leader neither applies a change twice nor loses one in
  mid-settle: the Settler's capacity in effect (``settledResources``, of the cluster and flavor in
  ``settledFor``: a claim moved to another flavor starts afresh) and since when the live capacity
  differs (``pendingSince``); the contribution last given (``queues``, each with its
  flavor): the Hold policy's input.
- **Claim status**: a server-side apply of the status subresource (force, field manager
  ``node-workload-summary``) when it differs from the object's; a condition keeps its
  lastTransitionTime while its status is unchanged.
- **Kueue's version**: a ClusterQueue is patched at the version it was read at (its
  ``apiVersion``: the one the API server prefers among those this code knows), so the patch's
  field paths are that version's. While Kueue's kinds are served only at versions this code does
  not know (``kueue_problem``), every claim's Ready says so (reason KueueVersionUnknown).
- **ClusterQueue writes** (only with actuation on): the RFC 6902 patch of quota.py
  (``replace /metadata/resourceVersion`` first, then the changed nominalQuota paths); 409 Conflict
  (the queue changed since it was read) goes back to the queue with backoff. At most
  ``max_writes_per_hour`` writes per queue per hour (per replica: a new leader starts a fresh
  count); every attempt is counted by queue and result. Each write is logged (the queue, and per
  nominalQuota changed its flavor, resource, old -> new and the claims that make it) and recorded
  as an Event (reason QuotaWritten) on each claim whose quota it wrote, the ClusterQueue its related
  object (reconciler/events.py: rate-limited and deduplicated as client-go does).
- **Dry run** (actuation off, the default): the same evaluation and status, and the metrics of
  what each queue would get; no ClusterQueue is written. Quota changes admission cluster-wide, so
  an administrator opts in, after reading what the dry run reports.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

import msgspec

from kubeindex.client.api import Conflict
from kubeindex.model.kueue import KueueIndex
from kubeindex.model.objects import GROUP, ClaimStatus, ClusterResourceClaim, SettledFor, claim_status
from kubeindex.model.quantity import parse_nano
from kubeindex.model.resources import CLAIMS, CLUSTER_QUEUES, Resource
from kubeindex.runtime.logfields import fields
from kubeindex.watch.fleet import Fleet

from .conditions import rfc3339, with_times
from .events import Event, EventRecorder, Ref
from .manager import DONE, RETRY, Controller, Key, Result
from .names import hashed_name, is_dns1123_subdomain
from .quota import (
    LOCAL,
    Capacity,
    Contribution,
    Plan,
    QuotaChange,
    ResourceClaim,
    Settler,
    SettleState,
    evaluate,
    parse_claim,
    parse_time,
)
from .writer import Done, Failed, Writer

log = logging.getLogger(__name__)
HOUR = 3600.0
# A Ready reason under which no capacity was in effect.
UNKNOWN_CAPACITY = ("CapacityUnknown", "ClusterUnknown", "KueueVersionUnknown", "MemberUnsupported")
MEMBER_LABEL = f"{GROUP}/member"  # on the claims made for a member's flavors
QUOTA_WRITTEN, WRITE_QUOTA = "QuotaWritten", "WriteQuota"  # the Event of a quota write: reason, action


@dataclass
class ClaimSettings:
    settle: float = 120.0  # seconds a capacity change lasts before it takes effect (--quota-settle)
    actuation: bool = False  # write ClusterQueues (--quota-actuation); off: a dry run
    max_writes_per_hour: int = 60  # per ClusterQueue (--quota-max-writes-per-hour)


@dataclass(frozen=True)
class Evaluation:
    """One evaluation, at ``now``: the plan, each claim's settle state, the queues as evaluated."""

    now: float
    plan: Plan
    settle: dict[str, SettleState]  # claim name -> its settle state now
    queues: dict[str, dict[str, Any]]  # ClusterQueue name -> the object evaluated (decoded JSON)


@dataclass
class QuotaWrites:
    """The ClusterQueue writes: when each queue was written in the last hour, and counts."""

    times: dict[str, deque[float]] = field(default_factory=dict)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, result) -> attempts

    def count(self, queue: str, result: str) -> None:
        self.counts[(queue, result)] = self.counts.get((queue, result), 0) + 1

    def next_allowed(self, queue: str, now: float, per_hour: int) -> float:
        """When the queue may be written next (<= now: at once)."""
        times = self.times.setdefault(queue, deque())
        while times and times[0] <= now - HOUR:
            times.popleft()
        return now if len(times) < per_hour else times[0] + HOUR


def _nano(values: Mapping[str, str]) -> dict[str, int]:
    """Quantities read back from a status, a malformed one left out."""
    out = {}
    for resource, text in values.items():
        try:
            out[resource] = parse_nano(text)
        except (ValueError, ArithmeticError):
            continue
    return out


def settled_for(cluster: str, flavor: str) -> dict[str, str]:
    """status.settledFor: whose capacity settledResources is."""
    return {"clusterName": cluster, "flavor": flavor}


def settle_state(status: ClaimStatus, key: tuple[str, str]) -> SettleState:
    """The Settler's state as the claim's status keeps it, for the claim's (cluster, flavor) now.
    No capacity was in effect before the first status, while the capacity was unknown, or for
    another cluster or flavor (the spec changed): then the first value takes effect at once."""
    reason = status.ready_reason()
    if reason is None or reason in UNKNOWN_CAPACITY or status.settledFor != SettledFor(*key):
        return SettleState()
    return SettleState(_nano(status.settledResources), parse_time(status.pendingSince))


def held_contribution(claim: ClusterResourceClaim) -> Contribution:
    """What the claim gave last (status.queues): Hold's input."""
    queues = claim_status(claim).queues
    flavor = next((q.flavor for q in queues), str(claim.spec.get("flavor", "")))
    return Contribution(flavor, {q.name: _nano(q.resources) for q in queues})


def _parsed(claim: ClusterResourceClaim) -> ResourceClaim:
    meta = claim.metadata
    return parse_claim({"metadata": {"name": meta.name, "creationTimestamp": meta.creationTimestamp},
                        "spec": claim.spec})


def named_queues(claims: Iterable[ClusterResourceClaim]) -> set[str]:
    """The ClusterQueues the claims name in their assignments."""
    out = set()
    for claim in claims:
        assignments = claim.spec.get("resourceAssignments")
        for a in assignments if isinstance(assignments, list) else ():
            if isinstance(a, Mapping) and isinstance(a.get("clusterQueueName"), str):
                out.add(a["clusterQueueName"])
    return out


def queue_resource(queue: Mapping[str, Any]) -> Resource:
    """ClusterQueues at the version the queue was read at (a projection made in code may lack it:
    the newest known)."""
    version = str(queue.get("apiVersion") or "").rpartition("/")[2]
    return CLUSTER_QUEUES.at(version) if version else CLUSTER_QUEUES


def _invalid(conditions: list[dict[str, Any]]) -> bool:
    """Ready says the claim itself is wrong (its spec, or a duplicate): that stands whatever Kueue is."""
    return any(c["type"] == "Ready" and c["reason"] in ("InvalidSpec", "Duplicate") for c in conditions)


def _kueue_unknown(conditions: list[dict[str, Any]], problem: str) -> list[dict[str, Any]]:
    ready = {"type": "Ready", "status": "False", "reason": "KueueVersionUnknown",
             "message": f"{problem}; the quota last applied for this claim is kept"}
    return [ready if c["type"] == "Ready" else c for c in conditions]


def _cluster_unknown(conditions: list[dict[str, Any]], cluster: str) -> list[dict[str, Any]]:
    ready = {"type": "Ready", "status": "False", "reason": "ClusterUnknown",
             "message": f"cluster {cluster} is not known: without --fleet this replica claims the capacity of cluster"
                        f" {LOCAL} only; the quota last applied for this claim is kept"}
    return [ready if c["type"] == "Ready" else c for c in conditions]


def _member_ready(conditions: list[dict[str, Any]], fleet: Fleet, cluster: str, flavor: str,
                  before: Any) -> list[dict[str, Any]]:
    """Ready as the member makes it: why its capacity is not known, or why it is not read now.
    While the member is connecting (a hub that just started), the capacity last read stands, and
    so does the Ready the claim had: a restart writes nothing."""
    ready = next(c for c in conditions if c["type"] == "Ready")
    problem = fleet.problem(cluster)
    if ready["reason"] in ("InvalidSpec", "Duplicate"):
        return conditions
    had = next((c for c in before if isinstance(c, Mapping) and c.get("type") == "Ready"),
               None) if isinstance(before, list) else None
    if problem is not None and problem.reason == "MemberUnsupported":  # no retry mends it: said as such
        ready = {"type": "Ready", "status": "False", "reason": problem.reason,
                 "message": f"{problem.message}; the quota last applied for this claim is kept"}
    elif ready["reason"] == "CapacityUnknown":  # kept: no capacity was in effect (settle_state reads it)
        why = problem.message if problem is not None else fleet.why_unknown(cluster, flavor)
        ready = {**ready, "message": f"{why}; the quota last applied for this claim is kept"}
    elif problem is not None and problem.reason == "MemberConnecting" and had is not None:
        ready = {k: had[k] for k in ("type", "status", "reason", "message") if k in had}
    elif problem is not None and problem.reason == "MemberConnecting":
        ready = {"type": "Ready", "status": "False", "reason": problem.reason,
                 "message": f"{problem.message}; the capacity last read stands"}
    elif problem is not None:
        ready = {"type": "Ready", "status": "False", "reason": problem.reason,
                 "message": f"{problem.message}; {ready['message']}" if ready["status"] == "False" else problem.message}
    return [ready if c["type"] == "Ready" else c for c in conditions]


def changes_text(changes: Iterable[QuotaChange], claims_of: Mapping[tuple[str, str], tuple[str, ...]] | None = None,
                 ) -> str:
    """``flavor a100 cpu 64 -> 32, nvidia.com/gpu 16 -> 4 (claim a100); flavor h100 ...``: the
    changes of one write, by flavor, each group with the claims that make it (``claims_of``)."""
    parts = []
    for (flavor, claims), group in groupby(changes, key=lambda c: (
            c.flavor, claims_of.get((c.flavor, c.resource), ()) if claims_of is not None else ())):
        claimed = f" (claim{'s' if len(claims) > 1 else ''} {', '.join(claims)})" if claims else ""
        parts.append(f"flavor {flavor} {', '.join(c.text() for c in group)}{claimed}")
    return "; ".join(parts)


def member_claim_name(member: str, flavor: str, taken: Container[str]) -> str:
    """`<member>-<flavor>`, or a hashed name when that is no valid name or another claim's."""
    plain = f"{member}-{flavor}"
    if is_dns1123_subdomain(plain) and plain not in taken:
        return plain
    return hashed_name(plain, f"{member}\x00{flavor}")


class Claims:
    """The claims' evaluation and writes, shared by the two controllers (ClaimController,
    ClusterQueueController), each of which owns a queue and calls its ``reconcile_*``."""

    def __init__(self, kueue: KueueIndex, settings: ClaimSettings | None = None,
                 clock: Callable[[], float] = time.time, fleet: Fleet | None = None,
                 recorder: EventRecorder | None = None, kueue_problem: Callable[[], str | None] = lambda: None) -> None:
        self.kueue = kueue
        self.kueue_problem = kueue_problem  # Sources.kueue_problem: Kueue served at versions not known
        self.fleet = fleet
        self.recorder = recorder  # None: quota writes are logged, no Event recorded
        self.settings = settings or ClaimSettings()
        self.clock = clock  # wall time: pendingSince is kept in the claims and read by the next leader
        self.settler = Settler(self.settings.settle)
        self.writes = QuotaWrites()
        self.last: Evaluation | None = None  # the latest evaluation (to inspect; the metrics read the status)
        self._seen: dict[str, tuple[int, int, str | None, dict[tuple[str, str], Capacity | None]]] = {}
        self.wanted: dict[str, tuple[str, str]] = {}  # claims to create: name -> (member, flavor)

    # -- what to queue ----------------------------------------------------------------------------

    def _live(self, cluster: str, flavor: str) -> Capacity | None:
        if cluster == LOCAL:
            return self.kueue.capacity(flavor)
        return self.fleet.capacity(cluster, flavor) if self.fleet is not None else None

    def _wanted(self, claims: list[ClusterResourceClaim]) -> dict[str, tuple[str, str]]:
        """A claim for every member flavor of known capacity that no claim is on (a member joined)."""
        if self.fleet is None:
            return {}
        claimed = {_parsed(c).key for c in claims}
        taken = {c.metadata.name for c in claims}
        wanted = {}
        for key in self.fleet.wanted_claims():
            if key not in claimed:
                name = member_claim_name(*key, taken)
                wanted[name] = key
                taken.add(name)
        return wanted

    def changed(self, consumer: str) -> bool:
        """Whether a claim, a ClusterQueue or a claimed capacity changed since ``consumer`` last asked."""
        claimed = {_parsed(c).key for c in self.kueue.claims.values()}  # as the evaluation reads them
        fleet = self.fleet.version if self.fleet is not None else 0
        seen = (self.kueue.objects_revision, fleet, self.kueue_problem(), {k: self._live(*k) for k in claimed})
        if seen == self._seen.get(consumer):
            return False
        self._seen[consumer] = seen
        return True

    def claim_keys(self) -> list[Key]:
        """Every claim's key, and those of the claims to create (``wanted``, looked up again)."""
        claims = list(self.kueue.claims.values())
        self.wanted = self._wanted(claims)
        return [*((CLAIMS.plural, c.metadata.name) for c in claims), *((CLAIMS.plural, name) for name in self.wanted)]

    def queue_keys(self) -> list[Key]:
        """The key of every ClusterQueue a claim names."""
        return [(CLUSTER_QUEUES.plural, q) for q in sorted(named_queues(self.kueue.claims.values()))]

    # -- evaluation -------------------------------------------------------------------------------

    def evaluate(self) -> Evaluation:
        now = self.clock()
        # Oldest first, then by name, as quota.evaluate orders them (no creationTimestamp: last).
        claims = sorted(self.kueue.claims.values(), key=lambda c: (_parsed(c).created, c.metadata.name))
        parsed = [_parsed(c) for c in claims]
        settle: dict[str, SettleState] = {}
        live: dict[tuple[str, str], Capacity | None] = {}
        settled: dict[tuple[str, str], Capacity | None] = {}
        for obj, claim in zip(claims, parsed, strict=True):
            capacity = self._live(*claim.key)
            state = settle[claim.name] = self.settler.observe(settle_state(claim_status(obj), claim.key), capacity, now)
            live.setdefault(claim.key, capacity)  # the oldest claim on a (cluster, flavor) counts
            settled.setdefault(claim.key, state.effective)
        held = {c.metadata.name: held_contribution(c) for c in claims}
        queues = {name: msgspec.to_builtins(q) for name, q in self.kueue.queue_objects.items()}
        self.last = Evaluation(now, evaluate(parsed, queues, settled, live, held), settle, queues)
        return self.last

    def claim_status(self, claim: ClusterResourceClaim, ev: Evaluation) -> dict[str, Any]:
        """The status the claim should have, per the evaluation."""
        result = ev.plan.claims[claim.metadata.name]
        status = dict(result.status)
        conditions = status["conditions"]
        cluster, flavor = _parsed(claim).key  # an invalid spec keeps its InvalidSpec reason
        kueue = self.kueue_problem()
        if kueue is not None and not _invalid(conditions):
            conditions = _kueue_unknown(conditions, kueue)
        elif cluster != LOCAL and self.fleet is None:
            conditions = _cluster_unknown(conditions, cluster)
        elif cluster != LOCAL and self.fleet is not None:
            conditions = _member_ready(conditions, self.fleet, cluster, flavor, claim.status.get("conditions"))
            problem = self.fleet.problem(cluster)
            if problem is not None and problem.reason == "MemberConnecting" and "nominalResources" in claim.status:
                status.setdefault("nominalResources", claim.status["nominalResources"])  # the last read stands
        status["conditions"] = with_times(conditions, claim.status.get("conditions"), claim.metadata.generation,
                                           ev.now)
        if "queues" in status:
            status["queues"] = [{**q, "flavor": result.contribution.flavor} for q in status["queues"]]
        state = ev.settle[claim.metadata.name]
        if state.effective is not None:
            status["settledFor"] = settled_for(*_parsed(claim).key)
        if state.since is not None:
            status["pendingSince"] = rfc3339(state.since)
        status["observedGeneration"] = claim.metadata.generation
        return status

    def due(self, claim: ClusterResourceClaim, ev: Evaluation) -> float | None:
        """Seconds until the claim's pending capacity takes effect (None: nothing pending)."""
        state = ev.settle[claim.metadata.name]
        when = self.settler.due(state, self._live(*_parsed(claim).key))
        return None if when is None else max(0.0, when - ev.now) + 0.5

    # -- writes ----------------------------------------------------------------------------------

    async def reconcile_claim(self, name: str, writer: Writer) -> Result:
        """The claim's status; a member flavor's claim created."""
        claim = self.kueue.claims.get(name)
        if claim is None:
            return await self._create(name, *self.wanted[name], writer) if name in self.wanted else DONE
        ev = self.evaluate()
        status = self.claim_status(claim, ev)
        if status != claim.status:
            body = {"apiVersion": CLAIMS.api_version, "kind": CLAIMS.kind, "metadata": {"name": name},
                    "status": status}
            outcome = await writer.apply_status(CLAIMS.path(name=name), body)
            if not isinstance(outcome, Done):  # failed, or deleted meanwhile
                return RETRY if isinstance(outcome, Failed) else DONE
        return Result(requeue_after=self.due(claim, ev))

    async def _create(self, name: str, member: str, flavor: str, writer: Writer) -> Result:
        """A member's flavor joined: its claim, with no assignments (the administrator's part)."""
        if (member, flavor) in {_parsed(c).key for c in self.kueue.claims.values()}:
            return DONE  # made meanwhile (by us, seen since, or by someone else)
        body = {"apiVersion": CLAIMS.api_version, "kind": CLAIMS.kind,
                "metadata": {"name": name, "labels": {MEMBER_LABEL: member} if len(member) <= 63 else {}},
                "spec": {"clusterName": member, "flavor": flavor, "resourceAssignments": []}}
        return RETRY if isinstance(await writer.create(CLAIMS.path(), body), Failed) else DONE

    async def reconcile_queue(self, name: str, writer: Writer) -> Result:
        """The ClusterQueue's nominalQuota (with actuation on), bounded per hour."""
        ev = self.evaluate()
        queue = ev.queues.get(name)
        patch = ev.plan.patch(queue) if queue is not None else []
        if queue is None or not patch or not self.settings.actuation:
            return DONE
        allowed = self.writes.next_allowed(name, ev.now, self.settings.max_writes_per_hour)
        if allowed > ev.now:
            self.writes.count(name, "throttled")
            return Result(requeue_after=allowed - ev.now)
        changes = ev.plan.changes(queue)
        outcome = await writer.json_patch(queue_resource(queue).path(name=name), patch)
        if isinstance(outcome, Failed):
            self.writes.count(name, "conflict" if isinstance(outcome.error, Conflict) else "error")
            return RETRY
        self.writes.times[name].append(ev.now)
        self.writes.count(name, "applied")
        await self._written(name, queue, changes, ev.plan, writer)
        return DONE

    async def _written(self, name: str, queue: Mapping[str, Any], changes: list[QuotaChange], plan: Plan,
                       writer: Writer) -> None:
        """A ClusterQueue's quota was written: a log line with every change and its claims, and an
        Event on each claim whose quota changed."""
        claims_of = {(c.flavor, c.resource): tuple(plan.claims_of(name, c.flavor, c.resource)) for c in changes}
        mine: dict[str, list[QuotaChange]] = {}
        for change in changes:
            for claim in claims_of[(change.flavor, change.resource)]:
                mine.setdefault(claim, []).append(change)
        log.info("ClusterQueue %s nominalQuota written: %s", name, changes_text(changes, claims_of),
                 extra=fields(CLUSTER_QUEUES.name, name=name, claim=",".join(sorted(mine))))
        if self.recorder is None:
            return
        meta = queue.get("metadata")
        uid = str(meta.get("uid", "")) if isinstance(meta, Mapping) else ""
        related = Ref(queue_resource(queue).api_version, CLUSTER_QUEUES.kind, name, uid)
        for claim, written in sorted(mine.items()):
            obj = self.kueue.claims.get(claim)
            if obj is None:
                continue
            others = sorted({c for w in written for c in plan.claims_of(name, w.flavor, w.resource)} - {claim})
            note = (f"ClusterQueue {name} nominalQuota written: {changes_text(written)}"
                    + (f" (summed with claims {', '.join(others)})" if others else ""))
            regarding = Ref(CLAIMS.api_version, CLAIMS.kind, claim, obj.metadata.uid)
            await self.recorder.record(Event(regarding, QUOTA_WRITTEN, WRITE_QUOTA, note, related=related), writer)


class _ClaimsController(Controller):
    """A controller over the claims' evaluation: it queues its keys whenever that changed."""

    def __init__(self, claims: Claims, writer: Writer) -> None:
        super().__init__()
        self.claims = claims
        self.writer = writer

    def keys(self) -> Iterable[Key]:
        raise NotImplementedError

    def queue_changes(self) -> None:
        if self.claims.changed(self.name) or self._resync:
            self._resync = False
            for key in self.keys():
                self.queue.add(key)


class ClaimController(_ClaimsController):
    """Each ClusterResourceClaim's status; a member flavor's claim created."""

    name = CLAIMS.plural
    resources = (CLAIMS,)

    def keys(self) -> Iterable[Key]:
        return self.claims.claim_keys()

    async def reconcile(self, key: Key) -> Result:
        return await self.claims.reconcile_claim(key[1], self.writer)


class ClusterQueueController(_ClaimsController):
    """The nominalQuota of each ClusterQueue a claim names (with actuation on)."""

    name = CLUSTER_QUEUES.plural
    resources = (CLUSTER_QUEUES,)

    def keys(self) -> Iterable[Key]:
        return self.claims.queue_keys()

    async def reconcile(self, key: Key) -> Result:
        return await self.claims.reconcile_queue(key[1], self.writer)
