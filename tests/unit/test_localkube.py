"""The local control plane itself. Here, what needs no cluster; the scenarios against one:
tests/cluster/test_localkube.py."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from localkube.build import BuildError, ensure_binaries
from localkube.service import wait_for


def test_build_without_go_says_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no `go` here
    monkeypatch.setenv("NWS_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(BuildError, match=r"Go toolchain \('go'\) is not on PATH"):
        ensure_binaries()


def test_a_background_build_stops_at_once_with_its_compilers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """make test builds the tests' tools behind the first tests (--prebuild); a run that ends
    early stops that build at once: no binary, no compiler left running, no failure reported."""
    from localkube.build import ACTIONLINT, BackgroundBuild

    monkeypatch.setenv("NWS_CACHE_DIR", str(tmp_path))  # nothing cached: it has to build
    build = BackgroundBuild((ACTIONLINT,)).start()
    building = lambda: subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True).returncode == 0  # noqa: E731
    wait_for(building, timeout=60)
    started = time.monotonic()
    build.stop()
    assert time.monotonic() - started < 5
    wait_for(lambda: not building(), timeout=5)  # the go command and the compilers it started
    assert not list(tmp_path.glob("bin/*/actionlint")) and build.failed == []
