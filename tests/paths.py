"""Where the checkout's files are, for tests that read or apply them."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CRDS = ROOT / "crds"
EXAMPLES = ROOT / "examples"
# Where a failed test's (or soak's) component logs are kept: a cluster's working directory goes at
# its end.
FAILED_LOGS = ROOT / ".test-logs"
