"""Shared fixtures: the local control plane (built from Go modules on first use) with the CRDs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localkube.build import ensure_binaries
from localkube.cluster import LocalCluster, Options, leftover_processes

ROOT = Path(__file__).resolve().parent.parent
CRDS = ROOT / "crds"
EXAMPLES = ROOT / "examples"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Any test that uses a cluster fixture is marked `cluster`, so `-m 'not cluster'` runs units only.
    for item in items:
        if {"cluster", "full_cluster", "binaries"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    left = leftover_processes()
    if left:
        print(f"\nERROR: control plane processes left behind: {left}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def binaries() -> dict[str, Path]:
    return ensure_binaries()


@pytest.fixture(scope="session")
def cluster(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """etcd + kube-apiserver with this project's CRDs installed."""
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        yield c
