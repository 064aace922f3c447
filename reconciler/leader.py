"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics: a lease is
taken over only when its record has not changed for leaseDurationSeconds as measured on OUR clock
(no trust in other clocks); the holder renews every retry period and steps down when it could not
renew within the renew deadline. Updates carry the resourceVersion, so two candidates never both win.
The leader renews the record its last write left without reading it first, as client-go does.

Two rules of our own:
- a replica whose view of the cluster is not current (``may_lead`` says why not: initial sync
  not done, watches cut off from the API server for longer than the sync grace) neither takes
  the lease nor keeps it: it releases it, so a healthy replica takes over at once;
- any failed request is a failed renewal, never a crash; failures are logged with the server's
  message, at most once per ``LOG_EVERY`` seconds while they repeat (throttle.py).

Time comes from an injectable ``Clock`` (kubeindex/runtime/clock.py), so tests step it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from kubeindex.client.api import ApiError, Conflict, NotFound, path_fields
from kubeindex.model.resources import LEASES
from kubeindex.runtime.clock import REAL, Clock
from kubeindex.runtime.throttle import ThrottledLog

log = logging.getLogger(__name__)

# Why this replica may not lead now ([] = it may). Called every retry period: keep it cheap.
Readiness = Callable[[], list[str]]
Listener = Callable[[bool], None]


class LeaseSpec(msgspec.Struct):
    holderIdentity: str | None = None
    leaseDurationSeconds: int | None = None
    acquireTime: str | None = None
    renewTime: str | None = None
    leaseTransitions: int | None = None


class LeaseMeta(msgspec.Struct):
    resourceVersion: str = ""


class LeaseRecord(msgspec.Struct):
    """What the elector reads of a coordination.k8s.io/v1 Lease (it writes the object back whole)."""

    metadata: LeaseMeta = msgspec.field(default_factory=LeaseMeta)
    spec: LeaseSpec = msgspec.field(default_factory=LeaseSpec)


_RECORD = msgspec.json.Decoder(LeaseRecord)


class LeaseApi(Protocol):
    """What the elector needs of the API client (ApiClient; a Lease store in memory in tests)."""

    async def request(self, method: str, path: str, body: object = None, *, timeout: float = 30) -> bytes: ...


@dataclass
class LeaseSettings:
    namespace: str
    name: str = "node-workload-summary"
    identity: str = ""
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def identity() -> str:
    """This replica's name in the Lease: the pod's name (downward API), else the host name."""
    return os.environ.get("POD_NAME") or os.uname().nodename


class LeaseError(Exception):
    """A lease request the API server refused."""


class LeaderElector:
    def __init__(self, api: LeaseApi, settings: LeaseSettings, may_lead: Readiness | None = None,
                 clock: Clock = REAL) -> None:
        self.api = api
        self.settings = settings
        self.clock = clock
        self.may_lead = may_lead or (lambda: [])
        self.path = LEASES.path(settings.namespace)  # where it is created
        self.lease_path = LEASES.path(settings.namespace, settings.name)
        self._is_leader = False
        self._last_renew = 0.0  # monotonic time of our last successful acquire/renew
        self._observed: tuple[str, float] = ("", 0.0)  # (record fingerprint, when we first saw it)
        self._listeners: list[Listener] = []
        self._say = ThrottledLog(log, clock=clock.monotonic)
        self._fields = path_fields(self.lease_path)  # the log lines' resource, namespace, name
        self.last_error = ""  # why the last attempt failed ("" after a success)
        self._stopped = False  # released for good (shutdown): never take the lease again
        self._held: dict | None = None  # the lease as our last write left it (renewed without a read)

    @property
    def is_leader(self) -> bool:
        # Never act on a lease we could not renew in time, even before the loop notices.
        return self._is_leader and self.clock.monotonic() - self._last_renew < self.settings.renew_deadline

    def on_change(self, listener: Listener) -> None:
        """``listener(is_leader)`` on every transition, synchronously: a lost lease stops writes
        before anything else runs."""
        self._listeners.append(listener)

    def _set(self, leader: bool) -> None:
        if leader != self._is_leader:
            log.info("%s %s leadership of lease %s/%s", self.settings.identity, "acquired" if leader else "lost",
                     self.settings.namespace, self.settings.name, extra=self._fields)
            self._is_leader = leader
            for listener in self._listeners:
                listener(leader)

    async def run(self) -> None:
        try:
            while True:
                await self.step()
                await self.clock.sleep(self.settings.retry_period)
        finally:
            self._set(False)

    async def step(self) -> None:
        """One attempt to acquire or renew the lease (run calls it every retry period)."""
        if self._stopped:
            return
        reasons = self.may_lead()
        if reasons:
            if self._is_leader:
                log.warning("giving up lease %s/%s: %s", self.settings.namespace, self.settings.name,
                            "; ".join(reasons), extra=self._fields)
                await self.release(final=False)
            else:  # the initial sync is the normal start, not worth a warning
                level = logging.INFO if all("initial sync" in r for r in reasons) else logging.WARNING
                # Keyed by what is out of sync ("pods"), not the seconds counted in the text.
                which = "; ".join(sorted(r.partition(":")[0] for r in reasons))
                self._say("not-ready", which, level, "not a candidate for lease %s/%s: %s",
                          self.settings.namespace, self.settings.name, "; ".join(reasons), extra=self._fields)
            return
        self._say.clear("not-ready")
        try:
            ok = await self._try_acquire_or_renew()
            self.last_error = ""
        except asyncio.CancelledError:
            raise
        except Exception as err:  # any failure is a failed renewal (dropped connections included)
            self.last_error = str(err) if isinstance(err, LeaseError) else f"{type(err).__name__}: {err}"
            self._say("request", self.last_error, logging.WARNING, "lease %s/%s: %s", self.settings.namespace,
                      self.settings.name, self.last_error,
                      extra=path_fields(f"{self.path}/{self.settings.name}", self.last_error))
            ok = False
        else:
            self._say.clear("request")
        if ok:
            self._last_renew = self.clock.monotonic()
        self._set(ok or self.is_leader)

    async def release(self, final: bool = True) -> None:
        """Give the lease up so another replica takes over at once: for good at shutdown
        (``final``), or until this replica is in sync again. Best effort: a failure leaves the
        lease to expire."""
        self._stopped = self._stopped or final
        if not self._is_leader:
            return
        self._set(False)
        self._held = None
        try:
            answer = await self.api.request("GET", self.lease_path, timeout=5)
            if _RECORD.decode(answer).spec.holderIdentity == self.settings.identity:
                lease = json.loads(answer)
                lease["spec"] |= {"holderIdentity": None, "leaseDurationSeconds": 1}
                await self.api.request("PUT", self.lease_path, lease, timeout=5)
        except Exception as err:
            log.warning("could not release lease %s/%s: %s", self.settings.namespace, self.settings.name, err,
                        extra=path_fields(self.lease_path, err))

    def _spec(self, transitions: int, acquire_time: str | None = None) -> dict:
        now = _now()
        return {"holderIdentity": self.settings.identity,
                "leaseDurationSeconds": math.ceil(self.settings.lease_duration),
                "acquireTime": acquire_time or now, "renewTime": now, "leaseTransitions": transitions}

    async def _request(self, method: str, path: str, body: object = None) -> bytes:
        """A lease request; NotFound and Conflict are for the caller to decide, anything else
        is a LeaseError naming the request."""
        try:
            return await self.api.request(method, path, body, timeout=self.settings.renew_deadline)
        except (NotFound, Conflict):
            raise
        except ApiError as err:
            raise LeaseError(f"{method} lease: {err}") from err

    async def _try_acquire_or_renew(self) -> bool:
        if self._is_leader and self._held is not None and await self._renew_held():
            return True
        self._held = None
        try:
            answer = await self._request("GET", self.lease_path)
        except NotFound:
            return await self._create()
        record = _RECORD.decode(answer)
        spec = record.spec
        holder = spec.holderIdentity or ""
        fingerprint = f"{holder}|{spec.renewTime}|{record.metadata.resourceVersion}"
        if fingerprint != self._observed[0]:
            self._observed = (fingerprint, self.clock.monotonic())
        duration = float(spec.leaseDurationSeconds or self.settings.lease_duration)
        expired = self.clock.monotonic() - self._observed[1] > duration
        if holder and holder != self.settings.identity and not expired:
            self._last_renew = 0.0  # someone else holds it: step down now, not at the renew deadline
            return False
        transitions = spec.leaseTransitions or 0
        lease = json.loads(answer)  # written back whole: labels and annotations others set stay
        if holder == self.settings.identity:
            lease["spec"] = self._spec(transitions, spec.acquireTime)
        else:
            lease["spec"] = self._spec(transitions + 1)
        try:
            self._keep(await self._request("PUT", self.lease_path, lease))
        except Conflict:
            return False  # someone else updated it since our GET
        return True

    async def _renew_held(self) -> bool:
        """client-go's fast path: the leader renews the record its last write left, at that
        resourceVersion, without reading the lease first (one request a renewal, not two). Any
        failure (a 409: someone wrote it since) leaves it to the read and write of the slow path."""
        lease = self._held
        assert lease is not None
        spec = lease.get("spec") or {}
        lease["spec"] = self._spec(int(spec.get("leaseTransitions") or 0), spec.get("acquireTime"))
        try:
            self._keep(await self._request("PUT", self.lease_path, lease))
        except (ApiError, LeaseError) as err:
            log.debug("renewing lease %s/%s at the version we wrote: %s; reading it", self.settings.namespace,
                      self.settings.name, err, extra=self._fields)
            return False
        return True

    def _keep(self, answer: bytes) -> None:
        """The lease as our write left it, for the next renewal."""
        try:
            lease = json.loads(answer)
        except ValueError:
            lease = None
        self._held = lease if isinstance(lease, dict) and lease.get("metadata", {}).get("resourceVersion") else None

    async def _create(self) -> bool:
        lease = {"apiVersion": LEASES.api_version, "kind": LEASES.kind,
                 "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
                 "spec": self._spec(0)}
        try:
            self._keep(await self._request("POST", self.path, lease))
        except Conflict:
            return False  # another replica created it first
        return True
