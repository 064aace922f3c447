"""The wheel is what `pip install node-workload-summary` and the image get: the service alone. It is
built from a copy of the checkout, installed into a clean virtualenv without extras, and the service
runs from there against the local control plane."""

from __future__ import annotations

import platform
import signal
import subprocess
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from localkube.cluster import LocalCluster, free_port, set_parent_death_signal
from localkube.service import wait_for
from tests.support.wheel import ROOT, clean_env


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)


@pytest.fixture
def service(runtime: Path, cluster: LocalCluster, tmp_path: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    port = free_port()
    log = tmp_path / "service.log"
    with log.open("w") as out:
        # A lease of its own: one left behind by a kill cannot delay the other tests' services.
        proc = subprocess.Popen(
            [str(runtime / "node-workload-summary"), f"--kubeconfig={cluster.kubeconfig}",
             "--listen-address=127.0.0.1", f"--port={port}", "--lease-name=nws-wheel-test"],
            stdout=out, stderr=subprocess.STDOUT, env=clean_env(), cwd=tmp_path,
            preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL))
    try:
        yield port, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        print(log.read_text())


def test_service_from_the_wheel_serves_readyz_and_metrics(service: tuple[int, subprocess.Popen[bytes]]) -> None:
    port, proc = service
    wait_for(lambda: proc.poll() is not None or get(port, "/readyz")[0] == 200, timeout=60)
    assert proc.poll() is None, f"exited with {proc.returncode}"
    code, text = get(port, "/metrics")
    assert code == 200, text
    assert "nws_watch_synced" in text
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    python = platform.python_version()
    assert f'nws_build_info{{version="{version}",revision="unknown",python="{python}"}} 1' in text
