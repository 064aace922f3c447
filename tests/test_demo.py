"""The README's main command, small and time-boxed: it starts, shows NodeSummaries and workloads,
its NotReady instructions work, and it exits leaving nothing behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localkube.build import JOBSET_CONTROLLER, KUBERNETES_CONTROLLERS, KWOK, LWS_CONTROLLER, ensure_binaries
from localkube.controllers import BUILD
from localkube.service import wait_for
from tests.paths import ROOT

pytestmark = pytest.mark.needs(KUBERNETES_CONTROLLERS, KWOK, JOBSET_CONTROLLER, LWS_CONTROLLER)


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline:
                found.append(cmdline[:160])
    return found


def _group(pattern: str, text: str) -> str:
    """Group 1 of ``pattern``'s first match in ``text`` (``.`` matches newlines too)."""
    match = re.search(pattern, text, re.S)
    assert match is not None, text
    return match.group(1)


def test_demo_runs_and_cleans_up(binaries: dict[str, Path]) -> None:
    ensure_binaries()
    ensure_binaries(BUILD)  # the JobSet and LWS controllers: a cold build must not eat the demo's --duration
    demo = subprocess.Popen([sys.executable, "-m", "demo", "--nodes-per-pool", "2", "--duration", "90"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        out = "".join(lines)
        assert "Ready in" in out, out
        summaries = _group(r"\$ kubectl get nodesummaries\n(.*?)\n\n", out).splitlines()
        assert summaries[0].split()[:4] == ["NAME", "NODES", "READY", "NOT"]
        assert {row.split()[0] for row in summaries[1:]} == {"gke-nodepool-cpu", "gke-nodepool-gpu", "gke-nodepool-tpu"}
        workloads = _group(r"\$ kubectl get workloads.ux -A\n(.*?)\n\n", out).splitlines()
        names = {row.split()[1]: row.split()[3] for row in workloads[1:]}
        assert names == {"web": "deploy", "nightly-report": "job", "train": "js", "llm": "lws"}, workloads

        # The printed NotReady instruction works: the gpu pool's NodeSummary shows it.
        command = next(line.strip() for line in lines if "node-not-ready.stage.kwok.x-k8s.io=true" in line)
        subprocess.run(command.split(), check=True, capture_output=True)
        kubectl = command.split()[:3]
        wait_for(lambda: subprocess.run([*kubectl, "get", "nodesummary", "gke-nodepool-gpu", "-o",
                                         "jsonpath={.status.conditions[?(@.type=='NotReady')].count}"],
                                        capture_output=True, text=True).stdout == "2", timeout=30)
        workdir = _group(r"export KUBECONFIG=(\S+)/kubeconfig", out)
        assert _processes_mentioning(workdir)  # the demo's control plane is running

        demo.send_signal(2)  # Ctrl-C
        demo.wait(timeout=60)
        assert demo.returncode == 0
        time.sleep(0.5)
        assert _processes_mentioning(workdir) == []
        assert not Path(workdir).exists()
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


@pytest.mark.node
def test_demo_with_pods_runs_the_chart_on_a_real_node(binaries: dict[str, Path]) -> None:
    """`python -m demo --pods`: the service as the chart's two pods, scraped by Prometheus over HTTPS."""
    ensure_binaries(BUILD)
    proc = subprocess.run([sys.executable, "-m", "demo", "--pods", "--nodes-per-pool", "1", "--duration", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The chart's Deployment is a workload too: its two pods ran.
    assert re.search(r"^node-workload-summary\s+node-workload-summary\s+2\s+deploy\b", proc.stdout, re.M), proc.stdout
    assert "curl -sk -H \"Authorization: Bearer" in proc.stdout and "https://10.88.0." in proc.stdout
    assert not _processes_mentioning("/node/etc/containerd/config.toml")  # the node is gone
