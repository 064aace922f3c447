"""Pods and nodes in the API server's protobuf encoding, decoded into the projections of objects.py.

The server encodes protobuf several times cheaper than JSON, and its bytes are fewer. Only the
built-in kinds have it: custom resources and metadata-only answers stay JSON.

Wire format (k8s.io/apimachinery/pkg/runtime/serializer/protobuf):

- a LIST answer is ``k8s\\x00`` + runtime.Unknown{typeMeta, raw = the PodList's bytes};
- a watch stream (``;stream=watch``) is frames of a 4-byte big-endian length and a WatchEvent
  {type, object = RawExtension{raw}}, whose raw is again ``k8s\\x00`` + Unknown{raw = the object};
- an error answer, and an ERROR event's object, is a Status in the same envelope.

The messages below name only the fields the projections read, with their numbers from
k8s.io/api's generated.proto (a field's number never changes: it is the wire contract). The
parser (upb, the protobuf package's C implementation) skips the rest without building them.
Descriptors are made at import from the table: no generated code, no protoc.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from ..model.objects import (
    Bookmark,
    BookmarkMeta,
    Container,
    ContainerStatus,
    ListMeta,
    Node,
    NodeCondition,
    NodeSpec,
    NodeStatus,
    ObjectMeta,
    OwnerReference,
    Pod,
    PodCondition,
    PodSchedulingGroup,
    PodSpec,
    PodStatus,
    ResourceHealth,
    Resources,
    ResourceStatus,
    Status,
    Taint,
)
from .watchstream import MAX_FRAME  # one object's bytes at most, as in a watch

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
ACCEPT = f"{MEDIA_TYPE},application/json"  # JSON where the server has no protobuf for the kind
ACCEPT_WATCH = f"{MEDIA_TYPE};stream=watch,application/json"
MAGIC = b"k8s\x00"

_F = descriptor_pb2.FieldDescriptorProto
STRING, BYTES, BOOL, INT32, INT64 = _F.TYPE_STRING, _F.TYPE_BYTES, _F.TYPE_BOOL, _F.TYPE_INT32, _F.TYPE_INT64
QUANTITIES = "map<Quantity>"  # map<string, resource.Quantity{string = 1}>
LABELS = "map<string>"  # map<string, string>
KEPT = "kept"  # a message left as its bytes, decoded once per distinct value (see Once)

# message -> (field, number, type: a scalar type, a message name, a map, or KEPT: a message read as
# its bytes, which Once turns into its projection); "[]" marks repeated.
MESSAGES: dict[str, list[tuple[str, int, Any]]] = {
    "Unknown": [("raw", 2, BYTES)],
    "RawExtension": [("raw", 1, BYTES)],
    "WatchEvent": [("type", 1, STRING), ("object", 2, "RawExtension")],
    "Quantity": [("string", 1, STRING)],
    "ListMeta": [("resourceVersion", 2, STRING), ("continue", 3, STRING)],
    "Status": [("message", 3, STRING), ("reason", 4, STRING), ("code", 6, INT32)],
    "OwnerReference": [("kind", 1, STRING), ("name", 3, STRING), ("uid", 4, STRING),
                       ("apiVersion", 5, STRING), ("controller", 6, BOOL)],
    "ObjectMeta": [("name", 1, STRING), ("namespace", 3, STRING), ("uid", 5, STRING),
                   ("resourceVersion", 6, STRING), ("generation", 7, INT64), ("labels", 11, LABELS),
                   ("ownerReferences", 13, f"[]{KEPT}")],  # OwnerReference
    # A pod's: its labels' entries kept as their bytes too (the pods of a workload repeat their
    # label set), made into a map again through Labels.
    "PodMeta": [("name", 1, STRING), ("namespace", 3, STRING), ("uid", 5, STRING),
                ("resourceVersion", 6, STRING), ("generation", 7, INT64), ("labels", 11, f"[]{KEPT}"),
                ("ownerReferences", 13, f"[]{KEPT}")],
    "Labels": [("labels", 11, LABELS)],
    # A bookmark's object: its resourceVersion, and the annotation that ends a WatchList's state.
    "BookmarkMeta": [("resourceVersion", 6, STRING), ("annotations", 12, LABELS)],
    "BookmarkObject": [("metadata", 1, "BookmarkMeta")],
    "ResourceRequirements": [("requests", 2, QUANTITIES)],
    "Container": [("resources", 8, KEPT), ("restartPolicy", 24, STRING)],  # ResourceRequirements
    "PodSpec": [("containers", 2, "[]Container"), ("nodeName", 10, STRING), ("initContainers", 20, "[]Container"),
                ("overhead", 32, QUANTITIES), ("resources", 40, KEPT),  # ResourceRequirements
                ("schedulingGroup", 43, "PodSchedulingGroup")],
    "PodSchedulingGroup": [("podGroupName", 1, STRING)],
    "ResourceHealth": [("health", 2, STRING)],
    "ResourceStatus": [("name", 1, STRING), ("resources", 2, "[]ResourceHealth")],
    "ContainerStatus": [("allocatedResourcesStatus", 14, "[]ResourceStatus")],
    "PodCondition": [("type", 1, STRING), ("status", 2, STRING)],
    "PodStatus": [("phase", 1, STRING), ("conditions", 2, "[]PodCondition"),
                  ("containerStatuses", 8, "[]ContainerStatus"), ("initContainerStatuses", 10, "[]ContainerStatus")],
    "Pod": [("metadata", 1, "PodMeta"), ("spec", 2, "PodSpec"), ("status", 3, "PodStatus")],
    "PodList": [("metadata", 1, "ListMeta"), ("items", 2, "[]Pod")],
    "Taint": [("key", 1, STRING), ("effect", 3, STRING)],
    "NodeSpec": [("unschedulable", 4, BOOL), ("taints", 5, "[]Taint")],
    "NodeCondition": [("type", 1, STRING), ("status", 2, STRING)],
    "NodeStatus": [("capacity", 1, QUANTITIES), ("allocatable", 2, QUANTITIES), ("conditions", 4, "[]NodeCondition")],
    "Node": [("metadata", 1, "ObjectMeta"), ("spec", 2, "NodeSpec"), ("status", 3, "NodeStatus")],
    "NodeList": [("metadata", 1, "ListMeta"), ("items", 2, "[]Node")],
}
_PACKAGE = "nws.projection"


def _field(message: descriptor_pb2.DescriptorProto, name: str, number: int, kind: Any) -> None:
    field = message.field.add(name=name, number=number, label=_F.LABEL_OPTIONAL)
    if not isinstance(kind, str):  # a scalar type
        field.type = kind
        return
    if kind in (QUANTITIES, LABELS):  # a map is a repeated entry message {key = 1, value = 2}
        entry = message.nested_type.add(name=f"{name.title()}Entry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL, type=STRING)
        value = entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL)
        if kind == LABELS:
            value.type = STRING
        else:
            value.type, value.type_name = _F.TYPE_MESSAGE, f".{_PACKAGE}.Quantity"
        field.label, field.type, field.type_name = _F.LABEL_REPEATED, _F.TYPE_MESSAGE, \
            f".{_PACKAGE}.{message.name}.{entry.name}"
        return
    if kind.startswith("[]"):
        field.label, kind = _F.LABEL_REPEATED, kind[2:]
    if kind == KEPT:  # a message's bytes are a bytes field's on the wire
        field.type = BYTES
        return
    field.type, field.type_name = _F.TYPE_MESSAGE, f".{_PACKAGE}.{kind}"


def _classes() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(name="nws_projection.proto", package=_PACKAGE, syntax="proto2")
    for name, fields in MESSAGES.items():
        message = file.message_type.add(name=name)
        for field in fields:
            _field(message, *field)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name in MESSAGES}


CLASSES = _classes()  # message name -> its class (tests build envelopes with them)
_WATCH_EVENT, _UNKNOWN = CLASSES["WatchEvent"], CLASSES["Unknown"]


class ProtobufError(ValueError):
    """Bytes that are not the protobuf message they should be."""


def _parse(name: str, data: bytes | memoryview) -> Any:
    try:
        return CLASSES[name].FromString(data)  # one call into upb: a new message, parsed
    except message.DecodeError as err:
        raise ProtobufError(f"not a valid {name} in protobuf ({len(data)} bytes): {err}") from None


def unwrap(data: bytes) -> bytes:
    """The object's bytes inside ``k8s\\x00`` + runtime.Unknown."""
    if not data.startswith(MAGIC):
        raise ProtobufError(f"no protobuf envelope (the bytes start with {data[:8]!r})")
    raw: bytes = _parse("Unknown", memoryview(data)[len(MAGIC):]).raw
    return raw


# -- into the projections ------------------------------------------------------------------------

# Attribute reads on upb messages are the cost here (parsing is a tenth of it): each field is read
# once, and absent ones not at all.

class Once:
    """Projections of messages kept as their bytes (KEPT), decoded once per distinct value: the
    pods of a workload repeat their owner references, resource requirements and labels byte for
    byte. The projections are shared, so nothing may change them. At most ``limit`` are held
    (then the memo starts over)."""

    def __init__(self, decode: Callable[[Any], Any], limit: int = 8192) -> None:
        self._decode, self._limit = decode, limit
        self._seen: dict[Hashable, Any] = {}

    def __call__(self, raw: Hashable) -> Any:
        value = self._seen.get(raw)
        if value is None:
            if len(self._seen) >= self._limit:
                self._seen.clear()
            value = self._seen[raw] = self._decode(raw)
        return value


def _quantities(entries: Any) -> dict[str, str]:
    return {name: q.string for name, q in entries.items()} if entries else {}


def _owner_reference(raw: bytes) -> OwnerReference:
    r = _parse("OwnerReference", raw)
    return OwnerReference(r.apiVersion, r.kind, r.name, r.uid, r.controller)


def _requirements(raw: bytes) -> Resources:
    return Resources(_quantities(_parse("ResourceRequirements", raw).requests)) if raw else Resources()


_LABELS_TAG = b"\x5a"  # field 11, length-delimited: Labels.labels


def _label_map(entries: tuple[bytes, ...]) -> dict[str, str]:
    wire = bytearray()
    for entry in entries:
        wire += _LABELS_TAG
        size = len(entry)
        while size >= 0x80:  # the entry's length as a base-128 varint
            wire.append(size & 0x7F | 0x80)
            size >>= 7
        wire.append(size)
        wire += entry
    return dict(_parse("Labels", bytes(wire)).labels)


_owner_references, _resources, _labels = Once(_owner_reference), Once(_requirements), Once(_label_map)


def _meta(m: Any, labels: dict[str, str]) -> ObjectMeta:
    refs = m.ownerReferences
    return ObjectMeta(m.name, m.namespace, m.uid, m.resourceVersion, m.generation, labels,
                      [_owner_references(r) for r in refs] if refs else [])


def _container(c: Any) -> Container:
    return Container(_resources(c.resources), c.restartPolicy or None)  # JSON leaves it out when unset: None


def _pod(p: Any) -> Pod:
    meta, spec, status = p.metadata, p.spec, p.status
    init = spec.initContainers
    return Pod(
        _meta(meta, _labels(tuple(meta.labels))),
        PodSpec(spec.nodeName, [_container(c) for c in spec.containers], [_container(c) for c in init] if init else [],
                _quantities(spec.overhead), _resources(spec.resources), _scheduling_group(spec.schedulingGroup)),
        PodStatus(status.phase or "Pending", _ready_condition(status.conditions),
                  _container_statuses(status.initContainerStatuses), _container_statuses(status.containerStatuses)),
    )


def _ready_condition(conditions: Any) -> list[PodCondition]:
    """Of its conditions, Ready alone: the one the index reads (gangs.py)."""
    return [PodCondition(c.type, c.status) for c in conditions if c.type == "Ready"]


def _scheduling_group(group: Any) -> PodSchedulingGroup | None:
    return PodSchedulingGroup(group.podGroupName) if group.podGroupName else None


_NO_DEVICES = ContainerStatus()  # shared: no consumer changes a projection


def _container_statuses(statuses: Any) -> list[ContainerStatus]:
    """Of each container's status, its devices' health (most report none)."""
    return [ContainerStatus([ResourceStatus(r.name, [ResourceHealth(h.health) for h in r.resources])
                             for r in c.allocatedResourcesStatus]) if c.allocatedResourcesStatus else _NO_DEVICES
            for c in statuses]


def _node(n: Any) -> Node:
    spec, status = n.spec, n.status
    return Node(
        _meta(n.metadata, dict(n.metadata.labels)),
        NodeSpec(spec.unschedulable, [Taint(t.key, t.effect) for t in spec.taints]),
        NodeStatus(allocatable=_quantities(status.allocatable), capacity=_quantities(status.capacity),
                   conditions=[NodeCondition(c.type, c.status or "Unknown") for c in status.conditions]),
    )


class Codec:
    """Decodes one kind (Pod or Node) from protobuf: an object (of a watch event, or an item that
    ListItems cut out of a LIST answer)."""

    def __init__(self, kind: str, convert: Callable[[Any], Any]) -> None:
        self._kind, self._convert = kind, convert

    def object(self, raw: bytes) -> Any:
        """An object's bytes (inside the envelope) -> its projection."""
        return self._convert(_parse(self._kind, raw))


def list_meta(raw: bytes) -> ListMeta:
    """A LIST answer's metadata (``ListItems.metadata``)."""
    meta = _parse("ListMeta", raw)
    return ListMeta(meta.resourceVersion, getattr(meta, "continue"))


_LENGTH_DELIMITED = 2


def _varint(buf: bytearray, pos: int) -> tuple[int, int] | None:
    """The base-128 varint at ``pos`` and the position after it; None when it has not all come."""
    value = shift = 0
    while pos < len(buf):
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ProtobufError("a varint longer than 10 bytes")
    return None


def _field_at(buf: bytearray, pos: int) -> tuple[int, int, int, int] | None:
    """The field whose tag is at ``pos``: (number, wire type, where its value starts, the value's
    length); None when its tag and length have not all come."""
    tag = _varint(buf, pos)
    if tag is None:
        return None
    key, start = tag
    number, wire = key >> 3, key & 7
    if wire == _LENGTH_DELIMITED:
        length = _varint(buf, start)
        if length is None:
            return None
        size, start = length
        if size > MAX_FRAME:
            raise ProtobufError(f"a field of {size} bytes: not a LIST answer")
        return number, wire, start, size
    if wire == 0:  # a varint: its bytes are its length
        value = _varint(buf, start)
        return None if value is None else (number, wire, start, value[1] - start)
    if wire in (1, 5):  # fixed 64 and 32 bits
        return number, wire, start, 8 if wire == 1 else 4
    raise ProtobufError(f"wire type {wire} (field {number}): not a LIST answer")


class ListItems:
    """A LIST answer in protobuf (``k8s\x00`` + Unknown{raw = the XList{metadata = 1, items = 2}}),
    cut into its items' bytes as the answer's bytes come (watchstream.Framing): a page is never
    held whole, only the item under way. The list's metadata is kept in ``metadata``."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._offset = 0  # of _buf[0] in the answer
        self._list: tuple[int, int] | None = None  # where the list's bytes start and end in the answer
        self.metadata = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        items: list[bytes] = []
        pos = 0
        if self._offset == 0:
            if len(buf) < len(MAGIC):
                return items
            if buf[:len(MAGIC)] != MAGIC:
                raise ProtobufError(f"no protobuf envelope (the bytes start with {bytes(buf[:8])!r})")
            pos = len(MAGIC)
        while (field := _field_at(buf, pos)) is not None:
            number, wire, start, size = field
            if self._list is None and number == 2 and wire == _LENGTH_DELIMITED:  # Unknown.raw: the list
                self._list = self._offset + start, self._offset + start + size
                pos = start  # its fields are read as the answer's own
                continue
            end = start + size
            first, last = self._list or (0, 0)
            inside = first <= self._offset + pos < last
            if inside and self._offset + end > last:
                raise ProtobufError("a field of the list runs past the list's end")
            if end > len(buf):
                break  # the field's value has not all come
            if inside and number == 2:
                items.append(bytes(buf[start:end]))
            elif inside and number == 1:
                self.metadata = bytes(buf[start:end])
            pos = end
        del buf[:pos]
        self._offset += pos
        return items

    def end(self) -> list[bytes]:
        if self._buf or self._offset < len(MAGIC):
            raise ProtobufError(f"the LIST answer ended inside a field ({len(self._buf)} bytes of it)")
        if self._list is None or self._offset < self._list[1]:
            raise ProtobufError("the LIST answer ended before its list did")
        return []


def event(frame: bytes) -> tuple[str, bytes]:
    """A watch frame -> the event's type and its object's bytes (for the kind's ``Codec.object``,
    ``bookmark`` or ``status``, by the type). Written out: every watch event comes here."""
    try:
        parsed = _WATCH_EVENT.FromString(frame)
    except message.DecodeError:
        _parse("WatchEvent", frame)  # raises, saying why
        raise
    raw = parsed.object.raw
    if not raw.startswith(MAGIC):
        return parsed.type, unwrap(raw)  # raises, saying why
    try:
        return parsed.type, _UNKNOWN.FromString(memoryview(raw)[len(MAGIC):]).raw
    except message.DecodeError:
        return parsed.type, unwrap(raw)  # raises, saying why


def bookmark(raw: bytes) -> Bookmark:
    meta = _parse("BookmarkObject", raw).metadata
    return Bookmark(BookmarkMeta(meta.resourceVersion, dict(meta.annotations)))


def status(raw: bytes) -> Status:
    parsed = _parse("Status", raw)
    return Status(parsed.code, parsed.reason, parsed.message)


CODECS: dict[type, Codec] = {Pod: Codec("Pod", _pod), Node: Codec("Node", _node)}
