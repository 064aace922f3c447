"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics: a lease is
taken over only when its record has not changed for leaseDurationSeconds as measured on OUR clock
(no trust in other clocks); the holder renews every retry period and steps down when it could not
renew within the renew deadline. Updates carry the resourceVersion, so two candidates never both win.

Two rules of our own:
- a replica whose view of the cluster is not current (``may_lead`` says why not: initial sync
  not done, watches cut off from the API server for longer than the sync grace) neither takes
  the lease nor keeps it: it releases it, so a healthy replica takes over at once;
- any failed request is a failed renewal, never a crash; failures are logged with the server's
  message, at most once per ``LOG_EVERY`` seconds while they repeat.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from kubeindex.api import ApiClient, ApiError

log = logging.getLogger(__name__)
LOG_EVERY = 60.0

# Why this replica may not lead now ([] = it may). Called every retry period: keep it cheap.
Readiness = Callable[[], list[str]]
Listener = Callable[[bool], None]


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


class LeaseError(Exception):
    """A lease request the API server refused."""


class LeaderElector:
    def __init__(self, api: ApiClient, settings: LeaseSettings, may_lead: Readiness | None = None) -> None:
        self.api = api
        self.s = settings
        self.may_lead = may_lead or (lambda: [])
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{settings.namespace}/leases"
        self._is_leader = False
        self._last_renew = 0.0  # monotonic time of our last successful acquire/renew
        self._observed: tuple[str, float] = ("", 0.0)  # (record fingerprint, when we first saw it)
        self._listeners: list[Listener] = []
        self._last_log: dict[str, float] = {}
        self.last_error = ""  # why the last attempt failed ("" after a success)
        self._stopped = False  # released for good (shutdown): never take the lease again

    @property
    def is_leader(self) -> bool:
        # Never act on a lease we could not renew in time, even before the loop notices.
        return self._is_leader and time.monotonic() - self._last_renew < self.s.renew_deadline

    def on_change(self, listener: Listener) -> None:
        """``listener(is_leader)`` on every transition, synchronously: a lost lease stops writes
        before anything else runs."""
        self._listeners.append(listener)

    def _set(self, leader: bool) -> None:
        if leader != self._is_leader:
            log.info("%s %s leadership of lease %s/%s", self.s.identity, "acquired" if leader else "lost",
                     self.s.namespace, self.s.name)
            self._is_leader = leader
            for listener in self._listeners:
                listener(leader)

    async def run(self) -> None:
        try:
            while True:
                await self._step()
                await asyncio.sleep(self.s.retry_period)
        finally:
            self._set(False)

    async def _step(self) -> None:
        if self._stopped:
            return
        reasons = self.may_lead()
        if reasons:
            if self._is_leader:
                log.warning("giving up lease %s/%s: %s", self.s.namespace, self.s.name, "; ".join(reasons))
                await self.release(final=False)
            else:  # the initial sync is the normal start, not worth a warning
                level = logging.INFO if all("initial sync" in r for r in reasons) else logging.WARNING
                self._log("not-ready", level, "not a candidate for lease %s/%s: %s", self.s.namespace,
                          self.s.name, "; ".join(reasons))
            return
        try:
            ok = await self._try_acquire_or_renew()
            self.last_error = ""
        except asyncio.CancelledError:
            raise
        except Exception as err:  # any failure is a failed renewal (dropped connections included)
            self.last_error = str(err) if isinstance(err, LeaseError) else f"{type(err).__name__}: {err}"
            self._log("request", logging.WARNING, "lease %s/%s: %s", self.s.namespace, self.s.name, self.last_error)
            ok = False
        if ok:
            self._last_renew = time.monotonic()
        self._set(ok or self.is_leader)

    def _log(self, topic: str, level: int, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_log.get(topic, -LOG_EVERY) >= LOG_EVERY:
            self._last_log[topic] = now
            log.log(level, message, *args)

    async def release(self, final: bool = True) -> None:
        """Give the lease up so another replica takes over at once: for good at shutdown
        (``final``), or until this replica is in sync again. Best effort: a failure leaves the
        lease to expire."""
        self._stopped = self._stopped or final
        if not self._is_leader:
            return
        self._set(False)
        try:
            status, body = await self.api.request("GET", f"{self.path}/{self.s.name}", timeout=5)
            if status == 200:
                lease = json.loads(body)
                if lease.get("spec", {}).get("holderIdentity") == self.s.identity:
                    lease["spec"] |= {"holderIdentity": None, "leaseDurationSeconds": 1}
                    await self.api.request("PUT", f"{self.path}/{self.s.name}", lease, timeout=5)
        except Exception as err:
            log.warning("could not release lease %s/%s: %s", self.s.namespace, self.s.name, err)

    def _spec(self, transitions: int, acquire_time: str | None = None) -> dict:
        now = _now()
        return {"holderIdentity": self.s.identity, "leaseDurationSeconds": math.ceil(self.s.lease_duration),
                "acquireTime": acquire_time or now, "renewTime": now, "leaseTransitions": transitions}

    async def _call(self, method: str, path: str, body: object = None,
                    accept: tuple[int, ...] = (200,)) -> tuple[int, bytes]:
        status, data = await self.api.request(method, path, body, timeout=self.s.renew_deadline)
        if status not in accept:
            raise LeaseError(f"{method} lease: {ApiError.from_body(status, data)}")
        return status, data

    async def _try_acquire_or_renew(self) -> bool:
        status, body = await self._call("GET", f"{self.path}/{self.s.name}", accept=(200, 404))
        if status == 404:
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": self.s.name, "namespace": self.s.namespace}, "spec": self._spec(0)}
            status, _ = await self._call("POST", self.path, lease, accept=(201, 409))
            return status == 201  # 409: another replica created it first
        lease = json.loads(body)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        fingerprint = f"{holder}|{spec.get('renewTime')}|{lease['metadata']['resourceVersion']}"
        if fingerprint != self._observed[0]:
            self._observed = (fingerprint, time.monotonic())
        duration = float(spec.get("leaseDurationSeconds") or self.s.lease_duration)
        expired = time.monotonic() - self._observed[1] > duration
        if holder and holder != self.s.identity and not expired:
            self._last_renew = 0.0  # someone else holds it: step down now, not at the renew deadline
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.s.identity:
            lease["spec"] = self._spec(transitions, spec.get("acquireTime"))
        else:
            lease["spec"] = self._spec(transitions + 1)
        status, _ = await self._call("PUT", f"{self.path}/{self.s.name}", lease, accept=(200, 409))
        return status == 200  # 409: someone else updated it since our GET
