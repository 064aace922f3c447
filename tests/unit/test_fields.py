"""Unit tests of the write path's pure parts: managedFields projection and comparison
(reconciler/fields.py)."""

from __future__ import annotations

from typing import Any

from reconciler import fields

# As the API server records them after our applies (metadata+spec, then status).
MANAGED = [
    {"manager": "node-workload-summary", "operation": "Apply", "fieldsV1": {
        "f:metadata": {"f:labels": {"f:ux.sean.example.com/managed-by": {}},
                       "f:ownerReferences": {'k:{"uid":"u1"}': {}}},
        "f:spec": {"f:selector": {"f:matchLabels": {"f:pool": {}}}}}},
    {"manager": "node-workload-summary", "operation": "Apply", "subresource": "status", "fieldsV1": {
        "f:status": {"f:nodeCount": {},
                     "f:conditions": {'k:{"type":"Ready"}': {".": {}, "f:type": {}, "f:count": {}}}}}},
    {"manager": "kubectl-label", "operation": "Update", "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}}},
]
OBJECT: dict[str, Any] = {
    "metadata": {"labels": {"ux.sean.example.com/managed-by": "node-workload-summary", "team": "ml"},
                 "annotations": {"policy": "x"},
                 "ownerReferences": [{"apiVersion": "v", "kind": "NodeSummarizer", "name": "s", "uid": "u1"}]},
    "spec": {"selector": {"matchLabels": {"pool": "a"}}},
    "status": {"nodeCount": 3, "conditions": [{"type": "Other", "count": 9}, {"type": "Ready", "count": 3}],
               "extra": "set by someone else"},
}


def test_projection_keeps_only_our_fields() -> None:
    ours = fields.project(OBJECT, fields.owned(MANAGED, "node-workload-summary"))
    assert ours == {
        "metadata": {"labels": {"ux.sean.example.com/managed-by": "node-workload-summary"},
                     "ownerReferences": [{"apiVersion": "v", "kind": "NodeSummarizer", "name": "s", "uid": "u1"}]},
        "spec": {"selector": {"matchLabels": {"pool": "a"}}},
        "status": {"nodeCount": 3, "conditions": [{"type": "Ready", "count": 3}]},
    }


def test_a_field_taken_by_another_manager_leaves_our_view() -> None:
    """kubectl edit of status.nodeCount moves its ownership away from us: our view lacks it, so
    the desired status differs and is applied again."""
    managed = [dict(MANAGED[0]), {**MANAGED[1], "fieldsV1": {"f:status": {"f:conditions": {}}}}]
    ours = fields.project(OBJECT, fields.owned(managed, "node-workload-summary"))
    assert "nodeCount" not in ours["status"]
    assert not fields.same({"nodeCount": 3, "conditions": OBJECT["status"]["conditions"]}, ours["status"])


def test_same_ignores_order_of_list_items() -> None:
    assert fields.same({"l": [{"a": 1}, {"b": 2}]}, {"l": [{"b": 2}, {"a": 1}]})
    assert not fields.same({"l": [{"a": 1}]}, {"l": [{"a": 1}, {"b": 2}]})
    assert not fields.same({"a": 1}, {"a": 1, "b": 2})
