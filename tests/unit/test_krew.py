"""The krew plugin manifest of `kubectl nws` (deploy/krew.py), made as the release workflow makes it
and checked against krew's rules (no network: krew's validation, as sigs.k8s.io/krew's
internal/index/validation and pkg/index types define it, in deploy.krew.check)."""

from __future__ import annotations

import copy
import hashlib
import re
import shlex
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import krew
from tests.paths import ROOT

VERSION = krew.version()


def _release_command() -> list[str]:
    """The release workflow's `python3 -m deploy.krew ...`, its GitHub expressions filled in."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yaml").read_text())
    runs = "\n".join(s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"])
    match = re.search(r"^\s*python3 -m deploy\.krew (.*?)(?<!\\)$", runs, re.M | re.S)
    assert match, "the release workflow does not run python3 -m deploy.krew"
    text = match.group(1).replace("\\\n", " ")
    for expression, value in (("${{ steps.version.outputs.version }}", VERSION), ("${repo}", "https://github.com/o/r"),
                              ("${GITHUB_REF_NAME}", f"v{VERSION}")):
        text = text.replace(expression, value)
    return shlex.split(text)


@pytest.fixture
def made(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """The manifest and archive the release's command writes (with a stand-in wheel, whose bytes
    the manifest does not read)."""
    argv = _release_command()
    wheel = tmp_path / Path(argv[argv.index("--wheel") + 1]).name
    wheel.write_bytes(b"wheel")
    argv[argv.index("--wheel") + 1] = str(wheel)
    argv[argv.index("--out") + 1] = str(tmp_path / "dist")
    assert krew.main(argv) == 0
    return yaml.safe_load((tmp_path / "dist" / "nws.yaml").read_text()), tmp_path / "dist"


def test_the_release_writes_a_manifest_krew_accepts(made: tuple[dict[str, Any], Path]) -> None:
    manifest, dist = made
    assert krew.check(manifest, "nws.yaml") == []
    assert manifest["metadata"]["name"] == "nws" and manifest["spec"]["version"] == f"v{VERSION}"
    [archive] = dist.glob("*.tar.gz")
    assert archive.name == f"kubectl-nws-v{VERSION}.tar.gz"  # the name the release uploads
    [platform] = manifest["spec"]["platforms"]
    assert platform["uri"] == f"https://github.com/o/r/releases/download/v{VERSION}/{archive.name}"
    assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
        launcher = tar.extractfile(members[platform["bin"]])
        assert launcher is not None and launcher.read().startswith(b"#!/bin/sh\n")
    assert members[platform["bin"]].mode == 0o755
    assert set(members) == {"kubectl-nws", f"node_workload_summary-{VERSION}-py3-none-any.whl", "LICENSE"}
    assert krew.archive(dist.parent / f"node_workload_summary-{VERSION}-py3-none-any.whl", dist).read_bytes() == \
        archive.read_bytes()  # reproducible: the same bytes, the same sha256


@pytest.mark.parametrize(("change", "says"), [
    (lambda m: m.update(apiVersion="krew.googlecontainertools.github.com/v1alpha1"), "apiVersion"),
    (lambda m: m.update(kind="Plugins"), "kind"),
    (lambda m: m["metadata"].update(name="other"), "metadata.name must be 'nws'"),
    (lambda m: m["spec"].update(shortDescription=""), "shortDescription is required"),
    (lambda m: m["spec"].update(shortDescription="two\nlines"), "one line"),
    (lambda m: m["spec"].update(version="0.1.0"), "semantic version"),
    (lambda m: m["spec"].update(platforms=[]), "at least one platform"),
    (lambda m: m["spec"]["platforms"][0].update(sha256="ABC"), "sha256"),
    (lambda m: m["spec"]["platforms"][0].pop("uri"), "uri is required"),
    (lambda m: m["spec"]["platforms"][0].pop("bin"), "bin is required"),
    (lambda m: m["spec"]["platforms"][0].update(files=[]), "files must be absent or not empty"),
    (lambda m: m["spec"]["platforms"][0]["files"].append({"from": "x"}), "needs from and to"),
    (lambda m: m["spec"]["platforms"][0].pop("selector"), "selector is required"),
    (lambda m: m["spec"]["platforms"][0].update(selector={"matchLabels": {"distro": "x"}}), "'distro' not supported"),
    (lambda m: m["spec"]["platforms"][0]["selector"]["matchExpressions"][0].update(operator="Equals"), "operator"),
    (lambda m: m["spec"].update(icon="x"), "unknown field 'icon'"),
    (lambda m: m["spec"]["platforms"][0].update(sha="x"), "unknown field 'sha'"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_check_refuses_what_krew_refuses(made: tuple[dict[str, Any], Path], change: Any, says: str) -> None:
    manifest = copy.deepcopy(made[0])
    change(manifest)
    problems = krew.check(manifest, "nws.yaml")
    assert any(says in p for p in problems), problems


def test_a_plugin_name_krew_refuses() -> None:
    assert any("not allowed" in p for p in krew.check({"metadata": {"name": "a b"}}, "a b.yaml"))
    assert any("not allowed" in p for p in krew.check({"metadata": {"name": "con"}}, "con.yaml"))
