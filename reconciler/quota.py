"""ClusterResourceClaim quota arithmetic: claims and capacity in, each claim's status and each
ClusterQueue's nominalQuota out. Pure: no I/O, no clock (time comes in as seconds).

Quantities are exact integers of nano-units (kubeindex/model/quantity.py parses and formats them).

The rules:
- **Spec.** ``clusterName`` (default ``local``), ``flavor``, ``overAllocation`` (``Scale`` | ``Hold``,
  default ``Scale``), ``resourceAssignments``: each a ``clusterQueueName`` and exactly one of
  ``resources`` (absolute quantities) or ``shares`` (``NN%`` / ``NN.N%`` of capacity). The CRD's
  CEL rules normally refuse bad specs; an object that slipped past them (an older CRD) is parsed as
  far as it goes, each problem a one-line reason, and the claim is treated as held (below).
- **Rounding.** A share s% of capacity C is floor(C * s / 100), rounded down to what Kueue counts:
  cpu to whole millicores, every other resource to whole units. Kueue reads cpu quota with
  MilliValue() and the rest with Value(), both rounding up, so a 1.5 GPU share written as 1500m
  would admit 2 GPUs; it is written as 1. Absolute quantities are taken as written.
- **Assigned** per resource = the absolutes plus the resolved shares. Over-allocated when assigned
  exceeds the settled capacity for some resource; shortfall = assigned - settled there.
- **Policy when over-allocated**, per resource that does not fit:
  ``Scale`` shrinks the share-based amounts proportionally (down to 0) into what the absolutes
  leave; if the absolutes alone exceed capacity, shares go to 0 and the absolutes shrink
  proportionally. Every amount is rounded down as above, so the total never exceeds capacity.
  The OverAllocated message names each amount shrunk: resource, queue, old -> new, and why.
  ``Hold`` contributes the quota last applied for the claim (an input) for the flavor it claims,
  unchanged (nothing, if nothing was applied for that flavor).
- **Held**, whatever the flavor last applied: an invalid claim, and a claim whose capacity is not
  known (None: no ResourceFlavor, or a cluster not read yet). Zeroing a queue because an object is
  broken or a cluster unreachable would be the wrong way to fail.
- **Duplicates.** Of the claims on one (clusterName, flavor), the oldest (creationTimestamp, then
  name) counts; the newer ones are Duplicate and contribute nothing (no queue field is theirs).
- **Desired nominalQuota** of (queue, flavor, resource) = the sum of the contributions of the claims
  naming it. Only triples present in the ClusterQueue's spec.resourceGroups are written; the others
  are reported on the claim as QueueMissing. Triples no claim names are never touched.
- **lendingLimit.** Kueue's webhook refuses a nominalQuota below the resource's lendingLimit. The
  written value is then max(desired, min(lendingLimit, current nominalQuota)): lowered as far as
  the webhook allows and no further, never raised by the rule itself, and reported on the claims
  (Ready=False, reason LendingLimitAbove, with the numbers). The lendingLimit is another manager's
  field: it is not lowered here.
- **The write** to one ClusterQueue is an RFC 6902 JSON patch: ``replace /metadata/resourceVersion``
  first (a stale version gives 409 Conflict: re-read, recompute), then one ``replace`` per changed
  nominalQuota, as canonical quantity strings. borrowingLimit, lendingLimit, other flavors and
  other resources are never in it. Nothing changed: no patch.
- **Settling.** Per (cluster, flavor) a Settler holds the capacity in effect. The first value seen
  takes effect at once; afterwards a live value takes effect only once the live value has differed
  from the one in effect continuously for ``settle`` seconds (the value of that moment is taken).
  A decrease waits ``decrease_settle``, by default the same: Kueue does not evict when quota falls,
  so acting sooner on a loss gains little, and a node that reboots would cost two writes.
- **Status.** nominalResources (live), settledResources (each with 0 for a resource the claim's
  assignments name and the capacity lacks: a pool at zero shows 0, an unknown capacity nothing),
  assigned (shares resolved at the settled capacity), unassigned, shortfall, queues (the claim's
  contribution), assignedPercent (the highest assigned/settled ratio, rounded down, over resources
  with capacity; a resource assigned with no capacity shows in the shortfall), and the conditions
  Ready, OverAllocated, QueueMissing and Duplicate. Ready is False with the first reason that
  applies: InvalidSpec, Duplicate, CapacityUnknown, OverAllocated, QueueMissing, LendingLimitAbove.
  Each message names the numbers or names at fault. observedGeneration and the conditions' times are the controller's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from kubeindex.model.quantity import NANO, QuantityError, format_quantity, parse_nano

from .names import is_dns1123_subdomain

LOCAL = "local"
MILLI = NANO // 1000  # nano-units in a milli-unit: Kueue's cpu granule
MAX_ASSIGNMENTS = 64  # the CRD's maxItems
PERMILLE = 1000  # shares are kept in tenths of a percent
_SHARE = re.compile(r"([0-9]{1,3})(?:\.([0-9]))?%")

Capacity = Mapping[str, int]  # resource -> nano-units
Amounts = dict[str, dict[str, int]]  # queue -> resource -> nano-units
QuotaKey = tuple[str, str]  # (flavor, resource) within one ClusterQueue


class Policy(StrEnum):
    SCALE = "Scale"
    HOLD = "Hold"


# -- the spec --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Assignment:
    """One queue's part of a claim: absolute amounts or shares (tenths of a percent), never both."""

    queue: str
    resources: Mapping[str, int] = field(default_factory=dict)
    shares: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ClaimSpec:
    flavor: str
    cluster: str = LOCAL
    policy: Policy = Policy.SCALE
    assignments: tuple[Assignment, ...] = ()


@dataclass(frozen=True)
class ResourceClaim:
    """A ClusterResourceClaim as the arithmetic sees it. ``problems`` empty: a valid spec."""

    name: str
    created: float  # creationTimestamp, seconds since the epoch (inf when missing: it loses ties)
    spec: ClaimSpec
    problems: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return self.spec.cluster, self.spec.flavor


def parse_claim(obj: Mapping[str, Any]) -> ResourceClaim:
    """A claim from its object as decoded JSON; never raises."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    spec, problems = parse_spec(obj.get("spec"))
    created = parse_time(meta.get("creationTimestamp"))
    return ResourceClaim(str(meta.get("name", "")), math.inf if created is None else created, spec, problems)


def parse_time(value: Any) -> float | None:
    """An RFC 3339 time as seconds since the epoch (None: absent or not a time)."""
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return None


def parse_spec(spec: Any) -> tuple[ClaimSpec, tuple[str, ...]]:
    """The spec, as far as it is valid, and one line per problem (empty: valid)."""
    if not isinstance(spec, Mapping):
        return ClaimSpec(flavor=""), ("spec is not an object",)
    problems: list[str] = []
    cluster = _cluster_name(spec.get("clusterName"), problems)
    flavor = _flavor(spec.get("flavor"), problems)
    policy = _policy(spec.get("overAllocation"), problems)
    assignments = _assignments(spec.get("resourceAssignments"), problems)
    problems += _share_sums(assignments)
    return ClaimSpec(flavor, cluster, policy, assignments), tuple(problems)


def _cluster_name(value: Any, problems: list[str]) -> str:
    if value is None:
        return LOCAL
    if isinstance(value, str) and is_dns1123_subdomain(value):
        return value  # a MultiKueueCluster's name
    problems.append(f"clusterName {value!r} is not a DNS-1123 subdomain")
    return LOCAL


def _flavor(value: Any, problems: list[str]) -> str:
    if value is None:
        problems.append("flavor is missing")
    elif not isinstance(value, str) or not is_dns1123_subdomain(value):
        problems.append(f"flavor {value!r} is not a ResourceFlavor name (DNS-1123 subdomain)")
    else:
        return value
    return ""


def _policy(value: Any, problems: list[str]) -> Policy:
    if value is None:
        return Policy.SCALE
    if value in tuple(Policy):
        return Policy(value)
    problems.append(f"overAllocation {value!r} is neither Scale nor Hold")
    return Policy.HOLD  # held while invalid anyway


def _assignments(value: Any, problems: list[str]) -> tuple[Assignment, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        problems.append("resourceAssignments is not a list")
        return ()
    if len(value) > MAX_ASSIGNMENTS:
        problems.append(f"resourceAssignments has {len(value)} entries (at most {MAX_ASSIGNMENTS})")
    out: list[Assignment] = []
    for i, item in enumerate(value):
        assignment = _assignment(i, item, problems)
        if assignment is None:
            continue
        if any(a.queue == assignment.queue for a in out):
            problems.append(f"resourceAssignments[{i}]: clusterQueueName {assignment.queue} appears more than once")
            continue
        out.append(assignment)
    return tuple(out)


def _assignment(i: int, item: Any, problems: list[str]) -> Assignment | None:
    where = f"resourceAssignments[{i}]"
    if not isinstance(item, Mapping):
        problems.append(f"{where} is not an object")
        return None
    queue = item.get("clusterQueueName")
    if not isinstance(queue, str) or not is_dns1123_subdomain(queue):
        problems.append(f"{where}: clusterQueueName {queue!r} is not a ClusterQueue name")
        return None
    where = f"{where} ({queue})"
    has_resources, has_shares = item.get("resources") is not None, item.get("shares") is not None
    if has_resources == has_shares:
        problems.append(f"{where} needs exactly one of resources or shares")
        return None
    kind, parse = ("resources", _quantity) if has_resources else ("shares", _share)
    entries = item[kind]
    if not isinstance(entries, Mapping):
        problems.append(f"{where}: {kind} is not a map")
        return None
    parsed = {}
    for resource, text in entries.items():
        value, problem = parse(text)
        if problem:
            problems.append(f"{where}: {kind}[{resource}] {problem}")
        else:
            parsed[str(resource)] = value
    return Assignment(queue, resources=parsed) if has_resources else Assignment(queue, shares=parsed)


def _quantity(text: Any) -> tuple[int, str]:
    """Nano-units of a non-negative quantity, or a problem."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        return 0, f"{text!r} is not a quantity"
    try:
        value = parse_nano(text)
    except (QuantityError, ArithmeticError, ValueError):
        return 0, f"{text!r} is not a quantity"
    return (0, f"{text!r} is negative") if value < 0 else (value, "")


def _share(text: Any) -> tuple[int, str]:
    """Tenths of a percent of "NN%" / "NN.N%" (0 to 100%), or a problem."""
    match = _SHARE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        return 0, f"{text!r} is not a share like 50% or 12.5%"
    value = int(match[1]) * 10 + int(match[2] or 0)
    return (0, f"{text!r} is above 100%") if value > PERMILLE else (value, "")


def _share_sums(assignments: Iterable[Assignment]) -> list[str]:
    totals: dict[str, int] = {}
    for a in assignments:
        for resource, share in a.shares.items():
            totals[resource] = totals.get(resource, 0) + share
    return [f"the shares of {r} add up to {_percent_text(t)} (at most 100%)"
            for r, t in sorted(totals.items()) if t > PERMILLE]


def _percent_text(permille: int) -> str:
    whole, tenth = divmod(permille, 10)
    return f"{whole}.{tenth}%" if tenth else f"{whole}%"


# -- amounts ---------------------------------------------------------------------------------------


def granule(resource: str) -> int:
    """The smallest amount Kueue counts: a millicore for cpu, one unit for the rest."""
    return MILLI if resource == "cpu" else NANO


def floor_to_granule(resource: str, nano: int) -> int:
    return nano - nano % granule(resource)


def share_amount(resource: str, capacity: int, permille: int) -> int:
    """floor(capacity * share), rounded down to what Kueue counts."""
    return floor_to_granule(resource, capacity * permille // PERMILLE)


def governed(spec: ClaimSpec) -> set[str]:
    """The resources whose quota the claim sets: those its assignments name."""
    return {r for a in spec.assignments for r in (*a.resources, *a.shares)}


def asked(spec: ClaimSpec, capacity: Capacity) -> Amounts:
    """What each queue asks, shares resolved at ``capacity``: before any policy."""
    out: Amounts = {}
    for a in spec.assignments:
        amounts = dict(a.resources)
        amounts.update({r: share_amount(r, capacity.get(r, 0), s) for r, s in a.shares.items()})
        out[a.queue] = amounts
    return out


def totals(amounts: Amounts) -> dict[str, int]:
    out: dict[str, int] = {}
    for per_queue in amounts.values():
        for resource, value in per_queue.items():
            out[resource] = out.get(resource, 0) + value
    return out


def shortfall(assigned: Capacity, capacity: Capacity) -> dict[str, int]:
    return {r: v - capacity.get(r, 0) for r, v in sorted(assigned.items()) if v > capacity.get(r, 0)}


def _asked_of(spec: ClaimSpec, resource: str, cap: int) -> tuple[dict[str, int], dict[str, int]]:
    """What the queues ask of one resource: the absolute amounts, and the shares resolved at ``cap``."""
    absolute = {a.queue: a.resources[resource] for a in spec.assignments if resource in a.resources}
    shares = {a.queue: share_amount(resource, cap, a.shares[resource])
              for a in spec.assignments if resource in a.shares}
    return absolute, shares


def scale(spec: ClaimSpec, capacity: Capacity) -> Amounts:
    """The Scale policy: every resource fitted into its capacity, shares shrunk before absolutes."""
    out: Amounts = {a.queue: {} for a in spec.assignments}
    for resource in sorted(governed(spec)):
        cap = capacity.get(resource, 0)
        for queue, value in _fit(resource, *_asked_of(spec, resource, cap), cap).items():
            out[queue][resource] = value
    return out


def _fit(resource: str, absolute: dict[str, int], shares: dict[str, int], cap: int) -> dict[str, int]:
    used = sum(absolute.values())
    if used + sum(shares.values()) <= cap:
        return absolute | shares
    if used <= cap:
        return absolute | _shrink(resource, shares, cap - used)
    return _shrink(resource, absolute, cap) | dict.fromkeys(shares, 0)


def scale_text(spec: ClaimSpec, capacity: Capacity) -> str:
    """What Scale shrank, by how much and for which queue, one phrase per queue and resource
    (those that fit are not named), e.g. ``nvidia.com/gpu of queue prod 8 -> 4 (50% share of
    capacity 16, shrunk into the 4 the absolute amounts leave)``."""
    phrases = []
    for resource in sorted(governed(spec)):
        cap = capacity.get(resource, 0)
        absolute, shares = _asked_of(spec, resource, cap)
        fitted = _fit(resource, absolute, shares, cap)
        left = cap - sum(absolute.values())
        for a in sorted(spec.assignments, key=lambda a: a.queue):
            old = absolute.get(a.queue, shares.get(a.queue))
            if old is None or fitted[a.queue] >= old:
                continue
            if a.queue in absolute:
                why = f"absolute amount, shrunk in proportion into capacity {format_quantity(resource, cap)}"
            elif left >= 0:
                why = (f"{_percent_text(a.shares[resource])} share of capacity {format_quantity(resource, cap)},"
                       f" shrunk into the {format_quantity(resource, left)} the absolute amounts leave")
            else:
                why = (f"{_percent_text(a.shares[resource])} share of capacity {format_quantity(resource, cap)}:"
                       " the absolute amounts alone exceed it")
            phrases.append(f"{resource} of queue {a.queue} {format_quantity(resource, old)} ->"
                           f" {format_quantity(resource, fitted[a.queue])} ({why})")
    return "Scale shrank " + ("; ".join(phrases) if phrases else "nothing")


def _shrink(resource: str, amounts: dict[str, int], budget: int) -> dict[str, int]:
    """Proportionally into ``budget`` (< their sum), each rounded down: the sum stays within it."""
    total = sum(amounts.values())
    return {q: floor_to_granule(resource, v * budget // total) for q, v in amounts.items()}


# -- the ClusterQueues -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """One (flavor, resource) of a ClusterQueue: where its nominalQuota is, and its values."""

    path: str  # JSON pointer of the nominalQuota
    nominal: int | None  # None: missing or not a quantity
    lending: int | None  # None: no lendingLimit


def queue_slots(queue: Mapping[str, Any]) -> dict[QuotaKey, Slot]:
    """The (flavor, resource) pairs of a ClusterQueue object (as decoded JSON). Malformed entries
    are skipped; a pair listed twice (Kueue's webhook refuses that) keeps its first place."""
    out: dict[QuotaKey, Slot] = {}
    spec = queue.get("spec")
    groups = spec.get("resourceGroups") if isinstance(spec, Mapping) else None
    for i, group in enumerate(groups if isinstance(groups, list) else ()):
        flavors = group.get("flavors") if isinstance(group, Mapping) else None
        for j, flavor in enumerate(flavors if isinstance(flavors, list) else ()):
            resources = flavor.get("resources") if isinstance(flavor, Mapping) else None
            for k, res in enumerate(resources if isinstance(resources, list) else ()):
                if not isinstance(res, Mapping):
                    continue
                key = (str(flavor.get("name")), str(res.get("name")))
                path = f"/spec/resourceGroups/{i}/flavors/{j}/resources/{k}/nominalQuota"
                out.setdefault(key, Slot(path, _known(res.get("nominalQuota")), _known(res.get("lendingLimit"))))
    return out


def _known(value: Any) -> int | None:
    if value is None:
        return None
    parsed, problem = _quantity(value)
    return None if problem else parsed


def written_value(desired: int, slot: Slot) -> int:
    """What is written for ``desired``: never below the lendingLimit unless it already is."""
    if slot.lending is None or desired >= slot.lending:
        return desired
    current = slot.lending if slot.nominal is None else slot.nominal
    return max(desired, min(slot.lending, current))


@dataclass(frozen=True)
class QuotaChange:
    """One nominalQuota a write changes: where, and from what to what."""

    flavor: str
    resource: str
    path: str  # JSON pointer
    old: int | None  # None: missing or not a quantity
    new: int

    def text(self) -> str:
        old = "none" if self.old is None else format_quantity(self.resource, self.old)
        return f"{self.resource} {old} -> {format_quantity(self.resource, self.new)}"


def quota_changes(queue: Mapping[str, Any], quota: Mapping[QuotaKey, int]) -> list[QuotaChange]:
    """The nominalQuota values of ``quota``'s (flavor, resource) pairs that differ on this
    ClusterQueue, in the order of their paths."""
    slots = queue_slots(queue)
    return [QuotaChange(key[0], key[1], slot.path, slot.nominal, quota[key])
            for key, slot in sorted(slots.items(), key=lambda kv: _path_order(kv[1].path))
            if key in quota and slot.nominal != quota[key]]


def queue_patch(queue: Mapping[str, Any], quota: Mapping[QuotaKey, int]) -> list[dict[str, Any]]:
    """The RFC 6902 patch that sets the nominalQuota of ``quota``'s (flavor, resource) pairs on this
    ClusterQueue, and nothing else; [] when nothing changes. A queue object without a
    resourceVersion (never one from the API server) gets no patch: it could not be made conditional."""
    ops = [{"op": "replace", "path": c.path, "value": format_quantity(c.resource, c.new)}
           for c in quota_changes(queue, quota)]
    meta = queue.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    if not ops or not version:
        return []
    return [{"op": "replace", "path": "/metadata/resourceVersion", "value": version}, *ops]


def _path_order(path: str) -> tuple[int, ...]:
    return tuple(int(p) for p in path.split("/") if p.isdigit())


# -- settling --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SettleState:
    """The capacity in effect for one (cluster, flavor), and since when the live value differs."""

    effective: Mapping[str, int] | None = None  # None until a first value is seen
    since: float | None = None


@dataclass(frozen=True)
class Settler:
    """A live capacity takes effect once it has differed from the one in effect for ``settle``
    seconds without a break (``decrease_settle`` when some resource would fall; None: ``settle``).
    A live value of None (not known now) changes nothing and breaks the wait."""

    settle: float
    decrease_settle: float | None = None

    def observe(self, state: SettleState, live: Capacity | None, now: float) -> SettleState:
        effective = None if state.effective is None else _nonzero(state.effective)  # a status lists zeros
        if live is None:
            return SettleState(effective)
        current = _nonzero(live)
        if effective is None:
            return SettleState(current)  # the first value takes effect at once
        if current == effective:
            return SettleState(effective)
        since = now if state.since is None else state.since
        if now - since >= self.wait(effective, current):
            return SettleState(current)
        return SettleState(effective, since)

    def wait(self, effective: Capacity, live: Capacity) -> float:
        falls = any(live.get(r, 0) < v for r, v in effective.items())
        return self.settle if not falls or self.decrease_settle is None else self.decrease_settle

    def due(self, state: SettleState, live: Capacity | None) -> float | None:
        """When ``live`` would take effect if it stays as it is (None: nothing pending)."""
        if live is None or state.effective is None or state.since is None:
            return None
        current, effective = _nonzero(live), _nonzero(state.effective)
        return None if current == effective else state.since + self.wait(effective, current)


def _nonzero(capacity: Capacity) -> dict[str, int]:
    """A resource at 0 and a resource not listed are the same capacity."""
    return {r: v for r, v in sorted(capacity.items()) if v}


# -- claims to statuses and quota ------------------------------------------------------------------


@dataclass(frozen=True)
class Contribution:
    """What a claim gives the ClusterQueues: queue -> resource -> nano-units, of one flavor.
    The controller keeps the one last applied per claim: Hold's input."""

    flavor: str
    queues: Amounts = field(default_factory=dict)

    def triples(self) -> set[tuple[str, str, str]]:
        return {(q, self.flavor, r) for q, amounts in self.queues.items() for r in amounts}


@dataclass(frozen=True)
class ClaimResult:
    contribution: Contribution
    status: dict[str, Any]


@dataclass(frozen=True)
class Plan:
    """The outcome of one evaluation."""

    claims: dict[str, ClaimResult]  # by claim name
    desired: dict[str, dict[QuotaKey, int]]  # queue -> (flavor, resource) -> summed contributions
    quota: dict[str, dict[QuotaKey, int]]  # what to write: desired under the lendingLimit rule

    def patch(self, queue: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The patch of one ClusterQueue: the object that was evaluated (its resourceVersion makes
        the patch fail with 409 if the queue changed since; then read, evaluate and patch again)."""
        meta = queue.get("metadata")
        name = meta.get("name", "") if isinstance(meta, Mapping) else ""
        return queue_patch(queue, self.quota.get(name, {}))

    def changes(self, queue: Mapping[str, Any]) -> list[QuotaChange]:
        """What the patch of this ClusterQueue changes."""
        meta = queue.get("metadata")
        name = meta.get("name", "") if isinstance(meta, Mapping) else ""
        return quota_changes(queue, self.quota.get(name, {}))

    def claims_of(self, queue: str, flavor: str, resource: str) -> list[str]:
        """The claims whose contributions make the quota of (queue, flavor, resource), by name."""
        return sorted(name for name, result in self.claims.items()
                      if (queue, flavor, resource) in result.contribution.triples())


@dataclass
class _Claim:
    """One claim while it is evaluated."""

    claim: ResourceClaim
    live: Capacity | None
    settled: Capacity | None
    asked: Amounts
    contribution: Contribution
    mode: str  # how the contribution was made: "asked", "Scale", "Hold", "held", "none"
    duplicate_of: str = ""
    missing: list[str] = field(default_factory=list)
    lending: list[str] = field(default_factory=list)

    @property
    def assigned(self) -> dict[str, int]:
        return totals(self.asked)

    @property
    def shortfall(self) -> dict[str, int]:
        return shortfall(self.assigned, self.settled) if self.settled is not None else {}


def evaluate(claims: Iterable[ResourceClaim], queues: Mapping[str, Mapping[str, Any]],
             settled: Mapping[tuple[str, str], Capacity | None],
             live: Mapping[tuple[str, str], Capacity | None] | None = None,
             held: Mapping[str, Contribution] | None = None) -> Plan:
    """Every claim's contribution and status, and every ClusterQueue's desired nominalQuota.

    ``queues``: ClusterQueue objects by name. ``settled`` / ``live``: capacity per (cluster, flavor)
    in effect / as seen now (missing or None: not known; ``live`` defaults to ``settled``).
    ``held``: per claim name, the contribution last applied for it."""
    live = settled if live is None else live
    held = held or {}
    claims = sorted(claims, key=lambda c: (c.created, c.name))
    winners: dict[tuple[str, str], str] = {}
    states = [_claim_state(c, winners, settled, live, held) for c in claims]
    slots = {name: queue_slots(q) for name, q in queues.items()}
    desired = _desired(states, slots)
    quota = _quota(states, desired, slots)
    results = {s.claim.name: ClaimResult(s.contribution, _status(s)) for s in states}
    return Plan(results, desired, quota)


def _claim_state(claim: ResourceClaim, winners: dict[tuple[str, str], str],
                 settled: Mapping[tuple[str, str], Capacity | None],
                 live: Mapping[tuple[str, str], Capacity | None], held: Mapping[str, Contribution]) -> _Claim:
    """Claims come oldest first: the first on a (cluster, flavor) wins it. An invalid claim, or one
    whose capacity is unknown, keeps what was applied for it whatever its flavor (nothing changes);
    Hold keeps what was applied for the flavor it claims now."""
    flavor, capacity = claim.spec.flavor, settled.get(claim.key)
    state = _Claim(claim, live.get(claim.key), capacity, asked(claim.spec, capacity or {}), Contribution(flavor),
                   "none")
    winner = winners.setdefault(claim.key, claim.name) if flavor else claim.name
    last = held.get(claim.name, Contribution(flavor))
    if winner != claim.name:
        state.duplicate_of = winner
    elif claim.problems or capacity is None:
        state.contribution, state.mode = _copy(last), "held"
    elif not state.shortfall:
        state.contribution, state.mode = Contribution(flavor, state.asked), "asked"
    elif claim.spec.policy is Policy.HOLD:
        state.contribution, state.mode = _copy(last) if last.flavor == flavor else Contribution(flavor), "Hold"
    else:
        state.contribution, state.mode = Contribution(flavor, scale(claim.spec, capacity)), "Scale"
    return state


def _copy(c: Contribution) -> Contribution:
    return Contribution(c.flavor, {q: dict(r) for q, r in c.queues.items()})


def _desired(states: list[_Claim], slots: Mapping[str, dict[QuotaKey, Slot]]) -> dict[str, dict[QuotaKey, int]]:
    """The sums over claims of the triples that exist; each claim's missing ones noted on it."""
    desired: dict[str, dict[QuotaKey, int]] = {}
    for s in states:
        if s.duplicate_of:
            continue
        named = Contribution(s.claim.spec.flavor, s.asked).triples() | s.contribution.triples()
        s.missing = _missing(named, slots)
        for queue, amounts in s.contribution.queues.items():
            for resource, value in amounts.items():
                key = (s.contribution.flavor, resource)
                if key in slots.get(queue, {}):
                    per_queue = desired.setdefault(queue, {})
                    per_queue[key] = per_queue.get(key, 0) + value
    return desired


def _missing(named: set[tuple[str, str, str]], slots: Mapping[str, dict[QuotaKey, Slot]]) -> list[str]:
    """One line per queue lacking something named: the queue, its flavor, or resources."""
    out = []
    for queue, flavor in sorted({(q, f) for q, f, _ in named}):
        if queue not in slots:
            out.append(f"ClusterQueue {queue} does not exist")
            continue
        present = {r for f, r in slots[queue] if f == flavor}
        lacking = sorted({r for q, f, r in named if (q, f) == (queue, flavor)} - present)
        if not present:
            out.append(f"ClusterQueue {queue} has no flavor {flavor}")
        elif lacking:
            out.append(f"ClusterQueue {queue} flavor {flavor} has no {', '.join(lacking)}"
                       f" (it has {', '.join(sorted(present))})")
    return out


def _quota(states: list[_Claim], desired: dict[str, dict[QuotaKey, int]],
           slots: Mapping[str, dict[QuotaKey, Slot]]) -> dict[str, dict[QuotaKey, int]]:
    """The values to write, and a LendingLimitAbove note on each claim giving to a triple held up."""
    quota: dict[str, dict[QuotaKey, int]] = {}
    for queue, per_queue in desired.items():
        for key, value in per_queue.items():
            slot = slots[queue][key]
            written = quota.setdefault(queue, {})[key] = written_value(value, slot)
            if slot.lending is not None and value < slot.lending:
                flavor, resource = key
                note = (f"ClusterQueue {queue} flavor {flavor}: the claims give {resource}"
                        f" {format_quantity(resource, value)} but its lendingLimit is"
                        f" {format_quantity(resource, slot.lending or 0)}, and Kueue refuses a nominalQuota"
                        f" below it; nominalQuota stays at {format_quantity(resource, written)}")
                for s in states:
                    if not s.duplicate_of and (queue, flavor, resource) in s.contribution.triples():
                        s.lending.append(note)
    return quota


# -- status ----------------------------------------------------------------------------------------


def _quantities(values: Mapping[str, int]) -> dict[str, str]:
    return {r: format_quantity(r, v) for r, v in sorted(values.items())}


def _condition(type_: str, true: bool | None, reason: str, message: str) -> dict[str, str]:
    status = "Unknown" if true is None else str(bool(true))
    return {"type": type_, "status": status, "reason": reason, "message": message}


def assigned_percent(assigned: Capacity, settled: Capacity) -> str:
    """The highest assigned/settled ratio, rounded down, over resources with capacity; "" when none."""
    ratios = [100 * v // settled[r] for r, v in assigned.items() if settled.get(r, 0) > 0]
    return f"{max(ratios)}%" if ratios else ""


def _short_text(s: _Claim) -> str:
    settled = s.settled or {}
    return ", ".join(f"{r} short by {format_quantity(r, v)} (assigned {format_quantity(r, s.assigned[r])},"
                     f" capacity {format_quantity(r, settled.get(r, 0))})" for r, v in s.shortfall.items())


def _over_allocated(s: _Claim) -> dict[str, str]:
    if s.settled is None:
        return _condition("OverAllocated", None, "CapacityUnknown", "the flavor's capacity is not known")
    if not s.shortfall:
        return _condition("OverAllocated", False, "WithinCapacity", "the assignments fit the settled capacity")
    if s.mode == "Scale":
        action = scale_text(s.claim.spec, s.settled)
    elif s.mode in ("Hold", "held"):
        action = "the quota last applied for this claim is kept"
    else:
        action = "this claim contributes nothing"
    return _condition("OverAllocated", True, "AssignmentsExceedCapacity",
                      f"{_short_text(s)}; {action}: lower the assignments or add capacity")


def _queue_missing(s: _Claim) -> dict[str, str]:
    if not s.missing:
        return _condition("QueueMissing", False, "QueuesFound", "every named ClusterQueue has the flavor and resources")
    return _condition("QueueMissing", True, "QueueMissing",
                      "; ".join(s.missing) + ": add them to the ClusterQueues, or remove the assignments")


def _duplicate(s: _Claim) -> dict[str, str]:
    if not s.duplicate_of:
        return _condition("Duplicate", False, "Unique", "no older claim is on this cluster and flavor")
    cluster, flavor = s.claim.key
    return _condition("Duplicate", True, "OlderClaimExists",
                      f"claim {s.duplicate_of} already claims cluster {cluster} flavor {flavor}; this one contributes"
                      " nothing: delete one of them or change its flavor")


def _ready(s: _Claim) -> dict[str, str]:
    cluster, flavor = s.claim.key
    if s.claim.problems:
        return _condition("Ready", False, "InvalidSpec",
                          "; ".join(s.claim.problems) + "; the quota last applied for this claim is kept")
    if s.duplicate_of:
        return _condition("Ready", False, "Duplicate", f"claim {s.duplicate_of} is on the same cluster and flavor")
    if s.settled is None:
        return _condition("Ready", False, "CapacityUnknown",
                          f"no capacity known for cluster {cluster} flavor {flavor} (no such ResourceFlavor, or the"
                          " cluster not read yet); the quota last applied for this claim is kept")
    if s.shortfall:
        return _condition("Ready", False, "OverAllocated", _short_text(s))
    if s.missing:
        return _condition("Ready", False, "QueueMissing", "; ".join(s.missing))
    if s.lending:
        return _condition("Ready", False, "LendingLimitAbove", "; ".join(s.lending))
    queues = ", ".join(sorted(s.contribution.queues)) or "no ClusterQueue (no assignments)"
    return _condition("Ready", True, "AssignmentsFit", f"the assignments fit; {queues} get quota of flavor {flavor}")


def _shown(capacity: Capacity | None, resources: set[str]) -> dict[str, int]:
    """A known capacity as the status shows it: every resource it has, and 0 for each governed
    resource it lacks (a pool at zero shows 0, not nothing); nothing when it is not known."""
    return {} if capacity is None else {**dict.fromkeys(resources, 0), **_nonzero(capacity)}


def _status(s: _Claim) -> dict[str, Any]:
    """The claim's status (without observedGeneration and the conditions' times: the controller's)."""
    settled = s.settled or {}
    assigned = s.assigned if s.settled is not None else {}  # shares mean nothing without a capacity
    resources = governed(s.claim.spec)
    status = {
        "nominalResources": _quantities(_shown(s.live, resources)),
        "settledResources": _quantities(_shown(s.settled, resources)),
        "assigned": _quantities(assigned),
        "unassigned": _quantities({r: max(0, settled.get(r, 0) - assigned.get(r, 0))
                                   for r in {*_nonzero(settled), *assigned}}) if s.settled is not None else {},
        "shortfall": _quantities(s.shortfall),
        "queues": [{"name": q, "resources": _quantities(r)} for q, r in sorted(s.contribution.queues.items())],
        "assignedPercent": assigned_percent(assigned, settled),
    }
    status = {k: v for k, v in status.items() if v not in ({}, [], "")}
    status["conditions"] = [_ready(s), _over_allocated(s), _queue_missing(s), _duplicate(s)]
    return status
