"""What both halves of test_wheel (tests/unit and tests/cluster) use."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from localkube.build import cache_root
from tests.paths import ROOT

# Dependencies are downloaded once and kept beside the control plane binaries: later runs install offline.
WHEELS = cache_root() / "wheels"


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--quiet", *args], check=True)


def clean_env() -> dict[str, str]:
    """The environment without anything that would let the checkout or the test's packages in."""
    drop = {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONNOUSERSITE": "1"}


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # A copy without build/ or *.egg-info leftovers, which setuptools would otherwise reuse.
    src = tmp_path_factory.mktemp("src") / "checkout"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__"))
    out = tmp_path_factory.mktemp("dist")
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(src))
    (built,) = out.glob("node_workload_summary-*.whl")
    return built


@pytest.fixture(scope="session")
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
