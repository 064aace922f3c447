"""Names of the summaries: valid, unique among everything the service creates, stable.

Each summary is a *claim*: a scope (a namespace; "" for the cluster), an identity unique in that
scope, and a plain name it would like (`<summarizer>-<value>` for a NodeSummary, the workload's
own name for a WorkloadSummary). A claim gets its plain name when that is a valid DNS-1123
subdomain (apimachinery's rule, exactly) and no other claim holds it; otherwise
`<readable stem>-<hash of the identity>`. Plain names alone can collide (`gke` + `pool-a` and
`gke-pool` + `a`; a Deployment and a StatefulSet both named `web`), which is why a name, once
given, is kept: the allocator remembers its choices and, after a restart or a leader change,
takes them back from the objects that exist. A later claim never takes a name away.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DNS1123_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = re.compile(rf"{DNS1123_LABEL}(\.{DNS1123_LABEL})*")
MAX_SUBDOMAIN = 253
MAX_HASHED = 63  # hashed names stay short enough to read in kubectl's columns
HASH_CHARS = 10


def is_dns1123_subdomain(name: str) -> bool:
    """k8s.io/apimachinery/pkg/util/validation.IsDNS1123Subdomain."""
    return 0 < len(name) <= MAX_SUBDOMAIN and DNS1123_SUBDOMAIN.fullmatch(name) is not None


def hashed_name(plain: str, identity: str, attempt: int = 0) -> str:
    """`<stem>-<hash>`: the stem is ``plain`` reduced to [a-z0-9-] (dots too, so `a..b` or `a.-b`
    cannot survive), the hash is of the identity, so two identities never share it."""
    stem = re.sub(r"[^a-z0-9]+", "-", plain.lower()).strip("-")
    digest = hashlib.sha256(f"{identity}\x00{attempt}".encode()).hexdigest()[:HASH_CHARS]
    stem = stem[: MAX_HASHED - HASH_CHARS - 1].rstrip("-")
    return f"{stem}-{digest}" if stem else digest


@dataclass(frozen=True, slots=True)
class Claim:
    scope: str  # namespace, or "" for cluster-scoped objects
    identity: str  # unique within the scope
    plain: str  # the name it would like


class NameAllocator:
    """Claim -> name, unique per scope. ``assign`` costs O(claims) dict lookups; only claims
    without a name yet are sorted and placed."""

    def __init__(self) -> None:
        self.names: dict[Claim, str] = {}

    def assign(self, claims: Iterable[Claim], held: Mapping[Claim, Iterable[str]] | None = None) -> dict[Claim, str]:
        """Names for ``claims`` (forgetting claims not listed). ``held``: the names of objects that
        exist now, per claim (read back after a restart)."""
        held = held or {}
        result: dict[Claim, str] = {}
        taken: set[tuple[str, str]] = set()
        fresh: list[Claim] = []
        for claim in claims:
            name = self.names.get(claim)
            if name is None:
                fresh.append(claim)
            else:
                result[claim] = name
                taken.add((claim.scope, name))
        fresh.sort(key=lambda c: (c.scope, c.identity))
        unplaced = []
        for claim in fresh:  # a name an object of this claim already has is kept
            existing = sorted(n for n in held.get(claim, ()) if (claim.scope, n) not in taken)
            if existing:
                name = claim.plain if claim.plain in existing else existing[0]
                result[claim] = name
                taken.add((claim.scope, name))
            else:
                unplaced.append(claim)
        for claim in unplaced:
            name = self._free_name(claim, taken)
            result[claim] = name
            taken.add((claim.scope, name))
        self.names = result
        return result

    @staticmethod
    def _free_name(claim: Claim, taken: set[tuple[str, str]]) -> str:
        if is_dns1123_subdomain(claim.plain) and (claim.scope, claim.plain) not in taken:
            return claim.plain
        attempt = 0
        while (name := hashed_name(claim.plain, claim.identity, attempt)) and (claim.scope, name) in taken:
            attempt += 1  # only a deliberate collision with a plain name gets here
        return name
