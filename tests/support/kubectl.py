"""What the kubectl plugin's tests share (tests/unit and tests/cluster): the plugin on PATH, and
docs/kubectl.md's table of what `kubectl get workloads` lists."""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

from localkube.cluster import WORKLOAD_API_MINORS
from tests.paths import ROOT

PLUGIN = Path(sys.executable).parent / "kubectl-nws"  # the console script `make install` put in .venv/bin
DOC = ROOT / "docs" / "kubectl.md"


def plugin_env(**extra: str) -> dict[str, str]:
    """kubectl's environment with the virtualenv's bin/ (kubectl-nws) first on PATH."""
    assert PLUGIN.exists(), f"{PLUGIN} is missing: `make install` writes the package's console scripts"
    return {**os.environ, "PATH": f"{PLUGIN.parent}{os.pathsep}{os.environ.get('PATH', '')}", **extra}


def documented() -> dict[tuple[str, str, str], dict[str, str]]:
    """docs/kubectl.md's table: (Kubernetes, Kueue, in-tree Workload API) -> {column: cell}."""
    lines = DOC.read_text().split("## What `kubectl get workloads` lists", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    table = {}
    for row in rows[2:]:
        cells = dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True))
        table[cells["Kubernetes"], cells["Kueue"], cells["in-tree Workload API"]] = cells
    return table


def core_cells(minor: str) -> list[bool]:
    """The in-tree Workload API's cells on a minor: off, and on where it is served (1.37, 1.38)."""
    return [False, True] if minor in WORKLOAD_API_MINORS else [False]
