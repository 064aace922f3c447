"""matplotlib for the bench reports, when installed (the `bench` extra): plots are optional."""

from __future__ import annotations

import sys
from types import ModuleType


def pyplot() -> ModuleType | None:
    """matplotlib.pyplot on the file-only Agg backend, or None (said once per call) without it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench] matplotlib not installed (pip install '.[bench]'): no plot", file=sys.stderr, flush=True)
        return None
    return plt
