"""kubeindex/api.py without a cluster: the credentials a Connection sends, however they were loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.config.incluster_config import InClusterConfigLoader

from kubeindex.api import Connection


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
