"""Keeps NodeSummary / WorkloadSummary objects and the summarizers' status equal to the index.

Desired objects come from the aggregates (desired.py); actual ones from a watch on our own
outputs (label ux.sean.example.com/managed-by). Only differences are written: server-side apply
with our field manager (metadata+spec once, status through the status subresource), a per-object
throttle (the first change goes out at once, later ones at most every ``debounce`` seconds), a
global token bucket, retries with backoff on 409/429/5xx. Stale objects are deleted (with a UID
precondition). Only the lease holder writes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import msgspec

from kubeindex.api import ApiClient
from kubeindex.index import ClusterIndex
from kubeindex.objects import ObjectMeta
from kubeindex.reflector import Handler, Reflector, WatchSettings
from kubeindex.sources import Sources

from .desired import (
    API_VERSION,
    GROUP,
    MANAGED_BY,
    MANAGER,
    VERSION,
    Desired,
    TypeInfo,
    desired_state,
    long_type,
    short_type,
)
from .leader import LeaderElector

log = logging.getLogger(__name__)
APPLY = "application/apply-patch+yaml"  # JSON is YAML
RETRYABLE = {409, 429, 500, 502, 503, 504}


class Summary(msgspec.Struct):
    """One of our output objects as the API server has it."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: dict[str, Any] = msgspec.field(default_factory=dict)
    status: dict[str, Any] = msgspec.field(default_factory=dict)


@dataclass
class ReconcilerSettings:
    debounce: float = 1.0  # seconds between two writes of one object
    writes_per_second: float = 50.0
    burst: int = 100
    concurrency: int = 8
    interval: float = 0.2  # seconds between passes over the aggregates


@dataclass
class WriteStats:
    writes: dict[str, int] = field(default_factory=dict)  # "apply" / "apply_status" / "delete" -> count
    errors: dict[str, int] = field(default_factory=dict)  # http status -> count

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1


class TokenBucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()

    async def take(self) -> None:
        while True:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await asyncio.sleep((1 - self.tokens) / self.rate)


def _path(plural: str, namespace: str = "", name: str = "") -> str:
    base = f"/apis/{GROUP}/{VERSION}"
    if namespace:
        base += f"/namespaces/{namespace}"
    return f"{base}/{plural}" + (f"/{name}" if name else "")


class Reconciler:
    def __init__(self, api: ApiClient, index: ClusterIndex, sources: Sources, elector: LeaderElector | None,
                 settings: ReconcilerSettings | None = None, watch: WatchSettings | None = None) -> None:
        self.api = api
        self.index = index
        self.sources = sources
        self.elector = elector
        self.s = settings or ReconcilerSettings()
        self.stats = WriteStats()
        self.actual: dict[str, dict[str, Summary]] = {"nodesummaries": {}, "workloadsummaries": {}}
        self._written: dict[tuple[str, str], tuple[str, str]] = {}  # -> (desired status json, rv we wrote)
        self._last_write: dict[tuple[str, str], float] = {}
        self._bucket = TokenBucket(self.s.writes_per_second, self.s.burst)
        self._sem = asyncio.Semaphore(self.s.concurrency)
        self._inflight: set[tuple[str, str]] = set()
        self._summarizer_written: dict[tuple[str, str], str] = {}  # what we last wrote
        self._desired_cache: dict = {}
        self._tasks: set[asyncio.Task] = set()
        self._checked: dict[tuple[str, str], tuple[Desired, str]] = {}  # -> (desired, actual rv) found equal
        selector = f"{MANAGED_BY}={MANAGER}"
        self.reflectors = [
            Reflector(api, f"own-{plural}", _path(plural), Summary,
                      Handler(lambda o, p=plural: self._seen(p, o), lambda k, p=plural: self.actual[p].pop(k, None)),
                      settings=watch, label_selector=selector)
            for plural in self.actual
        ]
        self.ready = asyncio.Event()

    def _seen(self, plural: str, obj: Summary) -> None:
        meta = obj.metadata
        self.actual[plural][f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name] = obj

    # -- loop -----------------------------------------------------------------------------------

    async def run(self) -> None:
        tasks = [asyncio.create_task(r.run()) for r in self.reflectors]
        try:
            await self.sources.ready.wait()
            for r in self.reflectors:
                await r.synced.wait()
            self.ready.set()
            log.info("reconciler synced: %d NodeSummaries, %d WorkloadSummaries exist",
                     len(self.actual["nodesummaries"]), len(self.actual["workloadsummaries"]))
            while True:
                if self.elector is None or self.elector.is_leader:
                    try:
                        await self.reconcile_once()
                    except Exception:  # a bug must not stop the loop for good: log it, go on
                        log.exception("reconcile pass failed")
                await asyncio.sleep(self.s.interval)
        finally:
            for t in [*tasks, *self._tasks]:
                t.cancel()

    def type_infos(self) -> dict[tuple[str, str], TypeInfo]:
        infos = {}
        for gk, t in self.index.workload_types.items():
            resource = self.sources.owner_resources.get(gk)
            if resource is None:
                continue  # not served: the summarizer's status says so
            version = t.version or resource.version
            infos[gk] = TypeInfo(resource.api_version, short_type(t.group, t.kind, t.short_type),
                                 long_type(t.group, t.kind, version))
        return infos

    async def reconcile_once(self) -> None:
        """One pass: start the writes and deletes that are due. They run as tasks (bounded by the
        semaphore and the token bucket), so a long burst never delays the next pass."""
        uids = {name: s.metadata.uid for name, s in self.sources.summarizers.node.items()}
        infos = self.type_infos()
        desired = desired_state(self.index, uids, infos, self._desired_cache)
        wanted: dict[str, set[str]] = {p: set() for p in self.actual}
        jobs = []
        now = time.monotonic()
        for d in desired:
            wanted[d.plural].add(d.key)
            ident = (d.plural, d.key)
            if ident in self._inflight or now - self._last_write.get(ident, -1e9) < self.s.debounce:
                continue
            actual = self.actual[d.plural].get(d.key)
            # Same desired object and same actual resourceVersion as a pass that found them equal:
            # nothing to compare again (a quiet cluster costs a dict lookup per summary).
            rv = actual.metadata.resourceVersion if actual else ""
            checked = self._checked.get(ident)
            if checked is not None and checked[0] is d and checked[1] == rv:
                continue
            if self._needs_write(d, actual):
                jobs.append(self._write(d, actual))
            else:
                self._checked[ident] = (d, rv)
        for plural, objects in self.actual.items():
            for key, obj in list(objects.items()):
                if key not in wanted[plural] and (plural, key) not in self._inflight and not self._unknown(obj, infos):
                    jobs.append(self._delete(plural, obj))
        for table in (self._checked, self._last_write, self._written):  # forget summaries that are gone
            for ident in [i for i in table if i[0] in wanted and i[1] not in wanted[i[0]]]:
                del table[ident]
        jobs.extend(self._summarizer_statuses())
        for job in jobs:
            task = asyncio.create_task(job)
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("write failed: %r", task.exception())

    def _unknown(self, obj: Summary, infos: dict[tuple[str, str], TypeInfo]) -> bool:
        """A WorkloadSummary of a type that is configured but not (yet) discovered: keep it rather
        than delete it on a transient discovery failure."""
        ref = obj.spec.get("workloadRef") or {}
        gk = (str(ref.get("apiVersion", "")).rpartition("/")[0], str(ref.get("kind", "")))
        return gk in self.index.workload_types and gk not in infos

    @staticmethod
    def _body_differs(d: Desired, actual: Summary | None) -> bool:
        return actual is None or actual.spec != d.body["spec"] or actual.metadata.labels != d.body["metadata"]["labels"]

    def _needs_write(self, d: Desired, actual: Summary | None) -> bool:
        if actual is None or self._body_differs(d, actual):
            return True
        if actual.status == d.status:
            return False
        # Different: write, unless we already wrote exactly this and nobody touched it since (a
        # field another manager owns would otherwise make us write forever).
        written = self._written.get((d.plural, d.key))
        return written != (json.dumps(d.status, sort_keys=True), actual.metadata.resourceVersion)

    # -- writes ---------------------------------------------------------------------------------

    async def _request(self, verb: str, method: str, path: str, body: Any, params: dict[str, str] | None = None,
                       content_type: str = APPLY) -> tuple[int, bytes]:
        for attempt in range(6):
            await self._bucket.take()
            async with self._sem:
                status, data = await self.api.request(method, path, body, params=params, content_type=content_type)
            if status < 300 or (status == 404 and verb == "delete"):
                self.stats.count(self.stats.writes, verb)
                return status, data
            self.stats.count(self.stats.errors, str(status))
            if status not in RETRYABLE:
                log.error("%s %s: HTTP %d %s", method, path, status, data[:300])
                return status, data
            await asyncio.sleep(min(5.0, 0.2 * 2**attempt))
        return status, data

    async def _write(self, d: Desired, actual: Summary | None) -> None:
        ident = (d.plural, d.key)
        self._inflight.add(ident)
        self._last_write[ident] = time.monotonic()
        try:
            params = {"fieldManager": MANAGER, "force": "true"}
            path = _path(d.plural, d.namespace, d.name)
            if actual is not None and actual.spec.get("selector") not in (None, d.body["spec"].get("selector")):
                await self._delete(d.plural, actual)  # an immutable field differs: recreate
                actual = None
            if self._body_differs(d, actual):
                status, data = await self._request("apply", "PATCH", path, d.body, params)
                if status >= 300:
                    return
            body = {"apiVersion": API_VERSION, "kind": d.body["kind"],
                    "metadata": {"name": d.name, **({"namespace": d.namespace} if d.namespace else {})},
                    "status": d.status}
            status, data = await self._request("apply_status", "PATCH", path + "/status", body, params)
            if status < 300:
                rv = json.loads(data)["metadata"]["resourceVersion"]
                self._written[ident] = (json.dumps(d.status, sort_keys=True), rv)
        finally:
            self._inflight.discard(ident)

    async def _delete(self, plural: str, obj: Summary) -> None:
        meta = obj.metadata
        ident = (plural, f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name)
        self._inflight.add(ident)
        try:
            await self._request("delete", "DELETE", _path(plural, meta.namespace, meta.name),
                                {"preconditions": {"uid": meta.uid}, "propagationPolicy": "Background"},
                                content_type="application/json")
            self._written.pop(ident, None)
        finally:
            self._inflight.discard(ident)

    # -- summarizer status ----------------------------------------------------------------------

    def _summarizer_statuses(self) -> list[Coroutine[Any, Any, None]]:
        jobs = []
        groups: dict[str, int] = {}
        for summarizer, _ in self.index.groups:
            groups[summarizer] = groups.get(summarizer, 0) + 1
        for name, obj in self.sources.summarizers.node.items():
            count = groups.get(name, 0)
            label = obj.spec.labelKey
            if count:
                cond = ("True", "Summarizing", f"{count} node groups from the values of node label {label}")
            else:
                cond = ("True", "NoMatchingNodes", f"no node carries the label {label}")
            jobs.append(self._summarizer_status("nodesummarizers", obj, cond, {"groupCount": count}))
        workloads: dict[str, int] = {}
        for w in self.index.workloads.values():
            info = self.index.workload_types.get((w.group, w.kind))
            if info is not None and w.is_object:
                workloads[info.summarizer] = workloads.get(info.summarizer, 0) + 1
        for name, obj in self.sources.summarizers.workload.items():
            missing = [f"{t.kind} ({t.group or 'core'})" for t in obj.spec.workloadTypes
                       if (t.group, t.kind) in self.sources.missing_kinds]
            if missing:
                cond = ("False", "KindNotServed",
                        f"not served by the API server (CRD not installed?): {', '.join(missing)}")
            else:
                cond = ("True", "Summarizing", f"{workloads.get(name, 0)} root workloads of the configured types")
            jobs.append(self._summarizer_status("workloadsummarizers", obj, cond,
                                                {"workloadCount": workloads.get(name, 0)}))
        return [j for j in jobs if j is not None]

    def _summarizer_status(self, plural: str, obj: Any, cond: tuple[str, str, str], counts: dict[str, int]):
        meta = obj.metadata
        status_value, reason, message = cond
        key = json.dumps([meta.generation, cond, counts])
        ident = (plural, meta.name)
        if self._summarizer_written.get(ident) == key or ident in self._inflight:
            return None
        now = time.monotonic()
        if now - self._last_write.get(ident, -1e9) < self.s.debounce:
            return None
        previous = {c.get("type"): c for c in obj.status.get("conditions", [])}.get("Ready", {})
        transition = previous.get("lastTransitionTime") if previous.get("status") == status_value else None
        condition = {"type": "Ready", "status": status_value, "reason": reason, "message": message,
                     "observedGeneration": meta.generation,
                     "lastTransitionTime": transition or dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        status = {"observedGeneration": meta.generation, "conditions": [condition], **counts}
        if obj.status == status:  # already so (e.g. written by an earlier leader)
            self._summarizer_written[ident] = key
            return None

        async def write() -> None:
            self._inflight.add(ident)
            self._last_write[ident] = time.monotonic()
            try:
                body = {"apiVersion": API_VERSION, "kind": "NodeSummarizer" if plural == "nodesummarizers"
                        else "WorkloadSummarizer", "metadata": {"name": meta.name}, "status": status}
                code, _ = await self._request("apply_status", "PATCH", _path(plural, name=meta.name) + "/status",
                                              body, {"fieldManager": MANAGER, "force": "true"})
                if code < 300:
                    self._summarizer_written[ident] = key
            finally:
                self._inflight.discard(ident)

        return write()
