"""The wheel is what `pip install node-workload-summary` and the image get: the service alone. It is
built from a copy of the checkout, installed into a clean virtualenv without extras, and the service
runs from there against the local control plane."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tarfile
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from localkube.cluster import LocalCluster, free_port, set_parent_death_signal
from localkube.service import wait_for
from tests.support.wheel import ROOT, WHEELS, clean_env


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


def test_kubectl_nws_from_the_wheel_and_from_the_krew_archive(wheel: Path, runtime: Path, cluster: LocalCluster,
                                                              tmp_path: Path) -> None:
    """`kubectl nws` as kubectl finds it: the wheel's console script, and the krew archive's launcher
    (installed the way krew installs it: unpacked into its store, linked from its bin/), which makes
    its virtual environment on first use (pip offline here, from the wheels the runtime took)."""
    from deploy import krew

    def kubectl_nws(path_dir: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(cluster.kubectl_path), "nws", "pools", "-o", "name",
                               f"--kubeconfig={cluster.kubeconfig}"], capture_output=True, text=True, timeout=300,
                              env={**clean_env(), "PATH": f"{path_dir}{os.pathsep}{os.environ['PATH']}", **(env or {})},
                              cwd=tmp_path)

    cluster.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "ux.sean.example.com/v1alpha1", "kind": "NodeSummary", "metadata": {"name": "krew-pool"},
        "spec": {"selector": {"matchLabels": {"pool": "krew"}}}}))
    assert (runtime / "kubectl-nws").exists()
    from_wheel = kubectl_nws(runtime)
    assert from_wheel.returncode == 0, from_wheel.stderr
    assert "nodesummary.ux.sean.example.com/krew-pool" in from_wheel.stdout.split()

    store, bin_dir = tmp_path / "krew" / "store" / "nws" / "v0", tmp_path / "krew" / "bin"
    store.mkdir(parents=True)
    bin_dir.mkdir()
    with tarfile.open(krew.archive(wheel, tmp_path)) as tar:
        tar.extractall(store, filter="data")
    (bin_dir / "kubectl-nws").symlink_to(store / "kubectl-nws")
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELS), "NWS_PYTHON": sys.executable}
    first = kubectl_nws(bin_dir, offline)
    assert first.returncode == 0, first.stderr
    assert "installing into" in first.stderr and (store / "venv" / ".installed").exists()
    again = kubectl_nws(bin_dir, offline)
    assert again.returncode == 0 and "installing" not in again.stderr, again.stderr
    assert again.stdout == first.stdout == from_wheel.stdout
