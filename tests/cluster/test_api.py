"""kubeindex/client/api.py: the credentials a Connection sends, however they were loaded; whether a server
is asked for WatchLists (by its version, asked once; a refusal stays)."""

from __future__ import annotations

import asyncio
import json
import tempfile
from typing import Any

import pytest

from kubeindex.client.api import (
    JSON,
    ApiClient,
    connection_from_kubeconfig,
    load_connection,
)
from localkube.cluster import LocalCluster

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor


def test_version_asked_once_and_never_clears_a_refusal(cluster: LocalCluster) -> None:
    """The reflectors start together: one GET /version for all of them, and a 422 that another
    reflector records while it is asked stays recorded (the server's version, new enough, once
    overwrote it, and the next reflector tried a WatchList again and logged a second refusal)."""

    class SlowVersion(ApiClient):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            self.asked, self.answer = 0, asyncio.Event()

        async def get(self, path: str, params: dict[str, str] | None = None, accept: str = JSON,
                      timeout: float = 60) -> bytes:
            if path == "/version":
                self.asked += 1
                await self.answer.wait()
            return await super().get(path, params, accept, timeout)

    async def run() -> None:
        async with SlowVersion(load_connection(str(cluster.kubeconfig))) as api:
            askers = [asyncio.create_task(api.auto_initial_list()) for _ in range(5)]
            await asyncio.sleep(0.1)
            api.watch_list_refused = "422: the WatchList feature gate is off"  # another reflector's 422
            api.answer.set()
            assert await asyncio.gather(*askers) == ["list"] * 5
            assert api.asked == 1
            assert api.watch_list_refused == "422: the WatchList feature gate is off"
            assert await api.auto_initial_list() == "list" and api.asked == 1

    asyncio.run(run())


def test_a_member_kubeconfig_connects_without_writing_a_file(cluster: LocalCluster,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet hub's pod has a read-only disk: the CA, the client certificate and its key of a
    kubeconfig from a Secret are loaded from memory (no temporary directory usable here)."""
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent/tmp")
    connection = connection_from_kubeconfig(cluster.inline_kubeconfig(), "member a")

    async def version() -> dict[str, Any]:
        async with ApiClient(connection) as api:
            return json.loads(await api.get("/version"))

    assert asyncio.run(version())["major"] == "1"
