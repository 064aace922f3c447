"""Start and stop of the real `node-workload-summary` process. Here, what needs no cluster; the
scenarios against one: tests/cluster/test_startup.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from localkube.cluster import free_port
from node_workload_summary import main as service_main


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Run the service to its end; returns the exit code and the non-empty lines it printed."""
    proc = subprocess.run([sys.executable, "-m", "node_workload_summary.main", *args], capture_output=True,
                          text=True, timeout=30, env={**os.environ, **(env or {})})
    return proc.returncode, [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


def one_error(code: int, lines: list[str]) -> str:
    assert code == 1 and len(lines) == 1, (code, lines)
    assert " ERROR " in lines[0] and "Traceback" not in lines[0], lines
    return lines[0]


def test_an_unexpected_error_is_logged_with_its_traceback(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A bug must not hide behind one line: the exception's type and message, and where it came from."""
    async def broken(settings: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(service_main, "configure_logs", lambda *_: None)  # caplog's handler stays
    monkeypatch.setattr(service_main, "serve", broken)
    assert service_main.main(["--kubeconfig=/dev/null"]) == 1
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage() == "KeyError: 'a bug'"
    assert record.exc_info is not None and "in broken" in caplog.text


@pytest.fixture
def unreachable_kubeconfig(tmp_path: Path) -> Path:
    """A valid kubeconfig whose API server refuses connections: any watch started would say so."""
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return path


def test_port_in_use_is_one_line_naming_address_and_port(unreachable_kubeconfig: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code, lines = run(f"--kubeconfig={unreachable_kubeconfig}", "--listen-address=127.0.0.1", f"--port={port}")
    line = one_error(code, lines)  # and nothing from a watch: the port is bound before any starts
    assert line.endswith(f"cannot listen on 127.0.0.1:{port}: Address already in use (--listen-address, --port)")


@pytest.mark.parametrize(("address", "reason"), [
    ("300.1.1.1", "not an IP address or a known host name"),
    ("192.0.2.1", "Cannot assign requested address"),  # TEST-NET-1: on no interface here
])
def test_invalid_listen_address_is_one_line(unreachable_kubeconfig: Path, address: str, reason: str) -> None:
    code, lines = run(f"--kubeconfig={unreachable_kubeconfig}", f"--listen-address={address}", "--port=18080")
    assert f"cannot listen on {address}:18080: {reason}" in one_error(code, lines)


def test_probe_port_in_use_is_one_line_naming_it(unreachable_kubeconfig: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code, lines = run(f"--kubeconfig={unreachable_kubeconfig}", "--listen-address=127.0.0.1",
                          f"--port={free_port()}", f"--probe-port={port}")
    assert one_error(code, lines).endswith(f"cannot listen on 127.0.0.1:{port}: Address already in use "
                                           "(--listen-address, --probe-port)")


def test_unreadable_metrics_certificate_is_one_line_naming_the_files(unreachable_kubeconfig: Path) -> None:
    code, lines = run(f"--kubeconfig={unreachable_kubeconfig}", "--metrics-secure", f"--probe-port={free_port()}",
                      "--metrics-cert-file=/nonexistent/tls.crt", "--metrics-key-file=/nonexistent/tls.key")
    files = "--metrics-cert-file /nonexistent/tls.crt, --metrics-key-file /nonexistent/tls.key: "
    assert files in one_error(code, lines)


def test_missing_kubeconfig_flag_names_the_path() -> None:
    code, lines = run("--kubeconfig=/nonexistent/kc")
    assert one_error(code, lines).endswith("--kubeconfig /nonexistent/kc: no such file")


def test_missing_kubeconfig_variable_names_the_path() -> None:
    code, lines = run(env={"KUBECONFIG": "/nope/kc"})
    assert one_error(code, lines).endswith("$KUBECONFIG /nope/kc: no such file")


def test_no_configuration_at_all_names_every_source_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "NWS_KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    code, lines = run(env={"HOME": str(tmp_path)})
    assert one_error(code, lines).endswith(
        "no Kubernetes API configuration: tried --kubeconfig (not set), $KUBECONFIG (not set), in-cluster service "
        f"account ($KUBERNETES_SERVICE_HOST not set), {tmp_path}/.kube/config (no such file)")


def test_broken_kubeconfig_and_unknown_context_name_the_path(tmp_path: Path,
                                                             unreachable_kubeconfig: Path) -> None:
    broken = tmp_path / "broken"
    broken.write_text("clusters: [")
    code, lines = run(f"--kubeconfig={broken}")
    assert f"--kubeconfig {broken}: " in one_error(code, lines)
    code, lines = run(f"--kubeconfig={unreachable_kubeconfig}", "--context=nope")
    assert f"--kubeconfig {unreachable_kubeconfig}: " in one_error(code, lines)
    assert "nope" in lines[0]
