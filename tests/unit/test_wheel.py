"""The wheel is what `pip install node-workload-summary` and the image get. Here, what needs no
cluster; the scenarios against one: tests/cluster/test_wheel.py."""

from __future__ import annotations

import platform
import subprocess
import tomllib
import zipfile
from pathlib import Path

from tests.support.wheel import ROOT, clean_env

RUNTIME = ("node_workload_summary", "kubeindex", "exporter", "reconciler")


# What the checkout's tooling needs and the service must not: absent from the clean virtualenv.
TOOLING = ("grafanalib", "cryptography", "matplotlib", "localkube", "demo", "dashboards", "alerts", "bench")


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
