"""What a release is made of, checked where it cannot run: the GitHub Actions workflows (linted by
the real actionlint), the one version, the license and the changelog."""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest
import yaml

import deploy.image
from localkube.build import ACTIONLINT, ensure_binaries
from tests.paths import ROOT

pytestmark = pytest.mark.needs(ACTIONLINT)

WORKFLOWS = ROOT / ".github" / "workflows"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _steps(name: str) -> list[dict]:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def test_workflows_pass_actionlint() -> None:
    actionlint = ensure_binaries((ACTIONLINT,))["actionlint"]
    proc = subprocess.run([str(actionlint), "-color=false"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in WORKFLOWS.iterdir()) == ["ci.yaml", "release.yaml"]


def test_pull_requests_run_what_ci_runs() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "ci.yaml").read_text())
    assert "pull_request" in workflow[True]  # YAML 1.1 reads the key `on` as True
    runs = {name: [s["run"] for s in job["steps"] if "run" in s] for name, job in workflow["jobs"].items()}
    assert runs == {"test": ["bash .ci/run"], "compat": ["make compat COMPAT=${{ matrix.kubernetes }}"],
                    "kueue": ["make test-kueue-matrix KUEUE_CELL=${{ matrix.cell }}"]}


def test_release_builds_with_make_image_and_names_the_pushed_image_in_the_chart() -> None:
    runs = "\n".join(s.get("run", "") for s in _steps("release.yaml"))
    assert re.search(r"^make image IMAGE_ARGS=.*--platform linux/amd64,linux/arm64 --push", runs, re.M)
    assert runs.count("cosign sign --yes") == 2  # the image and the chart
    # Each line of the chart the release rewrites (the image, the runbooks' URL, home, sources, the
    # icon, Artifact Hub's image) is there to be rewritten (else the release stops).
    patterns = re.findall(r'"s\|(\^.*?)\|', runs)
    chart = "\n".join((ROOT / "charts/node-workload-summary" / name).read_text() for name in ("values.yaml",
                                                                                             "Chart.yaml"))
    assert len(patterns) == 6 and any("runbookBaseUrl" in p for p in patterns), patterns
    for pattern in patterns:
        assert re.search(pattern, chart, re.M), pattern


def test_one_version_license_and_changelog() -> None:
    chart = yaml.safe_load((ROOT / "charts/node-workload-summary/Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog and f"## [{VERSION}]" in changelog


@pytest.mark.parametrize(("origin", "label"), [
    ("git@github.com:example/nws.git", "https://github.com/example/nws"),
    ("https://user:secret-token@example.org/example/nws.git", "https://example.org/example/nws"),
    ("https://example.org/example/nws", "https://example.org/example/nws"),
    ("", ""),
])
def test_image_source_label_names_the_repository_never_its_credentials(monkeypatch: pytest.MonkeyPatch,
                                                                       origin: str, label: str) -> None:
    monkeypatch.setattr(deploy.image, "_git", lambda *args: origin)
    assert deploy.image.source() == label
