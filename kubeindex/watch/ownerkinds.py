"""The owner kinds watched (metadata only), each started when it is first needed.

Needed: each workload kind a WorkloadSummarizer lists (so that a workload with no pods still
exists), and each kind named by the controller ownerReference of a live object (a pod, or an owner:
chains are followed to their root). Kinds are mapped to resources by API discovery (discovery.py);
there is one watch per group/kind, and a kind once watched stays watched.

Versions. A configured ``version`` is honoured: when the API server does not serve that version
of the kind, the kind is not served for that configuration (``Sources.kind_problem`` names the
version) and it is never watched at another version on its behalf. A configuration without a
version, and an ownerReference, take any served version (the preferred first): an owner is found
by UID whatever version it is read at. The one watch of a group/kind reads metadata, which is the
same at every version, so another configuration or a reference needing the kind at a served
version is watched as usual while the one that asked for an unserved version is still reported.

References. Only references to kinds not watched are counted (few, O(1) per event), so that such a
kind is needed exactly while referenced: ``missing`` (needed now, not served) lets it go, and
discovery stops looking it up, when the last object naming it goes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from functools import partial

from ..model.index import ClusterIndex
from ..model.objects import OwnerReference, PartialObject, group_of, object_key
from ..model.owners import POD, GroupKind
from ..model.resources import Resource
from ..runtime.logfields import fields
from .discovery import KindDiscovery, Need
from .reflector import Handler, Reflector

log = logging.getLogger(__name__)

# Starts a metadata-only watch: (name, path, handler) -> the running reflector.
StartWatch = Callable[[str, str, Handler[PartialObject]], Reflector]


class OwnerKinds:
    def __init__(self, index: ClusterIndex, discovery: KindDiscovery, start: StartWatch,
                 reserved: Collection[str] = ()) -> None:
        self.index = index
        self.discovery = discovery
        self._start = start
        self._reserved = reserved  # watch names taken already (nodes: a Node owns mirror pods)
        self.watched: dict[GroupKind, Resource] = {}
        self.reflectors: dict[GroupKind, Reflector] = {}
        self.configured: set[Need] = set()
        # Live objects whose controller reference names a kind not watched: source -> key -> kind.
        self._refs: dict[str, dict[str, GroupKind]] = {}
        self._ref_counts: dict[GroupKind, int] = {}

    def needs(self) -> set[Need]:
        """Every owner kind needed now: configured ones, and referenced ones not watched."""
        return self.configured | {(group, kind, None) for group, kind in self._ref_counts}

    def missing(self) -> set[GroupKind]:
        """The kinds needed now that discovery says are not served."""
        return {(group, kind) for group, kind, version in self.needs()
                if self.discovery.not_served((group, kind, version))}

    def configure(self, configured: set[Need]) -> None:
        """The kinds the WorkloadSummarizers list now: new ones are looked up at once."""
        added, self.configured = configured - self.configured, configured
        for need in added:
            self.discovery.look_up_unless_served(need)

    def watch(self, resource: Resource) -> None:
        """Watch the kind discovery found (once per group/kind)."""
        gk = (resource.group, resource.kind)
        if gk in self.watched:
            return
        self.watched[gk] = resource
        self._forget_refs(gk)
        name = resource.name if resource.name not in self._reserved else f"{resource.name}.owners"
        handler = Handler(partial(self._upsert, gk, name), partial(self._delete, gk, name))
        log.info("watching %s (metadata only) for %s", resource.path(), resource.kind,
                 extra=fields(resource.name, kind=resource.kind))
        self.reflectors[gk] = self._start(name, resource.path(), handler)

    def track(self, source: str, key: str, ref: OwnerReference | None) -> None:
        """The controller reference the object ``key`` of ``source`` has now (None: none, or gone).
        Nothing is stored for references to watched kinds."""
        gk = (group_of(ref.apiVersion), ref.kind) if ref is not None else None
        if gk is not None and (gk == POD or gk in self.watched):
            gk = None
        refs = self._refs.get(source)
        old = refs.get(key) if refs is not None else None
        if old == gk:
            return
        if gk is not None:
            self._refs.setdefault(source, {})[key] = gk
            self._count(gk)
        elif refs is not None:
            del refs[key]
        if old is not None:
            self._uncount(old)

    def _count(self, gk: GroupKind) -> None:
        self._ref_counts[gk] = self._ref_counts.get(gk, 0) + 1
        need = (gk[0], gk[1], None)
        if self._ref_counts[gk] == 1 and not self.discovery.knows(need):
            self.discovery.look_up(need)

    def _uncount(self, gk: GroupKind) -> None:
        self._ref_counts[gk] -= 1
        if not self._ref_counts[gk]:
            del self._ref_counts[gk]

    def _forget_refs(self, gk: GroupKind) -> None:
        """The kind is watched now: its references need no counting any more."""
        if self._ref_counts.pop(gk, None) is None:
            return
        for refs in self._refs.values():
            for key in [k for k, v in refs.items() if v == gk]:
                del refs[key]

    def _upsert(self, gk: GroupKind, source: str, obj: PartialObject) -> None:
        meta = obj.metadata
        ref = meta.controller_ref()
        controller = (ref.apiVersion, ref.kind, ref.uid) if ref else None
        self.index.upsert_owner(gk, meta.namespace, meta.name, meta.uid, controller)
        self.track(source, object_key(meta), ref)

    def _delete(self, gk: GroupKind, source: str, key: str) -> None:
        self.index.delete_owner(gk, key)
        self.track(source, key, None)
