"""All the watches of one process, feeding one ClusterIndex.

Nodes, Pods and the two summarizer kinds are watched from the start; owner kinds are watched
(metadata only) on demand: each kind met in an ownerReference, and each configured workload kind
(so that a workload with no pods still exists). Kinds are mapped to resources by API discovery.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from .api import ApiClient, ApiResource
from .index import ClusterIndex
from .objects import Node, NodeSummarizer, PartialObject, Pod, WorkloadSummarizer
from .owners import POD, GroupKind
from .reflector import Handler, Reflector, SourceStats, WatchSettings

log = logging.getLogger(__name__)

GROUP = "ux.sean.example.com"
VERSION = "v1alpha1"
DISCOVERY_RETRY_SECONDS = 30.0


@dataclass
class Summarizers:
    """The summarizer objects as last seen (the reconciler needs uid and generation)."""

    node: dict[str, NodeSummarizer] = field(default_factory=dict)
    workload: dict[str, WorkloadSummarizer] = field(default_factory=dict)


class Sources:
    def __init__(self, api: ApiClient, index: ClusterIndex, settings: WatchSettings | None = None) -> None:
        self.api = api
        self.index = index
        self.settings = settings or WatchSettings()
        self.stats: dict[str, SourceStats] = {}
        self.summarizers = Summarizers()
        self.reflectors: dict[str, Reflector] = {}
        self.owner_resources: dict[GroupKind, ApiResource] = {}
        self.missing_kinds: set[GroupKind] = set()  # configured or referenced, but not served
        self.ready = asyncio.Event()
        self.started_at = 0.0
        self.sync_seconds: float | None = None
        self._tasks: set[asyncio.Task] = set()
        self._pending_kinds: set[tuple[str, str]] = set()  # (apiVersion or group, kind) being discovered
        index.on_owner_kind = self._owner_kind_seen

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self.started_at = time.monotonic()
        self._add(Reflector(self.api, "nodes", "/api/v1/nodes", Node,
                            Handler(self.index.upsert_node, self.index.delete_node), settings=self.settings))
        self._add(Reflector(self.api, "pods", "/api/v1/pods", Pod,
                            Handler(self.index.upsert_pod, self.index.delete_pod), settings=self.settings))
        self._add(Reflector(self.api, "nodesummarizers", f"/apis/{GROUP}/{VERSION}/nodesummarizers", NodeSummarizer,
                            Handler(self._node_summarizer, self._node_summarizer_deleted), settings=self.settings))
        self._add(Reflector(self.api, "workloadsummarizers", f"/apis/{GROUP}/{VERSION}/workloadsummarizers",
                            WorkloadSummarizer, Handler(self._workload_summarizer, self._workload_summarizer_deleted),
                            settings=self.settings))
        self._spawn(self._wait_ready())
        self._spawn(self._retry_missing_kinds())

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _add(self, reflector: Reflector) -> None:
        self.stats[reflector.name] = reflector.stats
        self.reflectors[reflector.name] = reflector
        self._spawn(reflector.run())

    async def _wait_ready(self) -> None:
        """Ready once every reflector, including owner kinds discovered on the way, has listed."""
        while True:
            await asyncio.sleep(0.05)
            if self._pending_kinds:
                continue
            if all(self._settled(r) for r in self.reflectors.values()):
                # Let owner kinds found in the last lists start before declaring victory.
                await asyncio.sleep(0)
                if not self._pending_kinds and all(self._settled(r) for r in self.reflectors.values()):
                    break
        self.sync_seconds = time.monotonic() - self.started_at
        log.info("initial sync complete in %.2fs: %d nodes, %d pods, %d owner kinds",
                 self.sync_seconds, len(self.index.nodes), len(self.index.pods), len(self.owner_resources))
        self.ready.set()

    def _settled(self, reflector: Reflector) -> bool:
        """Listed, or an owner kind we are not allowed to list (it must not hold readiness hostage;
        its pods count as missing_owner and the reflector keeps retrying)."""
        if reflector.synced.is_set():
            return True
        is_owner = reflector.name not in ("nodes", "pods", "nodesummarizers", "workloadsummarizers")
        return is_owner and reflector.last_error_status in (401, 403, 404)

    # -- owner kinds -----------------------------------------------------------------------------

    def _owner_kind_seen(self, api_version: str, kind: str) -> None:
        group = api_version.rpartition("/")[0]
        if (group, kind) == POD or (group, kind) in self.owner_resources:
            return
        self._request_kind(api_version, kind, exact=True)

    def _request_kind(self, api_version_or_group: str, kind: str, exact: bool, version: str | None = None) -> None:
        marker = (api_version_or_group, kind)
        if marker in self._pending_kinds:
            return
        self._pending_kinds.add(marker)
        self._spawn(self._start_owner_watch(api_version_or_group, kind, exact, version))

    async def _start_owner_watch(self, api_version_or_group: str, kind: str, exact: bool,
                                 version: str | None) -> None:
        marker = (api_version_or_group, kind)
        try:
            for attempt in range(5):
                try:
                    if exact:
                        resource = await self.api.resource_for(api_version_or_group, kind)
                    else:
                        resource = await self.api.preferred_resource(api_version_or_group, kind, version)
                    break
                except Exception as err:
                    log.warning("discovery of %s %s failed: %r", api_version_or_group, kind, err)
                    await asyncio.sleep(0.5 * 2**attempt)
            else:
                resource = None
            group = api_version_or_group.rpartition("/")[0] if exact else api_version_or_group
            gk = (group, kind)
            if resource is None:
                if gk not in self.missing_kinds:
                    log.warning("kind %s (%s) is not served by the API server; retrying every %.0fs",
                                kind, api_version_or_group, DISCOVERY_RETRY_SECONDS)
                self.missing_kinds.add(gk)
                return
            self.missing_kinds.discard(gk)
            if gk in self.owner_resources:
                return
            self.owner_resources[gk] = resource
            handler = Handler(
                lambda obj, gk=gk: self._owner_upsert(gk, obj),
                lambda key, gk=gk: self.index.delete_owner(gk, key),
            )
            log.info("watching %s (metadata only) for %s", resource.path, kind)
            self._add(Reflector(self.api, resource.name, resource.path, PartialObject, handler,
                                metadata_only=True, settings=self.settings))
        finally:
            self._pending_kinds.discard(marker)

    def _owner_upsert(self, gk: GroupKind, obj: PartialObject) -> None:
        meta = obj.metadata
        ref = meta.controller_ref()
        controller = (ref.apiVersion, ref.kind, ref.uid) if ref else None
        self.index.upsert_owner(gk, meta.namespace, meta.name, meta.uid, controller)

    async def _retry_missing_kinds(self) -> None:
        """Kinds not served yet (a CRD installed later) are looked up again periodically."""
        while True:
            await asyncio.sleep(DISCOVERY_RETRY_SECONDS)
            for group, kind in list(self.missing_kinds):
                self._request_kind(group, kind, exact=False)

    # -- summarizers -------------------------------------------------------------------------

    def _node_summarizer(self, obj: NodeSummarizer) -> None:
        self.summarizers.node[obj.metadata.name] = obj
        if obj.spec.labelKey:
            self.index.set_node_summarizer(obj.metadata.name, obj.spec.labelKey)
        else:
            self.index.delete_node_summarizer(obj.metadata.name)

    def _node_summarizer_deleted(self, name: str) -> None:
        self.summarizers.node.pop(name, None)
        self.index.delete_node_summarizer(name)

    def _workload_summarizer(self, obj: WorkloadSummarizer) -> None:
        self.summarizers.workload[obj.metadata.name] = obj
        self.index.set_workload_summarizer(obj.metadata.name, obj.spec.workloadTypes)
        for t in obj.spec.workloadTypes:  # watch configured kinds too: workloads with no pods exist
            if (t.group, t.kind) not in self.owner_resources and (t.group, t.kind) != POD:
                self._request_kind(t.group, t.kind, exact=False, version=t.version)

    def _workload_summarizer_deleted(self, name: str) -> None:
        self.summarizers.workload.pop(name, None)
        self.index.delete_workload_summarizer(name)
