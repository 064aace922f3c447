"""A resource's watch events and LIST pages, from the wire into its projection
(kubeindex/model/objects.py): what a reflector asks for and how it reads the answer.

Pods and nodes are asked for in protobuf (``WatchSettings.encoding``, kubeindex/client/protobuf.py),
the other kinds in JSON, owner kinds as metadata only; each answer is read in the encoding the
server chose (its Content-Type; a LIST page too), so a server or proxy that answers JSON is still
understood.

A watch event decodes to its type and its object: the projection, or a ``Bookmark`` for a
BOOKMARK; an ERROR event raises its Status as the API error it names (410 Gone, ...). A LIST
page in protobuf hands its objects over one by one as its bytes come (``protobuf.ListItems``):
the page is never held whole, so large pages cost no memory; a page in JSON is decoded once it
has all come, in one pass into the item type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, Literal, TypeVar

import msgspec

from ..client import protobuf
from ..client.api import JSON, PARTIAL, PARTIAL_LIST, status_error
from ..client.watchstream import Framing, Whole
from ..model.objects import Bookmark, ListMeta, RawEvent, Status

T = TypeVar("T")
Encoding = Literal["protobuf", "json"]


class _Page(msgspec.Struct, Generic[T]):
    """A LIST page decoded in one pass into the item type."""

    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[T] | None = None  # an empty metadata-only list comes as "items": null


class WatchEvent(msgspec.Struct, Generic[T]):
    """A watch event decoded in one pass into the item type: half the CPU of RawEvent and then the
    object, which scans the object's bytes twice. BOOKMARK and ERROR events go the RawEvent way (a
    bookmark's annotations are not in the projection; a Status is no item)."""

    type: str
    object: T


class EventDecoder(Generic[T]):
    def __init__(self, item_type: type[T], *, metadata_only: bool = False, encoding: Encoding = "protobuf") -> None:
        # Protobuf where the kind has it (pods, nodes); the server may still answer JSON.
        self.codec = None if metadata_only or encoding != "protobuf" else protobuf.CODECS.get(item_type)
        self.list_accept = PARTIAL_LIST if metadata_only else protobuf.ACCEPT if self.codec else JSON
        self.watch_accept = PARTIAL if metadata_only else protobuf.ACCEPT_WATCH if self.codec else JSON
        self._item = msgspec.json.Decoder(item_type)
        # _Page of the item type, made at run time; mypy takes a subscript by a variable for no type.
        self._list: msgspec.json.Decoder[_Page[T]] = msgspec.json.Decoder(_Page[item_type])  # type: ignore[valid-type]
        self._typed: msgspec.json.Decoder[WatchEvent[T]] = msgspec.json.Decoder(WatchEvent[item_type])  # type: ignore[valid-type]
        self._event = msgspec.json.Decoder(RawEvent)
        self._status = msgspec.json.Decoder(Status)
        self._bookmark = msgspec.json.Decoder(Bookmark)

    def answers_protobuf(self, content_type: str) -> bool:
        """An answer of this Content-Type is read as protobuf."""
        return self.codec is not None and content_type.startswith(protobuf.MEDIA_TYPE)

    def json_event(self, line: bytes) -> WatchEvent[Any]:
        """A JSON watch event: its type and its object (a Bookmark for a BOOKMARK); an ERROR is
        raised as the API error its Status names."""
        try:
            typed = self._typed.decode(line)
        except msgspec.ValidationError:  # an ERROR event's Status: not an item
            typed = None
        if typed is not None and typed.type not in ("BOOKMARK", "ERROR"):
            return typed
        event = self._event.decode(line)
        if event.type == "ERROR":
            status = self._status.decode(event.object)
            raise status_error(status.code, status.reason, status.message)
        decode = self._bookmark if event.type == "BOOKMARK" else self._item
        return WatchEvent(event.type, decode.decode(event.object))

    def protobuf_object(self, event_type: str, raw: bytes) -> Any:
        """The object of a protobuf watch event (``protobuf.event`` parts a frame into its type and
        these bytes, without a tuple more per event): the projection, or a Bookmark for a BOOKMARK;
        an ERROR is raised as the API error its Status names."""
        if event_type == "ERROR":
            status = protobuf.status(raw)
            raise status_error(status.code, status.reason, status.message)
        if event_type == "BOOKMARK":
            return protobuf.bookmark(raw)
        assert self.codec is not None
        return self.codec.object(raw)

    def page(self, on_object: Callable[[Any], None]) -> Page:
        """A LIST page to read: its objects to ``on_object``, in protobuf as they come."""
        return Page(self.codec, self._list, on_object)


class Page:
    """One LIST page, read in the encoding of its answer (``framing`` and ``on_frame`` go to
    ``ApiClient.get_frames``)."""

    def __init__(self, codec: protobuf.Codec | None, whole: msgspec.json.Decoder[_Page[Any]],
                 on_object: Callable[[Any], None]) -> None:
        self._codec = codec  # the kind's, if it has one
        self._decode_whole = whole
        self._on_object = on_object
        self._items: protobuf.ListItems | None = None  # the page's objects as they come (protobuf)
        self._reading: protobuf.Codec | None = None  # the codec of those objects (protobuf)
        self._whole: list[bytes] = []  # the page, once it has all come (JSON)

    def framing(self, content_type: str) -> Framing:
        if self._codec is not None and content_type.startswith(protobuf.MEDIA_TYPE):
            self._items, self._reading = protobuf.ListItems(), self._codec
            return self._items
        return Whole()

    def on_frame(self, frame: bytes) -> None:
        if self._reading is not None:
            self._on_object(self._reading.object(frame))
        else:
            self._whole.append(frame)

    def end(self) -> tuple[ListMeta, list[Any]]:
        """The page has all come: its metadata, and the objects not handed over yet (JSON's, all)."""
        if self._items is not None:
            return protobuf.list_meta(self._items.metadata), []
        page = self._decode_whole.decode(self._whole[0])
        return page.metadata, page.items or []
