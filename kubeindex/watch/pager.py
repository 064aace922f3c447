"""A paged LIST into a reflector's store, client-go's tools/pager: ``limit``/``continue`` pages of
one snapshot, each page's objects handed to the store as they are read (decode.py).

Pages hold ``WatchSettings.page_size`` objects, by default the server's (``ApiClient.page_size``:
20,000 from the watch cache, 500 where pages come from etcd).

Continue token expired (410 during a paged LIST, the snapshot was compacted between two pages):
the LIST starts again from the first page with the same page size, at the newest snapshot. The
memory bound stays one page, never the whole collection. Correctness: what the abandoned pass
applied stays in the store, deletes come only from the complete pass's diff (store.py), and the
watch starts at that pass's resourceVersion, so nothing between the two snapshots is lost.
(Continuing with the token the 410 carries would be cheaper but reads keys before and after the
break at different snapshots: a create or delete among the keys already read would be lost for
good.) A complete pass must fit in etcd's compaction interval (5 minutes by default), which a page
size of 500 meets by far.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from ..client.api import Gone
from ..client.watchstream import Framing
from ..model.objects import ListMeta
from ..runtime.logfields import fields
from .contact import Contact
from .decode import EventDecoder
from .store import SourceStats, SyncStore

log = logging.getLogger("kubeindex.watch.reflector")  # a reflector's lines, whichever part says them
LIST_TIMEOUT = 120  # seconds for one LIST page, all of it


class Lister(Protocol):
    """What a LIST needs of the API client (ApiClient; a scripted one in tests)."""

    async def page_size(self) -> int: ...

    async def get_frames(self, path: str, params: dict[str, str] | None, accept: str,
                         framing: Callable[[str], Framing], on_frame: Callable[[bytes], None],
                         timeout: float = ...) -> None: ...


def list_version(initial_list: str, resource_version: str) -> dict[str, str]:
    """The resourceVersion parameters of a LIST: none (a consistent read), but in ``cache`` mode
    (reflector.py) "0" (any age, from the watch cache) until synced, then not older than the last
    resourceVersion seen, so that a relist never goes back in time from what the store holds."""
    if initial_list != "cache":
        return {}
    if not resource_version:
        return {"resourceVersion": "0"}
    return {"resourceVersion": resource_version, "resourceVersionMatch": "NotOlderThan"}


class Pager:
    def __init__(self, api: Lister, name: str, path: str, decoder: EventDecoder[Any], store: SyncStore[Any],
                 contact: Contact, stats: SourceStats, now: Callable[[], float]) -> None:
        self.api, self.name, self.path = api, name, path
        self.decoder, self.store, self.contact, self.stats, self._now = decoder, store, contact, stats, now

    async def list(self, params: dict[str, str], page_size: int, yield_every: int) -> str:
        """Every page of a LIST with ``params`` (``page_size`` objects each; 0: the server's) into
        the pass under way of the store; the snapshot's resourceVersion."""
        first = {"limit": str(page_size or await self.api.page_size()), **params}
        params = first
        while True:
            try:
                meta = await self._page(params, yield_every)
            except Gone:
                if "continue" not in params:
                    raise
                log.info("%s: continue token expired after %d objects; listing again from the first page",
                         self.name, len(self.store.seen or ()), extra=fields(self.name))
                self.store.again()
                params = first
                continue
            if not meta.continue_:
                return meta.resourceVersion
            params = {**first, "continue": meta.continue_}
            if "resourceVersion" in first:  # the token holds it; the server refuses both
                params = {k: v for k, v in params.items() if not k.startswith("resourceVersion")}

    async def _page(self, params: dict[str, str], yield_every: int) -> ListMeta:
        """One LIST page, its objects handed to the store: in protobuf one by one as they come
        (the page is never held whole, nor its objects), in JSON once the page has all come."""
        page = self.decoder.page(self.store.listed)
        await self.api.get_frames(self.path, params, self.decoder.list_accept, page.framing, page.on_frame,
                                  timeout=LIST_TIMEOUT)
        self.contact.made()
        meta, items = page.end()
        for i, obj in enumerate(items):
            self.store.listed(obj)
            if i % yield_every == yield_every - 1:
                await asyncio.sleep(0)  # decoding is CPU-bound: let /metrics and other loops run
        self.stats.last_event = self._now()
        return meta
