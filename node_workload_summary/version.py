"""What this build is: the installed package's version, the source revision it was built from,
and the Python running it (for --version and nws_build_info)."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from importlib import metadata

PACKAGE = "node-workload-summary"
# Set by the image build (Dockerfile ARG REVISION); a checkout or a plain wheel has none.
REVISION_ENV = "NODE_WORKLOAD_SUMMARY_REVISION"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class BuildInfo:
    version: str
    revision: str
    python: str

    def __str__(self) -> str:
        return f"{PACKAGE} {self.version} (revision {self.revision}, Python {self.python})"


def build_info() -> BuildInfo:
    try:
        version = metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:  # run from sources that were never installed
        version = UNKNOWN
    return BuildInfo(version, os.environ.get(REVISION_ENV) or UNKNOWN, platform.python_version())
