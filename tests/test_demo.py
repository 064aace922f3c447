"""The README's main command, small and time-boxed: it starts, shows NodeSummaries and workloads,
its NotReady instructions work, its ClusterResourceClaim story plays (the gpu pool loses a node, the
claim shows the shortfall, the ClusterQueues' quota follows after the settle time), and it exits
leaving nothing behind."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from demo.claims import NOT_READY, commands, shown
from localkube.build import JOBSET_CONTROLLER, KUBERNETES_CONTROLLERS, KUEUE, KWOK, LWS_CONTROLLER, ensure_binaries
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


def _run(command: str) -> list[list[str]]:
    """A command line the demo printed, run as a shell would: its output's rows, split into columns."""
    proc = subprocess.run(shlex.split(command), check=True, capture_output=True, text=True)
    return [row.split() for row in proc.stdout.splitlines()]


def _outputs(step: str) -> dict[str, list[list[str]]]:
    """Each ``$ command`` of a story step -> its output's rows, split into columns."""
    blocks = [block.split("\n", 1) for block in re.split(r"^\$ ", step, flags=re.M)[1:]]
    return {command: [row.split() for row in output.splitlines() if row.strip()] for command, output in blocks}


def _story_checks(lines: list[tuple[float, str]], settle: float) -> None:
    """--quota-story on 2 gpu nodes of 32 cpu and 8 GPUs: claim gpu gives research 16 cpu and 6 GPUs,
    prod 50%; gpu-1 goes NotReady. Each step's real kubectl output, and the time between them."""
    out = "".join(line for _, line in lines)
    story = out[out.index("\n### claim gpu"):out.index("\nPress Ctrl-C")]
    steps = [_outputs(step) for step in re.split(r"^### ", story, flags=re.M)[1:]]
    assert len(steps) == 5, out
    c = commands(2)
    claims, quota, shortfall = shown(c.claims), shown(c.quota), shown(c.shortfall)
    assert steps[0][claims][1][:8] == ["gpu", "local", "gpu", "64", "16", "87%", "True", "AssignmentsFit"]
    assert steps[0][quota] == [["NAME", "CPU", "GPU"], ["prod", "32", "8"], ["research", "16", "6"]]
    assert steps[1] == {shown(c.lose): [["node/gpu-1", "labeled"]]} and c.lose[2:] == ("gpu-1", f"{NOT_READY}=true")
    # At once: CPU and GPU show the live capacity, the assignments still the settled one, the quota as it was.
    assert steps[2][claims][1][:8] == ["gpu", "local", "gpu", "32", "8", "87%", "True", "AssignmentsFit"]
    assert steps[2][quota] == steps[0][quota]
    # After the settle time: the shortfall (research's 6 and prod's 50% ask 10 GPUs of 8) ...
    assert steps[3][claims][1][:8] == ["gpu", "local", "gpu", "32", "8", "125%", "False", "OverAllocated"]
    short, message = steps[3][shortfall]
    assert short == ['{"nvidia.com/gpu":"2"}'] and " ".join(message).startswith(
        "nvidia.com/gpu short by 2 (assigned 10, capacity 8)"), steps[3]
    # ... and the quota followed: prod gets half the cpu left and the 2 GPUs that research's 6 leave.
    assert steps[4][quota] == [["NAME", "CPU", "GPU"], ["prod", "16", "2"], ["research", "16", "6"]]
    # Not before the settle time (the demo prints each line as it happens; pendingSince is kept to the second).
    labeled = next(t for t, line in lines if line.startswith("node/gpu-1 labeled"))
    settled = next(t for t, line in lines if line.startswith("### 2. after the settle time"))
    assert settled - labeled >= settle - 1, (settled - labeled, out)


def test_demo_runs_and_cleans_up(binaries: dict[str, Path]) -> None:
    ensure_binaries()
    ensure_binaries((*BUILD, KUEUE))  # the JobSet and LWS controllers: a cold build must not eat the demo's --duration
    settle = 5.0
    demo = subprocess.Popen([sys.executable, "-m", "demo", "--nodes-per-pool", "2", "--duration", "120",
                             "--quota-story", f"--quota-settle={settle:g}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timed: list[tuple[float, str]] = []
    try:
        assert demo.stdout is not None
        for line in demo.stdout:
            timed.append((time.monotonic(), line))
            if line.startswith("Press Ctrl-C"):
                break
        lines = [line for _, line in timed]
        out = "".join(lines)
        assert "Ready in" in out, out
        summaries = _group(r"\$ kubectl get nodesummaries\n(.*?)\n\n", out).splitlines()
        assert summaries[0].split()[:4] == ["NAME", "NODES", "READY", "NOT"]
        assert {row.split()[0] for row in summaries[1:]} == {"gke-nodepool-cpu", "gke-nodepool-gpu", "gke-nodepool-tpu"}
        workloads = _group(r"\$ kubectl get workloads.ux -A\n(.*?)\n\n", out).splitlines()
        names = {row.split()[1]: row.split()[3] for row in workloads[1:]}
        assert names == {"web": "deploy", "nightly-report": "job", "train": "js", "llm": "lws"}, workloads

        # The printed NotReady instruction: the whole gpu pool.
        not_ready = f"-l cloud.google.com/gke-nodepool=gpu {NOT_READY}=true"
        command = next(line.strip() for line in lines if not_ready in line)
        kubectl = command.split()[:3]

        # The ClusterResourceClaim story played. The commands printed for it are those it ran, and
        # show where it ended.
        _story_checks(timed, settle)
        assert f"--quota-actuation=on --quota-settle={settle:g}" in out
        lose, claims, _, queues = _group(r"\nTake 1 of the gpu pool's 2 nodes away.*?\n(  /.*?)\n\n", out).splitlines()
        assert lose.strip() == " ".join(kubectl) + f" label nodes gpu-1 {NOT_READY}=true"
        assert _run(claims)[1][:8] == ["gpu", "local", "gpu", "32", "8", "125%", "False", "OverAllocated"]
        assert _run(queues) == [["NAME", "CPU", "GPU"], ["prod", "16", "2"], ["research", "16", "6"]]

        # The printed NotReady instruction works: the gpu pool's NodeSummary shows it.
        subprocess.run(command.split(), check=True, capture_output=True)
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
