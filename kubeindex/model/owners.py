"""The ownership graph: which root workload each pod (and each owner) belongs to.

Every object that can be an owner or owned (pods included: a LeaderWorkerSet worker chain goes
Pod -> StatefulSet -> leader Pod -> StatefulSet -> LeaderWorkerSet) is a vertex keyed by UID with
its controller ownerReference as the edge to its parent. Following the edge by UID is the UID check
at every hop: an ownerReference whose UID no longer exists (the owner was recreated under the same
name) resolves to nothing.

Some links are by name, not UID: a pod names its PodGroup, a PodGroup its Workload (the in-tree
Workload API). The object of that name is a vertex of its own (``named``), whose parent is the
UID of the object that bears the name now; it exists while that object does, so a link to a name
not (yet) known breaks the chain as a missing owner does.

A chain broken by a missing owner (not created yet, deleted, or of a kind this service may not
list) still has a root workload when a configured kind sits below the break: the topmost one
there. The break stays visible in the Resolution's status (MISSING) so it can be counted.

Each vertex memoizes its Resolution (the topmost configured ancestor, or why there is none). The
memo is kept current eagerly: a vertex whose edge or configured-ness changes is recomputed and
the change flows down to its descendants, so a pod event costs O(1), an owner event O(depth)
plus the descendants whose answer really changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

GroupKind = tuple[str, str]  # (API group, kind); the core group is ""
POD: GroupKind = ("", "Pod")
NAMED = "@name"  # the kind suffix of a by-name vertex: never a configured kind, never a root
MAX_DEPTH = 10  # ownerReference hops followed from a pod, as Kueue does

# Resolution statuses
OK = "ok"  # a configured ancestor (or the vertex itself) was found
NONE = "no_workload_type"  # the chain ends without any configured kind
MISSING = "missing_owner"  # an owner on the chain is not (yet) known, or its UID differs
CYCLE = "cycle"
TOO_DEEP = "too_deep"
FAILURES = (MISSING, CYCLE, TOO_DEEP)


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a walk up from a vertex finds. The walk follows at most ``max_depth`` hops; at each hop
    it stops with TOO_DEEP past the limit, MISSING at an unknown owner, CYCLE at a vertex seen
    before. ``height`` is the hop at which the walk ended (the chain's end, or the failure).

    With MISSING, ``workload`` is the topmost configured ancestor-or-self below the break (None if
    there is none); CYCLE and TOO_DEEP never have a workload."""

    workload: str | None  # UID of the topmost configured ancestor-or-self
    status: str  # OK, NONE or a failure; MISSING may come with a workload
    height: int


_UNSET = Resolution(None, NONE, -1)


def named(gk: GroupKind, namespace: str, name: str) -> tuple[str, GroupKind]:
    """The vertex id and kind of the by-name link to the object ``namespace/name`` of kind ``gk``.
    The id cannot be a UID (those have no "/")."""
    return f"{gk[0]}/{gk[1]}/{namespace}/{name}", (gk[0], gk[1] + NAMED)


class Vertex:
    __slots__ = ("below", "gk", "key", "namespace", "parent", "res", "uid")

    def __init__(self, uid: str, gk: GroupKind, namespace: str, key: str, parent: str | None) -> None:
        self.uid = uid
        self.gk = gk
        self.namespace = namespace
        self.key = key  # "<namespace>/<name>" (or name): how the owning store finds the object
        self.parent = parent  # UID of the controller owner
        self.res = _UNSET
        self.below = _UNSET  # the answer last computed for a child: its siblings share the object


# Called with (vertex, old resolution, new resolution) whenever a vertex's answer changes.
Listener = Callable[[Vertex, Resolution, Resolution], None]


class OwnerGraph:
    def __init__(self, listener: Listener | None = None, max_depth: int = MAX_DEPTH) -> None:
        self.vertices: dict[str, Vertex] = {}
        self.children: dict[str, set[str]] = {}  # parent UID -> child UIDs (the parent may not exist)
        self.configured: frozenset[GroupKind] = frozenset()
        self.max_depth = max_depth
        self._listener = listener

    # -- updates -------------------------------------------------------------------------------

    def upsert(self, uid: str, gk: GroupKind, namespace: str, key: str, parent: str | None) -> Resolution:
        vertex = self.vertices.get(uid)
        if vertex is None:
            vertex = self.vertices[uid] = Vertex(uid, gk, namespace, key, parent)
            self._link(uid, parent)
            cycles = []
        elif vertex.parent != parent or vertex.gk != gk:
            cycles = self._cycle_of(vertex)
            self._unlink(uid, vertex.parent)
            vertex.parent, vertex.gk = parent, gk
            self._link(uid, parent)
        else:
            return vertex.res  # the common case: a status update that leaves the edge alone
        # The children too, even if this vertex's answer stays: a new edge can close a cycle
        # through them. And every member of a cycle the edge opens or closes: a member's answer
        # comes from the cycle, not from its parent, so it may change where its parent's does not.
        self._refresh([*cycles, *self._cycle_of(vertex), *self._child_vertices(uid), vertex])
        return vertex.res

    def delete(self, uid: str) -> None:
        vertex = self.vertices.pop(uid, None)
        if vertex is None:
            return
        self._unlink(uid, vertex.parent)
        old, vertex.res = vertex.res, _UNSET
        self._notify(vertex, old, vertex.res)
        self._refresh(self._child_vertices(uid))

    def set_configured(self, configured: Iterable[GroupKind]) -> None:
        """Change the configured workload kinds; only vertices of kinds that changed are redone."""
        new = frozenset(configured)
        changed = new ^ self.configured
        self.configured = new
        if changed:
            self._refresh([v for v in self.vertices.values() if v.gk in changed])

    # -- queries -------------------------------------------------------------------------------

    def resolution(self, uid: str) -> Resolution | None:
        vertex = self.vertices.get(uid)
        return vertex.res if vertex else None

    # -- internals -----------------------------------------------------------------------------

    def _link(self, uid: str, parent: str | None) -> None:
        if parent is not None:
            self.children.setdefault(parent, set()).add(uid)

    def _unlink(self, uid: str, parent: str | None) -> None:
        if parent is None:
            return
        siblings = self.children.get(parent)
        if siblings is not None:
            siblings.discard(uid)
            if not siblings:
                del self.children[parent]

    def _child_vertices(self, uid: str) -> list[Vertex]:
        return [self.vertices[c] for c in self.children.get(uid, ()) if c in self.vertices]

    def _cycle_length(self, vertex: Vertex) -> int:
        """Hops until following parents from ``vertex`` comes back to it (0: not within the walk's
        limit). O(depth)."""
        if vertex.uid not in self.children:
            return 0  # nothing points at it (every pod but a LWS leader): cannot be on a cycle
        seen = {vertex.uid}
        current = vertex
        for hop in range(1, self.max_depth + 1):
            if current.parent is None or current.parent not in self.vertices:
                return 0
            if current.parent in seen:
                return hop if current.parent == vertex.uid else 0
            seen.add(current.parent)
            current = self.vertices[current.parent]
        return 0

    def _cycle_of(self, vertex: Vertex) -> list[Vertex]:
        """The other vertices of the cycle through ``vertex`` (none when it is on none)."""
        members = []
        for _ in range(self._cycle_length(vertex) - 1):
            vertex = self.vertices[vertex.parent]  # type: ignore[index]  # on a cycle, every vertex has a parent
            members.append(vertex)
        return members

    def _compute(self, vertex: Vertex) -> Resolution:
        own = vertex.uid if vertex.gk in self.configured else None
        if vertex.parent is None:
            return Resolution(own, OK if own else NONE, 0)
        parent = self.vertices.get(vertex.parent)
        if parent is None:
            return Resolution(own, MISSING, 1)  # the break: this vertex is the topmost below it
        cycle = self._cycle_length(vertex)
        if cycle:
            return Resolution(None, CYCLE, cycle)
        height = parent.res.height + 1
        if height > self.max_depth:
            return Resolution(None, TOO_DEEP, self.max_depth + 1)
        status = parent.res.status
        if status in (CYCLE, TOO_DEEP):
            return Resolution(None, status, height)
        above = parent.res.workload or own
        if status == NONE:
            status = OK if above else NONE
        shared = parent.below
        if shared.workload != above or shared.status != status or shared.height != height:
            shared = parent.below = Resolution(above, status, height)
        return shared

    def _refresh(self, start: list[Vertex]) -> None:
        """Recompute ``start`` and, wherever an answer changed, the children below it."""
        queue = list(start)
        while queue:
            vertex = queue.pop()
            new = self._compute(vertex)
            if new == vertex.res:
                continue
            old, vertex.res = vertex.res, new
            self._notify(vertex, old, new)
            queue.extend(self._child_vertices(vertex.uid))

    def _notify(self, vertex: Vertex, old: Resolution, new: Resolution) -> None:
        if self._listener is not None:
            self._listener(vertex, old, new)
