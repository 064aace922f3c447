"""Every bench runs to its end: `python -m bench.<name>` at its smallest (a few nodes and pods, a
second or two of each phase, one round), its results written into the test's temporary folder,
never to bench/results/. A run fails when the bench exits non-zero or times out, when its --out
JSON lacks a number its report is made of, or when a file it writes beside that JSON (the
Markdown table, the plot) is missing.

SMOKE is the table of runs: one row per bench script (tests/unit/test_bench_layout.py fails for a bench
without one). A row names what the bench needs beyond a local control plane (components built
from their Go modules, commands installed by `make tools` or the `bench` extra). One bench by
hand: `.venv/bin/pytest tests/cluster/test_bench_smoke.py -k scale`.

Marked `bench`: `make bench-smoke` runs them (and CI, after `make test`), not `make test`, which
keeps its cold run under half an hour; the benches that need no cluster run there
(tests/unit/test_bench_smoke.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bench_smoke import SMOKE, smoke

pytestmark = pytest.mark.bench


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.needs(*row.needs)) if row.needs else n
                                  for n, row in sorted(SMOKE.items()) if row.cluster])
def test_bench_runs_to_its_end_on_a_control_plane(name: str, tmp_path: Path, binaries: dict[str, Path]) -> None:
    smoke(name, tmp_path)
