"""What differs by Kubernetes minor, measured on the running control plane. `make compat` runs this
and the other `compat` modules against every minor localkube builds (`--kubernetes`), and
docs/compatibility.md's table must say what was measured: the tested patch release, and how the
service makes its initial list there (a WatchList, or paged LISTs where the server refuses it)."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from kubeindex.client.api import load_connection
from kubeindex.model.index import ClusterIndex
from kubeindex.watch.reflector import WatchSettings
from kubeindex.watch.sources import Sources
from localkube.cluster import LocalCluster
from tests.kube import RecordingApi, until
from tests.support.compat import documented

pytestmark = pytest.mark.compat


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
