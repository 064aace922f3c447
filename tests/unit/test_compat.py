"""What differs by Kubernetes minor, as the docs say it. Here, what needs no cluster; the scenarios
against one: tests/cluster/test_compat.py."""

from __future__ import annotations

import os
import re

import pytest
import yaml

from localkube.build import COMPAT_MINORS, CORE, PINNED_MINOR, TOOLCHAINS, BuildError, core, go_env
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


def test_a_minor_whose_go_mod_asks_for_a_newer_go_is_built_with_its_toolchain() -> None:
    """1.38's go.mod says go 1.27.0: its build, and only its, runs with GOTOOLCHAIN=go1.27.3."""
    for minor in COMPAT_MINORS:
        component = core(minor)[1]
        match = re.search(r"^go (\d+)\.(\d+)", (component.dir / "go.mod").read_text(), re.M)
        assert match, minor
        newer = (int(match[1]), int(match[2])) > (1, 26)
        assert bool(component.toolchain) == newer == (minor in TOOLCHAINS), minor
        if newer:
            assert component.toolchain == "go1.27.3"  # the one approved toolchain
            assert go_env(component)["GOTOOLCHAIN"] == component.toolchain
        else:
            assert go_env(component).get("GOTOOLCHAIN") == os.environ.get("GOTOOLCHAIN")


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
    minors = [cell.split()[0] for cell in rows["Kubernetes"]]  # "1.38 (beta)": a pre-release
    assert sorted(minors) == sorted(table)
    for minor, tested, listing in zip(minors, rows["tested with"], rows["initial list"], strict=True):
        assert tested == table[minor]["tested with"]
        assert table[minor]["initial list (--initial-list=auto)"].startswith(listing), (minor, listing)
