"""A real Alertmanager (Debian's `prometheus-alertmanager` package, installed by `make tools`) on
loopback, with no cluster peers: for the tests of routing and inhibition."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from .cluster import ClusterError, Process, free_port, wait_until
from .prometheus import http_get

# Debian names the binary after its package; upstream's release archives call it alertmanager.
BINARIES = ("prometheus-alertmanager", "alertmanager")


class Alertmanager:
    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.workdir = workdir
        self.config = config  # alertmanager.yml: route, receivers, inhibit_rules
        self.port = 0
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> Alertmanager:
        binary = next((path for name in BINARIES if (path := shutil.which(name))), None)
        if binary is None:
            raise ClusterError("alertmanager is not installed: run `make tools` (Debian's prometheus-alertmanager)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "alertmanager.yml").write_text(yaml.safe_dump(self.config))
        self.port = free_port()
        self.process = Process("alertmanager", [
            binary, f"--config.file={self.workdir / 'alertmanager.yml'}",
            f"--storage.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # alone: no gossip port, no peers
            "--log.level=warn",
        ], self.workdir)
        self.process.start()
        wait_until("alertmanager /-/ready", lambda: self._get("/-/ready")[0] == 200, timeout, [self.process])
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def _get(self, path: str) -> tuple[int, bytes]:
        return http_get(self.url + path)

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert it holds (API v2), each with ``labels`` and ``status``: ``state`` active or
        suppressed, and ``inhibitedBy``, the fingerprints of the alerts that mute it."""
        code, body = self._get("/api/v2/alerts")
        if code != 200:
            raise ClusterError(f"alertmanager /api/v2/alerts: HTTP {code}: {body[:200]!r}")
        alerts: list[dict[str, Any]] = json.loads(body)
        return alerts
