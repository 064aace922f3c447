"""What this build is: the installed package's version, the source revision it was built from,
and the Python running it (for --version and nws_build_info)."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

PACKAGE = "node-workload-summary"
# Set by the image build (Dockerfile ARG REVISION); a plain wheel has none.
REVISION_ENV = "NODE_WORKLOAD_SUMMARY_REVISION"
UNKNOWN = "unknown"
# The checkout this package's sources sit in, if any: an editable install (`make install`) or the
# sources run in place. Installed from a wheel, the package's parent is site-packages: no .git.
CHECKOUT = Path(__file__).resolve().parent.parent
COMMIT = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")  # SHA-1, or SHA-256 in a repository that uses it


@dataclass(frozen=True)
class BuildInfo:
    version: str
    revision: str
    python: str

    def __str__(self) -> str:
        return f"{PACKAGE} {self.version} (revision {self.revision}, Python {self.python})"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def checkout_revision(root: Path) -> str | None:
    """The commit checked out in ``root``, read from its .git as git would, without running git:
    HEAD, the branch it names (a loose ref, else packed-refs), a worktree's or submodule's .git
    file and its common directory. None outside a checkout or when it cannot be read. Changes not
    committed do not show."""
    git = root / ".git"
    if git.is_file():  # a worktree or a submodule: "gitdir: <path>"
        pointer = _read(git) or ""
        if not pointer.startswith("gitdir: "):
            return None
        git = root / pointer.removeprefix("gitdir: ").strip()
    head = _read(git / "HEAD")
    if head is None:
        return None
    common = git / (_read(git / "commondir") or ".")
    seen = 0
    while head.startswith("ref: ") and seen < 5:  # a symbolic ref, possibly to another
        ref, seen = head.removeprefix("ref: ").strip(), seen + 1
        head = _read(git / ref) or _read(common / ref) or _packed(common, ref) or ""
    return head if COMMIT.fullmatch(head) else None


def _packed(common: Path, ref: str) -> str | None:
    for line in (_read(common / "packed-refs") or "").splitlines():
        commit, _, name = line.partition(" ")
        if name == ref:
            return commit
    return None


def build_info() -> BuildInfo:
    try:
        version = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:  # run from sources that were never installed
        version = UNKNOWN
    revision = os.environ.get(REVISION_ENV) or checkout_revision(CHECKOUT) or UNKNOWN
    return BuildInfo(version, revision, platform.python_version())
