"""Pods and nodes in protobuf (kubeindex/client/protobuf.py). Here, what needs no cluster; the
scenarios against one: tests/cluster/test_protobuf.py."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import msgspec.inspect

from kubeindex.client import protobuf
from kubeindex.model.objects import (
    Container,
    ContainerStatus,
    Node,
    NodeCondition,
    NodeSpec,
    NodeStatus,
    ObjectMeta,
    OwnerReference,
    Pod,
    PodCondition,
    PodSpec,
    PodStatus,
    ResourceHealth,
    Resources,
    ResourceStatus,
    Taint,
)

# The protobuf message each struct of the pod and node projections is read from.
MESSAGE_OF = {Pod: "Pod", Node: "Node", ObjectMeta: "ObjectMeta", OwnerReference: "OwnerReference",
              PodSpec: "PodSpec", Container: "Container", Resources: "ResourceRequirements", PodStatus: "PodStatus",
              NodeSpec: "NodeSpec", Taint: "Taint", NodeStatus: "NodeStatus", NodeCondition: "NodeCondition",
              ContainerStatus: "ContainerStatus", ResourceStatus: "ResourceStatus", ResourceHealth: "ResourceHealth",
              PodCondition: "PodCondition"}


def projected(struct: type, into: str) -> Iterator[tuple[str, str, type | None]]:
    """(message, field, the struct it holds, if one) of every field the projection decodes, at any depth."""
    for info in msgspec.inspect.type_info(struct).fields:  # type: ignore[attr-defined]
        inner = info.type.item_type if isinstance(info.type, msgspec.inspect.ListType) else info.type
        held = inner.cls if isinstance(inner, msgspec.inspect.StructType) else None
        yield into, info.encode_name, held
        if held is not None:
            yield from projected(held, MESSAGE_OF[held])


def test_every_projected_field_of_pods_and_nodes_has_a_protobuf_field() -> None:
    """A field added to the Pod or Node projection (kubeindex/model/objects.py) and not to the
    protobuf schema would read as its default from every protobuf answer: found here, without a
    cluster. (The numbers are held to Kubernetes' own by the test above.)"""
    schema = {message: {name for name, _, _ in fields} for message, fields in protobuf.MESSAGES.items()}
    schema["ObjectMeta"] &= schema["PodMeta"]  # a pod's metadata is read through PodMeta: the same fields
    found = list(projected(Pod, "Pod")) + list(projected(Node, "Node"))
    missing = [(message, name) for message, name, _ in found if name not in schema[message]]
    assert missing == []
    assert len(found) >= 35
