"""docs/kubectl.md's table of what `kubectl get workloads` lists has a row for each cell the
cluster test measures (tests/cluster/test_kubectl_names.py), and no other."""

from __future__ import annotations

from localkube.build import COMPAT_MINORS, PINNED_MINOR
from tests.support.kubectl import core_cells, documented


def test_the_table_has_a_row_for_every_cell_and_no_other() -> None:
    cells = {(minor, kueue_, "on" if core else "off") for minor in (*COMPAT_MINORS, PINNED_MINOR)
             for kueue_ in ("absent", "present") for core in core_cells(minor)}
    assert set(documented()) == cells
