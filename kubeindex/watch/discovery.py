"""Which API resource serves each kind this process needs: API discovery, looked up again while
the answer is "not served".

A kind is needed as a ``Need``, (group, kind, version): a configured ``version`` must be served as
it is; None takes any served version, the preferred first. A lookup that fails (API server
unreachable) is tried 5 times with backoff and then left unknown. Whoever needs kinds calls
``retry_unserved`` with what it needs now: every DISCOVERY_RETRY_SECONDS, each of those that is
not served, or not known, is looked up again (a CRD installed later is picked up); a kind no
longer needed is not.

Versions known. For a group whose objects are projected by shape (Kueue's: ``known``, group ->
the versions this code reads), a need of any version takes the API server's preferred version
among those known (``choose``), not merely its preferred one: a version this code does not know
may have renamed the fields it reads. A kind served only at unknown versions is not served here,
and is said once per change, as a warning (``unknown``: the versions served, for the metrics, the
probes and the claims), never silently skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Container, Coroutine, Iterable, Mapping, Sequence
from typing import Any

from ..client.api import ApiClient
from ..model.objects import long_type
from ..model.resources import Resource
from ..runtime.backoff import sleep_jittered
from ..runtime.logfields import fields

log = logging.getLogger(__name__)

DISCOVERY_RETRY_SECONDS = 30.0
LOOKUP_ATTEMPTS = 5
Need = tuple[str, str, str | None]  # (group, kind, version; None: any served version)
Spawn = Callable[[Coroutine[Any, Any, None]], asyncio.Task]  # runs a task its owner stops
Found = Callable[[Need, Resource], None]
Known = Mapping[str, Sequence[str]]  # group -> the versions this code reads, newest first


def describe(need: Need) -> str:
    """`job.batch/v2` for a version, else the kind and its group: `JobSet (jobset.x-k8s.io)`."""
    group, kind, version = need
    if version:
        return long_type(group, kind, version)
    return f"{kind} ({group or 'core'})"


def choose(served: Sequence[Resource], known: Sequence[str]) -> Resource | None:
    """The first of ``served`` (the API server's order of preference) at a version ``known``."""
    return next((r for r in served if r.version in known), None)


class KindDiscovery:
    """Answers, per need: a resource, not served, or not known yet (never asked, or every attempt
    failed). ``found`` is called with each resource found, before ``busy`` turns false, so that a
    watch it starts is waited for by whoever waits for discovery."""

    def __init__(self, api: ApiClient, spawn: Spawn, found: Found, optional: Container[Need],
                 known: Known | None = None) -> None:
        self.api = api
        self._spawn = spawn
        self._found = found
        self._optional = optional  # not served is no problem for these: said at INFO
        self._known = known or {}
        self._answers: dict[Need, Resource | None] = {}  # None: not served; absent: not known
        self._pending: set[Need] = set()  # being looked up
        self.unknown: dict[Need, tuple[str, ...]] = {}  # served only at these versions, none known

    @property
    def busy(self) -> bool:
        """A lookup is under way."""
        return bool(self._pending)

    def knows(self, need: Need) -> bool:
        return need in self._answers

    def resource(self, need: Need) -> Resource | None:
        """The resource serving the need; None when not served or not known."""
        return self._answers.get(need)

    def not_served(self, need: Need) -> bool:
        """Discovery answered that the API server does not serve it."""
        return need in self._answers and self._answers[need] is None

    def look_up(self, need: Need) -> None:
        """Ask discovery (unless a lookup of the same need is under way)."""
        if need not in self._pending:
            self._pending.add(need)
            self._spawn(self._look_up(need))

    def forget(self, need: Need) -> None:
        """Back to not known (its watch found the resource gone): the next retry looks it up."""
        self._answers.pop(need, None)

    def look_up_unless_served(self, need: Need) -> None:
        if self.resource(need) is None:  # not known, or not served when last asked
            self.look_up(need)

    async def retry_unserved(self, needs: Callable[[], Iterable[Need]]) -> None:
        """For ever: the needs not served (or not known) are looked up again, periodically."""
        while True:
            await asyncio.sleep(DISCOVERY_RETRY_SECONDS)
            for need in needs():
                self.look_up_unless_served(need)

    async def _look_up(self, need: Need) -> None:
        try:
            for attempt in range(LOOKUP_ATTEMPTS):
                try:
                    resource = await self._resource(need)
                    break
                except Exception as err:
                    log.warning("discovery of %s failed: %r", describe(need), err,
                                extra=fields(kind=need[1], group=need[0], error=err))
                    await sleep_jittered(attempt + 1)
            else:
                return  # stays unknown: retry_unserved looks again
            if resource is None and self._answers.get(need, ...) is not None and need not in self.unknown:
                self._log_not_served(need)  # (served at unknown versions only: said as such)
            self._answers[need] = resource
            if resource is not None:
                self._found(need, resource)
        finally:
            self._pending.discard(need)

    async def _resource(self, need: Need) -> Resource | None:
        group, kind, version = need
        known = self._known.get(group)
        if version or known is None:
            return await self.api.preferred_resource(*need)
        served = await self.api.served_resources(group, kind)
        resource = choose(served, known)
        unknown = tuple(r.version for r in served) if resource is None else ()
        if unknown and self.unknown.get(need) != unknown:
            log.warning("%s is served only at %s, which this version of node-workload-summary does not read (it "
                        "reads %s): what needs it is off until a version it reads is served", describe(need),
                        ", ".join(unknown), ", ".join(known), extra=fields(kind=kind, group=group))
        if unknown:
            self.unknown[need] = unknown
        else:
            self.unknown.pop(need, None)
        return resource

    def _log_not_served(self, need: Need) -> None:
        """Once per change to "not served"."""
        optional = need in self._optional
        log.log(logging.INFO if optional else logging.WARNING,
                "%s is not served by the API server; looking again every %.0fs while it is %s",
                describe(need), DISCOVERY_RETRY_SECONDS, "optional" if optional else "needed",
                extra=fields(kind=need[1], group=need[0]))
