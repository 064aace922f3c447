"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics: a lease is
taken over only when its record has not changed for leaseDurationSeconds as measured on OUR clock
(no trust in other clocks); the holder renews every retry period and steps down when it could not
renew within the renew deadline. Updates carry the resourceVersion, so two candidates never both win.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from dataclasses import dataclass

from kubeindex.api import ApiClient

log = logging.getLogger(__name__)


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


class LeaderElector:
    def __init__(self, api: ApiClient, settings: LeaseSettings) -> None:
        self.api = api
        self.s = settings
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{settings.namespace}/leases"
        self._is_leader = False
        self._last_renew = 0.0  # monotonic time of our last successful acquire/renew
        self._observed: tuple[str, float] = ("", 0.0)  # (record fingerprint, when we first saw it)
        self.changed = asyncio.Event()  # set on every transition

    @property
    def is_leader(self) -> bool:
        # Never act on a lease we could not renew in time, even before the loop notices.
        return self._is_leader and time.monotonic() - self._last_renew < self.s.renew_deadline

    def _set(self, leader: bool) -> None:
        if leader != self._is_leader:
            log.info("%s %s leadership of lease %s/%s", self.s.identity, "acquired" if leader else "lost",
                     self.s.namespace, self.s.name)
            self._is_leader = leader
            self.changed.set()

    async def run(self) -> None:
        while True:
            try:
                ok = await self._try_acquire_or_renew()
            except (OSError, TimeoutError, ValueError) as err:
                log.warning("lease %s/%s: %s", self.s.namespace, self.s.name, err)
                ok = False
            if ok:
                self._last_renew = time.monotonic()
            self._set(ok or self.is_leader)
            await asyncio.sleep(self.s.retry_period)

    async def release(self) -> None:
        """Give the lease up on shutdown so another replica takes over at once."""
        if not self._is_leader:
            return
        self._set(False)
        status, body = await self.api.request("GET", f"{self.path}/{self.s.name}")
        if status == 200:
            lease = json.loads(body)
            if lease.get("spec", {}).get("holderIdentity") == self.s.identity:
                lease["spec"] |= {"holderIdentity": None, "leaseDurationSeconds": 1}
                await self.api.request("PUT", f"{self.path}/{self.s.name}", lease)

    def _spec(self, transitions: int, acquire_time: str | None = None) -> dict:
        now = _now()
        return {"holderIdentity": self.s.identity, "leaseDurationSeconds": int(self.s.lease_duration),
                "acquireTime": acquire_time or now, "renewTime": now, "leaseTransitions": transitions}

    async def _try_acquire_or_renew(self) -> bool:
        status, body = await self.api.request("GET", f"{self.path}/{self.s.name}")
        if status == 404:
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": self.s.name, "namespace": self.s.namespace}, "spec": self._spec(0)}
            status, _ = await self.api.request("POST", self.path, lease)
            return status == 201
        if status != 200:
            raise ValueError(f"GET lease: HTTP {status}: {body[:200]!r}")
        lease = json.loads(body)
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        fingerprint = f"{holder}|{spec.get('renewTime')}|{lease['metadata']['resourceVersion']}"
        if fingerprint != self._observed[0]:
            self._observed = (fingerprint, time.monotonic())
        duration = float(spec.get("leaseDurationSeconds") or self.s.lease_duration)
        expired = time.monotonic() - self._observed[1] > duration
        if holder and holder != self.s.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder == self.s.identity:
            lease["spec"] = self._spec(transitions, spec.get("acquireTime"))
        else:
            lease["spec"] = self._spec(transitions + 1)
        status, _ = await self.api.request("PUT", f"{self.path}/{self.s.name}", lease)  # carries resourceVersion
        return status == 200
