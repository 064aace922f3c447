"""kubeindex/client/api.py: the credentials a Connection sends, however they were loaded; whether a server
is asked for WatchLists (by its version, asked once; a refusal stays)."""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.config.incluster_config import InClusterConfigLoader

from kubeindex.client.api import (
    JSON,
    ApiClient,
    ConfigError,
    Connection,
    connection_from_kubeconfig,
    load_connection,
    predates_watch_list,
    serves_pages_from_cache,
)
from localkube.cluster import LocalCluster

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor


def _in_cluster(tmp_path: Path, token: str) -> client.Configuration:
    (tmp_path / "token").write_text(token)
    (tmp_path / "ca.crt").write_text("not parsed here")
    config = client.Configuration()
    InClusterConfigLoader(token_filename=str(tmp_path / "token"), cert_filename=str(tmp_path / "ca.crt"),
                          environ={"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"},
                          ).load_and_set(config)
    return config


def test_in_cluster_token_is_sent_once_with_one_scheme(tmp_path: Path) -> None:
    """The in-cluster loader keeps "bearer <token>": sent as is, with "Bearer " added again, every
    request a pod made was refused with 401."""
    connection = Connection("https://10.0.0.1:443", False, _in_cluster(tmp_path, "eyJ.token"))
    assert connection.headers() == {"Authorization": "Bearer eyJ.token"}


@pytest.mark.parametrize("stored", ["abc", "Bearer abc", "bearer abc", "BEARER  abc ", " abc\n"])
def test_every_spelling_of_a_token_becomes_one_bearer_header(stored: str) -> None:
    config = client.Configuration()
    config.api_key["authorization"] = stored
    assert Connection("https://h", False, config).headers() == {"Authorization": "Bearer abc"}


def test_no_token_no_header() -> None:
    assert Connection("https://h", False, client.Configuration()).headers() == {}


# -- WatchList or not --------------------------------------------------------------------------------

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



@pytest.mark.parametrize(("version", "why"), [
    ({"major": "1", "minor": "36", "gitVersion": "v1.36.3"}, ""),
    ({"major": "1", "minor": "27", "gitVersion": "v1.27.0"}, ""),
    ({"major": "1", "minor": "26+", "gitVersion": "v1.26.15"}, "the API server is v1.26.15, older than 1.27"),
    ({"major": "1", "minor": "25"}, "the API server is 1.25, older than 1.27"),
    ({"major": "2", "minor": "0"}, ""),
])
def test_servers_before_watch_list_are_not_asked_for_one(version: dict[str, str], why: str) -> None:
    """A server before 1.27 ignores sendInitialEvents and would never end the initial state."""
    assert predates_watch_list(version) == why


@pytest.mark.parametrize(("version", "from_cache"), [
    ({"major": "1", "minor": "36"}, True), ({"major": "1", "minor": "34+"}, True),  # + : a managed build
    ({"major": "1", "minor": "33"}, False), ({"major": "1", "minor": "9"}, False), ({"major": "2", "minor": "0"}, True),
    ({}, False),
])
def test_pages_come_from_the_watch_cache_from_1_34(version: dict[str, str], from_cache: bool) -> None:
    """ListFromCacheSnapshot: every page of a paged LIST from the watch cache, so auto lists in
    pages of 20,000 there (the WatchList elsewhere)."""
    assert serves_pages_from_cache(version) is from_cache


def test_a_kubeconfig_from_a_secret_carries_its_credentials_inline() -> None:
    """A member's kubeconfig, read from a Secret, may not make the hub run a command or read a file."""
    def config(cluster: dict[str, Any], user: dict[str, Any]) -> str:
        return json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "m",
                           "clusters": [{"name": "m", "cluster": {"server": "https://10.0.0.1:6443", **cluster}}],
                           "users": [{"name": "u", "user": user}],
                           "contexts": [{"name": "m", "context": {"cluster": "m", "user": "u"}}]})

    ok = connection_from_kubeconfig(config({"insecure-skip-tls-verify": True}, {"token": "abc"}), "member a")
    assert ok.host == "https://10.0.0.1:6443" and ok.headers() == {"Authorization": "Bearer abc"}
    for cluster, user, named in (
            ({}, {"exec": {"command": "sh", "apiVersion": "client.authentication.k8s.io/v1"}}, "users[0].user.exec"),
            ({}, {"tokenFile": "/var/run/secrets/token"}, "users[0].user.tokenFile"),
            ({"certificate-authority": "/etc/ca.crt"}, {"token": "t"}, "clusters[0].cluster.certificate-authority"),
            ({}, {"client-certificate": "/c", "client-key": "/k"}, "users[0].user.client-certificate")):
        with pytest.raises(ConfigError, match=rf"member a: .*{re.escape(named)}.* not allowed"):
            connection_from_kubeconfig(config(cluster, user), "member a")
    with pytest.raises(ConfigError, match="member a: not a kubeconfig"):
        connection_from_kubeconfig("just text", "member a")


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
