"""What both halves of test_compat (tests/unit and tests/cluster) use."""

from __future__ import annotations

import itertools

from tests.paths import ROOT

DOC = ROOT / "docs" / "compatibility.md"


def documented() -> dict[str, dict[str, str]]:
    """docs/compatibility.md's versions table: minor -> {column: cell}."""
    lines = DOC.read_text().split("## Versions", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))  # the first table
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    table = {}
    for row in rows[2:]:
        cells = dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True))
        table[cells["Kubernetes"]] = cells
    return table
