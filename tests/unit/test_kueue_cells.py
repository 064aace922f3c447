"""The supported-Kueue-versions table (docs/kueue.md, the README, docs/compatibility.md) tied to the
tests' Kueue cells (demo/kueue.py): each cell a row names is one of the cells, at the API version
the row says, and is run: the newest by `make test` (pytest's default --kueue), the others by
`make test-kueue-matrix` and CI's kueue job; every cell is named; the three tables are one."""

from __future__ import annotations

import itertools
import re

import pytest
import yaml

from demo.kueue import CELLS, NEWEST
from tests.paths import ROOT

MODULES = ("test_kueue", "test_claims", "test_fleet", "test_kueue_admission", "test_gitops")  # marked kueue


def table(path: str) -> list[dict[str, str]]:
    """The first table whose header starts with `| Kueue | API version used |`, as rows of cells."""
    lines = (ROOT / path).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Kueue | API version used |"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True)) for row in rows[2:]]


def named(row: dict[str, str]) -> str | None:
    """The cell a row's `tested` names (`cell `<name>``), if any."""
    match = re.match(r"cell `([^`]+)`", row["tested"])
    return match.group(1) if match else None


def test_every_cell_is_a_row_at_its_api_version_and_every_named_cell_exists() -> None:
    rows = table("docs/kueue.md")
    cells = {name: r for r in rows if (name := named(r))}
    assert set(cells) == set(CELLS), (set(cells), set(CELLS))
    for name, row in cells.items():
        assert row["API version used"].startswith(CELLS[name].version), row
        assert CELLS[name].release in row["tested"], row  # the release the cell installs
    untested = [r for r in rows if not named(r)]
    assert all(r["tested"].startswith("not tested") for r in untested), untested


@pytest.mark.parametrize("path", ["README.md", "docs/compatibility.md"])
def test_the_readme_and_compatibility_have_the_same_table(path: str) -> None:
    assert table(path) == table("docs/kueue.md")


def test_make_test_runs_the_newest_cell_and_the_matrix_the_others() -> None:
    rows = {name: r for r in table("docs/kueue.md") if (name := named(r))}
    makefile = (ROOT / "Makefile").read_text()
    test_recipe = makefile.split("\ntest: ", 1)[1].split("\n\n", 1)[0]
    assert "--kueue" not in test_recipe  # pytest's default: the newest
    assert "(`make test`)" in rows[NEWEST]["tested"]
    matrix = makefile.split("\ntest-kueue-matrix: ", 1)[1].split("\n\n", 1)[0]
    assert "c for c in CELLS if c != NEWEST" in matrix and "-m kueue --kueue $$cell" in matrix
    others = [c for c in CELLS if c != NEWEST]
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yaml").read_text())
    assert workflow["jobs"]["kueue"]["strategy"]["matrix"]["cell"] == others
    for cell in others:
        assert "(`make test-kueue-matrix`)" in rows[cell]["tested"], rows[cell]


@pytest.mark.parametrize("module", MODULES)
def test_the_scenarios_the_table_promises_run_in_every_cell(module: str) -> None:
    text = (ROOT / "tests" / "cluster" / f"{module}.py").read_text()
    assert re.search(r"^pytestmark = .*pytest\.mark\.kueue", text, re.M), module
