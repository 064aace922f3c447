"""metav1.Conditions as the status writers keep them: each with the generation it describes, and
its lastTransitionTime kept while its status stays what the object has."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any


def rfc3339(seconds: float) -> str:
    """A metav1.Time: whole seconds, UTC."""
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_times(conditions: list[dict[str, Any]], old: Any, generation: int, now: float) -> list[dict[str, Any]]:
    """Each condition with observedGeneration, and its lastTransitionTime kept while its status is
    the one the object has (``old``: the object's conditions as read; anything else: none)."""
    before = {c.get("type"): c for c in old if isinstance(c, Mapping)} if isinstance(old, list) else {}
    out = []
    for c in conditions:
        previous = before.get(c["type"]) or {}
        kept = previous.get("lastTransitionTime") if previous.get("status") == c["status"] else None
        out.append({**c, "observedGeneration": generation, "lastTransitionTime": kept or rfc3339(now)})
    return out
