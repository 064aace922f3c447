"""The service's event loop keeps each connection to its owner: a scrape is never dropped, nor
answered with bytes meant for the API server, while TLS handshakes to the API server are reset."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.paths import ROOT


def test_reset_handshakes_never_touch_the_servers_connections() -> None:
    # Its own process: the defect this guards against (uvloop 0.23) can abort the process.
    proc = subprocess.run([sys.executable, "-m", "tests.loop_probe", "8"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["handshakes_reset"] > 500, result  # the client really had its handshakes reset
    assert set(result["scrapes"]) == {"ok"} and result["scrapes"]["ok"] > 500, result
