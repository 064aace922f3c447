"""How a consumer tells that something changed: one revision counter per index, and a cache of
things made from stamped inputs.

Every aggregate of a ``ClusterIndex`` (node groups, workloads, Kueue flavors) takes a new stamp
from its index's ``Revision`` whenever its content changes, and so do the index's sets (node
groups or workloads come or go, the configuration changes) and its Kueue objects. Stamps only
grow, so a consumer tells in O(1) whether what it made is current, and (a set's revision, the
newest stamp in it) identifies a sum over the set.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Revision:
    """``next()`` gives a new stamp; ``value`` is the newest."""

    def __init__(self) -> None:
        self.value = 0

    def __next__(self) -> int:
        self.value += 1
        return self.value


class Stamped(dict[K, tuple[Hashable, V]]):
    """Values kept under the stamp of the inputs they were made from: made again only when the
    stamp moved, so an unchanged aggregate costs a lookup. Prune it as a dict."""

    def made(self, key: K, stamp: Hashable, make: Callable[[], V]) -> V:
        hit = self.get(key)
        if hit is None or hit[0] != stamp:
            hit = self[key] = (stamp, make())
        return hit[1]
