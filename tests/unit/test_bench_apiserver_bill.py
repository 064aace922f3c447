"""bench/apiserver_bill.py's modes: an --initial-list mode, its encoding and its page size, read
into the service's flags; anything else refused before a cluster is built."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from bench.apiserver_bill import mode_name, service_argv


class Cluster:
    kubeconfig = Path("/k/kubeconfig")


def flags(mode: str) -> list[str]:
    cluster: Any = Cluster()
    return [a for a in service_argv(cluster, mode, 9000) if a.startswith(("--initial-list", "--encoding", "--page"))]


@pytest.mark.parametrize("mode, expected", [
    ("watchlist", ["--initial-list=watchlist", "--encoding=protobuf"]),
    ("list-json", ["--initial-list=list", "--encoding=json"]),
    ("list:20000", ["--initial-list=list", "--encoding=protobuf", "--page-size=20000"]),
    ("cache-json:500", ["--initial-list=cache", "--encoding=json", "--page-size=500"]),
])
def test_a_mode_is_the_services_flags(mode: str, expected: list[str]) -> None:
    assert mode_name(mode) == mode
    assert flags(mode) == expected


@pytest.mark.parametrize("mode", ["lists", "list:", "list:5k", "ksm:500", "watchlist-yaml"])
def test_other_words_are_refused(mode: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not a mode"):
        mode_name(mode)
