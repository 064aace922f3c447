"""kubeindex/client/api.py. Here, what needs no cluster; the scenarios against one:
tests/cluster/test_api.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.config.incluster_config import InClusterConfigLoader

from kubeindex.client.api import (
    ConfigError,
    Connection,
    connection_from_kubeconfig,
    predates_watch_list,
    serves_pages_from_cache,
)


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
