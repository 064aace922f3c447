"""The wheel is what `pip install node-workload-summary` and the image get: the service alone. It is
built from a copy of the checkout, installed into a clean virtualenv without extras, and the service
runs from there against the local control plane."""

from __future__ import annotations

import os
import platform
import shutil
import signal
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from localkube.build import cache_root
from localkube.cluster import LocalCluster, free_port, set_parent_death_signal
from localkube.service import wait_for

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ("node_workload_summary", "kubeindex", "exporter", "reconciler")
# What the checkout's tooling needs and the service must not: absent from the clean virtualenv.
TOOLING = ("grafanalib", "cryptography", "matplotlib", "localkube", "demo", "dashboards", "alerts", "bench")
# Dependencies are downloaded once and kept beside the control plane binaries: later runs install offline.
WHEELS = cache_root() / "wheels"


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--quiet", *args], check=True)


def clean_env() -> dict[str, str]:
    """The environment without anything that would let the checkout or the test's packages in."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONNOUSERSITE": "1"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A copy without build/ or *.egg-info leftovers, which setuptools would otherwise reuse.
    src = tmp_path_factory.mktemp("src") / "checkout"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(src))
    (built,) = out.glob("node_workload_summary-*.whl")
    return built


@pytest.fixture(scope="module")
def runtime(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv holding the wheel and its dependencies only; returns its bin/."""
    env = tmp_path_factory.mktemp("runtime") / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    install = ("--python", str(python), "install", "--no-compile", "--no-index", "--find-links", str(WHEELS),
               str(wheel))
    try:
        pip(*install)
    except subprocess.CalledProcessError:  # first run, or a dependency changed: fetch what is missing
        WHEELS.mkdir(parents=True, exist_ok=True)
        pip("download", "--dest", str(WHEELS), str(wheel))
        (WHEELS / wheel.name).unlink(missing_ok=True)  # the wheel under test is never taken from the cache
        pip(*install)
    return env / "bin"


def test_wheel_holds_the_runtime_packages_and_requires_no_tooling(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        top = {name.split("/")[0] for name in whl.namelist()}
        (metadata,) = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [line for line in whl.read(metadata).decode().splitlines() if line.startswith("Requires-Dist:")]
    assert top - {metadata.split("/")[0]} == set(RUNTIME)
    unconditional = [r for r in requires if "extra ==" not in r]
    # PyYAML is the service's own (member clusters' kubeconfigs); it also comes with the kubernetes client.
    assert not [r for r in unconditional if any(t in r.lower() for t in ("grafanalib", "cryptography",
                                                                           "matplotlib"))], unconditional


def test_runtime_modules_import_from_the_clean_virtualenv_alone(runtime: Path) -> None:
    # -I: no current directory, no PYTHON* variables, no user site-packages; only the virtualenv.
    script = f"""
import importlib, importlib.util, pkgutil
runtime, tooling = {RUNTIME!r}, {TOOLING!r}
for name in runtime:
    package = importlib.import_module(name)
    assert package.__file__.startswith({str(runtime.parent)!r}), package.__file__
    for module in pkgutil.walk_packages(package.__path__, name + "."):
        importlib.import_module(module.name)
print([name for name in tooling if importlib.util.find_spec(name) is not None])
"""
    proc = subprocess.run([str(runtime / "python"), "-I", "-c", script], capture_output=True, text=True,
                          env=clean_env(), cwd=runtime)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_help_from_the_wheel(runtime: Path, tmp_path: Path) -> None:
    proc = subprocess.run([str(runtime / "node-workload-summary"), "--help"], capture_output=True, text=True,
                          env=clean_env(), cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--kubeconfig" in proc.stdout and "NWS_KUBECONFIG" in proc.stdout


def test_version_is_the_packages(runtime: Path, tmp_path: Path) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    proc = subprocess.run([str(runtime / "node-workload-summary"), "--version"], capture_output=True, text=True,
                          env={**clean_env(), "NODE_WORKLOAD_SUMMARY_REVISION": "abc123"}, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"node-workload-summary {version} (revision abc123, Python {platform.python_version()})\n"


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
