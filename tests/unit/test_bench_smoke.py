"""Every bench runs to its end: `python -m bench.<name>` at its smallest (a few nodes and pods, a
second or two of each phase, one round), its results written into the test's temporary folder,
never to bench/results/. A run fails when the bench exits non-zero or times out, when its --out
JSON lacks a number its report is made of, or when a file it writes beside that JSON (the
Markdown table, the plot) is missing.

SMOKE is the table of runs: one row per bench script (tests/unit/test_bench_layout.py fails for a bench
without one). A row names what the bench needs beyond a local control plane (components built
from their Go modules, commands installed by `make tools` or the `bench` extra). One bench by
hand: `.venv/bin/pytest tests/cluster/test_bench_smoke.py -k scale`."""

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
