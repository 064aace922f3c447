"""Every bench runs to its end. Here, what needs no cluster; the scenarios against one:
tests/cluster/test_bench_smoke.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bench_smoke import SMOKE, beside, lookup, smoke


@pytest.mark.parametrize("name", sorted(n for n, row in SMOKE.items() if not row.cluster))
def test_bench_runs_to_its_end(name: str, tmp_path: Path) -> None:
    smoke(name, tmp_path)


def test_the_checks_see_what_they_look_for() -> None:
    data = {"rows": [{"a": {"b": 0}}], "x": None}
    assert lookup(data, "rows.0.a.b") and lookup(data, "x")
    assert not lookup(data, "rows.1.a") and not lookup(data, "rows.0.a.c") and not lookup(data, "rows.a")
    assert beside("scale") == (".md", ".png") and beside("sync") == () and beside("pod_memory") == (".md",)
