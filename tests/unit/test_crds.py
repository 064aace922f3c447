"""The five CRDs. Here, what needs no cluster; the scenarios against one: tests/cluster/test_crds.py."""

from __future__ import annotations

from tests.paths import CRDS
from tests.support.crds import KINDS


def test_crd_files_are_the_five_kinds() -> None:
    assert sorted(p.stem for p in CRDS.glob("*.yaml")) == sorted(KINDS)
