"""--version and nws_build_info name the revision: the image's (its build argument), else the
commit checked out where the package's sources are (an editable install from a clone), read from
.git as git would; a wheel has none. No cluster needed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from node_workload_summary import version
from node_workload_summary.version import REVISION_ENV, build_info, checkout_revision
from tests.paths import ROOT

A, B = "a" * 40, "0123456789abcdef0123456789abcdef01234567"


def git_dir(root: Path, head: str, refs: dict[str, str] | None = None, packed: str = "") -> Path:
    git = root / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text(head + "\n")
    for name, commit in (refs or {}).items():
        (git / name).parent.mkdir(parents=True, exist_ok=True)
        (git / name).write_text(commit + "\n")
    if packed:
        (git / "packed-refs").write_text(packed)
    return git


def test_a_branch_a_packed_ref_and_a_detached_head(tmp_path: Path) -> None:
    git_dir(tmp_path / "loose", "ref: refs/heads/main", {"refs/heads/main": A})
    assert checkout_revision(tmp_path / "loose") == A
    git_dir(tmp_path / "packed", "ref: refs/heads/main",
            packed=f"# pack-refs with: peeled fully-peeled sorted \n{B} refs/heads/main\n^{A}\n")
    assert checkout_revision(tmp_path / "packed") == B
    git_dir(tmp_path / "detached", B)
    assert checkout_revision(tmp_path / "detached") == B


def test_a_worktree_reads_its_own_head_and_the_common_refs(tmp_path: Path) -> None:
    main = git_dir(tmp_path / "main", "ref: refs/heads/main", {"refs/heads/main": A, "refs/heads/topic": B})
    own = main / "worktrees" / "topic"
    own.mkdir(parents=True)
    (own / "HEAD").write_text("ref: refs/heads/topic\n")
    (own / "commondir").write_text("../..\n")
    (tmp_path / "topic").mkdir()
    (tmp_path / "topic" / ".git").write_text(f"gitdir: {own}\n")
    assert checkout_revision(tmp_path / "topic") == B


@pytest.mark.parametrize("head", ["", "ref: refs/heads/gone", "not a commit"], ids=["empty", "unborn", "garbage"])
def test_nothing_readable_is_no_revision(tmp_path: Path, head: str) -> None:
    git_dir(tmp_path, head)
    assert checkout_revision(tmp_path) is None
    assert checkout_revision(tmp_path / "elsewhere") is None  # no .git at all: a wheel's site-packages


def test_build_info_prefers_the_images_revision(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    git_dir(tmp_path, A)
    monkeypatch.setattr(version, "CHECKOUT", tmp_path)
    monkeypatch.delenv(REVISION_ENV, raising=False)
    assert build_info().revision == checkout_revision(tmp_path) == A
    monkeypatch.setenv(REVISION_ENV, B)
    assert build_info().revision == B
    monkeypatch.setattr(version, "CHECKOUT", tmp_path / "elsewhere")
    monkeypatch.delenv(REVISION_ENV)
    assert build_info().revision == "unknown"


def test_version_in_this_clone_names_its_commit() -> None:
    """The installed command, as `make install` installs it (editable), run in this checkout."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    command = Path(sys.executable).parent / "node-workload-summary"
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}  # no NODE_WORKLOAD_SUMMARY_REVISION
    out = subprocess.run([str(command), "--version"], capture_output=True, text=True, check=True, env=env).stdout
    assert f"(revision {head}, Python " in out, out
