"""The five CRDs. Here, what needs no cluster; the scenarios against one: tests/cluster/test_crds.py."""

from __future__ import annotations

import yaml

from tests.paths import CRDS
from tests.support.crds import KINDS


def test_crd_files_are_the_five_kinds() -> None:
    assert sorted(p.stem for p in CRDS.glob("*.yaml")) == sorted(KINDS)


def nulls(node: object, path: str = "") -> list[str]:
    """Every key whose value is null, at any depth."""
    if isinstance(node, dict):
        return [f"{path}/{k}" for k, v in node.items() if v is None] + \
            [p for k, v in node.items() for p in nulls(v, f"{path}/{k}")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in nulls(v, f"{path}[{i}]")]
    return []


def test_no_schema_holds_a_null() -> None:
    """A comma in a flow mapping's plain description (`{type: integer, description: Of those, ...}`)
    makes the rest of it a key with no value: YAML parsers disagree on it, and the schema says
    nothing anyone meant. No CRD may hold a null anywhere."""
    for path in sorted(CRDS.glob("*.yaml")):
        assert nulls(yaml.safe_load(path.read_text())) == [], path.name
