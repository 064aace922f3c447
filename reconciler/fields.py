"""What of an object a field manager owns, read from its managedFields (fieldsV1).

Server-side apply records, per manager, the set of fields it owns: `f:<name>` for a map field,
`k:<json>` for an item of an associative list (by its keys), `v:<json>` for a set item, `i:<n>`
for a list index, `.` for the node itself. Projecting an object onto the set gives exactly the
part a manager's apply would change. Comparing that part with what we would apply tells whether
a write is needed: a label or annotation another manager added is outside the set (never a reason
to write); a field of ours that someone else changed left the set (a reason to take it back).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

FieldSet = dict[str, Any]


def merge(sets: Iterable[FieldSet]) -> FieldSet:
    """The union of field sets (one per managedFields entry: the object and its status)."""
    out: FieldSet = {}
    for fs in sets:
        for key, sub in fs.items():
            out[key] = merge((out[key], sub)) if key in out and isinstance(sub, dict) else sub
    return out


def owned(managed_fields: Iterable[dict[str, Any]], manager: str) -> FieldSet:
    """The fields ``manager`` owns through apply (on the object or any subresource)."""
    return merge(e.get("fieldsV1") or {} for e in managed_fields
                 if e.get("manager") == manager and e.get("operation") == "Apply")


_MISSING = object()


def project(value: Any, fields: FieldSet) -> Any:
    """``value`` reduced to ``fields`` (absent fields stay absent)."""
    children = {k: v for k, v in fields.items() if k != "."}
    if not children:
        return value  # a leaf, or an atomic value owned whole
    if isinstance(value, dict):
        out = {}
        for key, sub in children.items():
            if key.startswith("f:") and key[2:] in value:
                out[key[2:]] = project(value[key[2:]], sub)
        return out
    if isinstance(value, list):
        return [p for p in (_project_item(value, key, sub) for key, sub in children.items()) if p is not _MISSING]
    return value


def _project_item(items: list[Any], key: str, sub: FieldSet) -> Any:
    kind, _, raw = key.partition(":")
    if kind == "k":
        keys = json.loads(raw)
        for item in items:
            if isinstance(item, dict) and all(item.get(k) == v for k, v in keys.items()):
                return project(item, sub)
    elif kind == "v":
        wanted = json.loads(raw)
        if wanted in items:
            return wanted
    elif kind == "i" and int(raw) < len(items):
        return project(items[int(raw)], sub)
    return _MISSING


def same(ours: Any, actual: Any) -> bool:
    """Equal, with associative list items compared regardless of order (the server may keep
    another manager's items in between or reorder)."""
    if isinstance(ours, dict) and isinstance(actual, dict):
        return ours.keys() == actual.keys() and all(same(ours[k], actual[k]) for k in ours)
    if isinstance(ours, list) and isinstance(actual, list):
        return len(ours) == len(actual) and all(any(same(o, a) for a in actual) for o in ours)
    return ours == actual
