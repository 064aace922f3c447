"""What differs by Kubernetes minor, as the docs say it. Here, what needs no cluster; the scenarios
against one: tests/cluster/test_compat.py."""

from __future__ import annotations

import pytest
import yaml

from localkube.build import COMPAT_MINORS, CORE, PINNED_MINOR, BuildError, core
from tests.paths import ROOT
from tests.support.compat import documented


def test_every_minor_built_here_is_in_the_table_and_no_other() -> None:
    assert set(documented()) == {*COMPAT_MINORS, PINNED_MINOR}


def test_a_minor_names_its_wrapper_module_and_an_unknown_one_is_refused() -> None:
    assert core() == core(PINNED_MINOR) == CORE  # the pinned minor
    assert [c.dir.name for c in core("1.33")] == ["etcd", "kubernetes-1.33"]
    assert core("1.33")[1].version == "v1.33.13"  # from its go.mod
    with pytest.raises(BuildError, match=r"Kubernetes 1\.9: the versions built here are 1\.32, 1\.33, "):
        core("1.9")


def test_ci_runs_make_compat_on_every_minor() -> None:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yaml").read_text())
    assert workflow["jobs"]["compat"]["strategy"]["matrix"]["kubernetes"] == list(COMPAT_MINORS)


def test_the_readme_says_what_the_table_says() -> None:
    """The README's table, one column per minor: the same versions, the same way of listing."""
    heads = ("| Kubernetes |", "| tested with |", "| initial list |")
    rows = {cells[0]: cells[1:] for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith(heads))}
    table = documented()
    assert sorted(rows["Kubernetes"]) == sorted(table)
    for minor, tested, listing in zip(rows["Kubernetes"], rows["tested with"], rows["initial list"], strict=True):
        assert tested == table[minor]["tested with"]
        assert table[minor]["initial list (--initial-list=auto)"].startswith(listing), (minor, listing)
