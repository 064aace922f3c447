"""What differs by Kubernetes minor, measured on the running control plane. `make compat` runs this
and the other `compat` modules against every minor localkube builds (`--kubernetes`), and
docs/compatibility.md's table must say what was measured: the tested patch release, and how the
service makes its initial list there (a WatchList, or paged LISTs where the server refuses it)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import re

import pytest
import yaml

from kubeindex.client.api import load_connection
from kubeindex.model.index import ClusterIndex
from kubeindex.watch.reflector import WatchSettings
from kubeindex.watch.sources import Sources
from localkube.build import COMPAT_MINORS, CORE, PINNED_MINOR, BuildError, core
from localkube.cluster import LocalCluster
from tests.kube import RecordingApi, until
from tests.paths import ROOT

pytestmark = pytest.mark.compat

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


def test_the_table_says_how_this_version_lists(cluster: LocalCluster, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kubeindex.client.api")
    status, version = cluster.request("/version")
    assert status == 200 and isinstance(version, dict), version
    minor = f"{version['major']}.{re.sub(r'[^0-9]', '', version['minor'])}"
    row = documented()[minor]
    assert row["tested with"] == version["gitVersion"], (row, version["gitVersion"])

    async def initial_list() -> tuple[int, str, list[dict[str, str]]]:
        async with RecordingApi(load_connection(str(cluster.kubeconfig))) as api:
            sources = Sources(api, ClusterIndex(), WatchSettings(initial_list="auto"))
            await sources.start()
            try:
                await until(sources.ready.is_set)
            finally:
                await sources.stop()
            return api.streamed, api.watch_list_refused, api.lists

    streamed, refused, lists = asyncio.run(initial_list())
    if streamed and not refused:
        used = "WatchList"
        assert not lists
    else:  # listed: from 1.34 without asking for a WatchList; before, after the server refused one
        assert bool(streamed) == bool(refused) and lists
        sizes = {int(p["limit"]) for p in lists}
        assert len(sizes) == 1, sizes
        used = f"pages of {sizes.pop():,}"
    assert row["initial list (--initial-list=auto)"].startswith(used), (minor, row, refused)
    said = "it serves every LIST page from its watch cache" if used == "pages of 20,000" else "come from etcd"
    assert caplog.text.count(f"the API server is {version['gitVersion']}: ") == 1 and said in caplog.text
