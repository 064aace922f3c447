"""The README's main command, time-boxed: it starts, shows NodeSummaries and workloads, its
ClusterResourceClaim story plays (the gpu pool loses half its nodes, the claim shows the shortfall,
the ClusterQueues' quota follows after the settle time), every command block it prints works pasted
into a fresh shell, its printout is the one README.md and docs/localkube.md show (modulo seconds,
ports and paths), and it exits leaving nothing behind but its logs, where it said."""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from demo import printout
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
    """--quota-story on the demo's 4 gpu nodes of 32 cpu and 8 GPUs: claim gpu gives research 32 cpu
    and 12 GPUs, prod 50%; gpu-2 and gpu-3 go NotReady. Each step's real kubectl output (docs/kueue.md
    shows the same), and the time between them."""
    out = "".join(line for _, line in lines)
    story = out[out.index("\n### claim gpu"):out.index("\nPress Ctrl-C")]
    steps = [_outputs(step) for step in re.split(r"^### ", story, flags=re.M)[1:]]
    assert len(steps) == 5, out
    c = commands(4)
    claims, quota, shortfall = shown(c.claims), shown(c.quota), shown(c.shortfall)
    assert steps[0][claims][1][:8] == ["gpu", "local", "gpu", "128", "32", "87%", "True", "AssignmentsFit"]
    assert steps[0][quota] == [["NAME", "CPU", "GPU"], ["prod", "64", "16"], ["research", "32", "12"]]
    assert steps[1] == {shown(c.lose): [["node/gpu-2", "labeled"], ["node/gpu-3", "labeled"]]}
    assert c.lose[2:] == ("gpu-2", "gpu-3", f"{NOT_READY}=true")
    # At once: CPU and GPU show the live capacity, the assignments still the settled one, the quota as it was.
    assert steps[2][claims][1][:8] == ["gpu", "local", "gpu", "64", "16", "87%", "True", "AssignmentsFit"]
    assert steps[2][quota] == steps[0][quota]
    # After the settle time: the shortfall (research's 12 and prod's 50% ask 20 GPUs of 16) ...
    assert steps[3][claims][1][:8] == ["gpu", "local", "gpu", "64", "16", "125%", "False", "OverAllocated"]
    short, message = steps[3][shortfall]
    assert short == ['{"nvidia.com/gpu":"4"}'] and " ".join(message).startswith(
        "nvidia.com/gpu short by 4 (assigned 20, capacity 16)"), steps[3]
    # ... and the quota followed: prod gets half the cpu left and the 4 GPUs that research's 12 leave.
    assert steps[4][quota] == [["NAME", "CPU", "GPU"], ["prod", "32", "4"], ["research", "32", "12"]]
    # Not before the settle time (the demo prints each line as it happens; pendingSince is kept to the second).
    labeled = next(t for t, line in lines if line.startswith("node/gpu-2 labeled"))
    settled = next(t for t, line in lines if line.startswith("### 2. after the settle time"))
    assert settled - labeled >= settle - 1, (settled - labeled, out)


def _command_blocks(out: str) -> list[str]:
    """The command blocks the demo printed: each run of indented lines (tables and story are not)."""
    return [block.replace("\n  ", "\n").strip() for block in re.findall(r"(?:^  \S.*\n)+", out, re.M)]


def _fresh_shell(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` pasted into a fresh shell: `env -i`, HOME and the system's PATH, nothing else."""
    return subprocess.run(["env", "-i", f"HOME={Path.home()}", "PATH=/usr/bin:/bin", "bash", "-euo", "pipefail",
                           "-c", script], capture_output=True, text=True, timeout=60)


WORKLOADS = ("nightly-report", "train", "llm", "web")  # the demo's root workloads, by their pods' names
Alert = tuple[str, str, str]  # (alertname, severity, what it is about)


def _about(labels: dict[str, str]) -> str:
    return next((labels[k] for k in ("group", "workload", "claim", "flavor") if k in labels), "")


def _alerts(prometheus: str) -> set[tuple[str, str, str, str]]:
    """Every alert pending or firing in the demo's Prometheus, with its state."""
    with urllib.request.urlopen(f"{prometheus}/api/v1/alerts", timeout=5) as response:
        alerts = json.load(response)["data"]["alerts"]
    return {(a["labels"]["alertname"], a["labels"]["severity"], _about(a["labels"]), a["state"]) for a in alerts}


def _hurt_workloads(kubectl: list[str], unhealthy_nodes: set[str]) -> set[Alert]:
    """WorkloadOnUnhealthyNodes as a person would work it out from the pods: a warning for each
    workload with an unfinished pod on those nodes, a critical one where that is at least half of
    its unfinished pods (the rules' default fraction)."""
    pods = json.loads(subprocess.run([*kubectl, "get", "pods", "-n", "demo", "-o", "json"], check=True,
                                     capture_output=True, text=True).stdout)["items"]
    on, of = dict.fromkeys(WORKLOADS, 0), dict.fromkeys(WORKLOADS, 0)
    for pod in pods:
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            continue  # finished: holds no node
        name = pod["metadata"]["name"]
        workload = next(w for w in WORKLOADS if name == w or name.startswith(f"{w}-"))
        of[workload] += 1
        on[workload] += pod["spec"].get("nodeName") in unhealthy_nodes
    return ({("WorkloadOnUnhealthyNodes", "warning", w) for w in WORKLOADS if on[w]}
            | {("WorkloadOnUnhealthyNodes", "critical", w) for w in WORKLOADS if on[w] and on[w] >= 0.5 * of[w]})


def _story_alerts(prometheus: str, want: set[Alert], story: str) -> None:
    """The demo's Prometheus (its rules' `for`: --alerts-after, 5 s here) fires exactly ``want``, nothing else pending,
    and holds it for 5 s. Printed, for docs/runbooks.md's "The demo's stories and their alerts"."""
    expected = {(*a, "firing") for a in want}
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(AssertionError):
            wait_for(lambda: _alerts(prometheus) == expected, timeout=max(0.1, deadline - time.monotonic()),
                     interval=0.5)
        held = time.monotonic() + 5
        while time.monotonic() < held and _alerts(prometheus) == expected:
            time.sleep(0.5)
        if _alerts(prometheus) == expected or time.monotonic() > deadline:
            break
    assert _alerts(prometheus) == expected, story
    print(f"\n{story}:", *(f"  {name} {severity} {about}" for name, severity, about in sorted(want)), sep="\n")


def test_demo_runs_and_cleans_up(binaries: dict[str, Path]) -> None:
    """The demo as `make demo` runs it (4 nodes per pool), with --quota-story, alerts after 5 s in
    place of 30 and a settle time of 5 s in place of 20 (numbers of seconds, normalized in the
    comparison with the docs, as the story's lines are left out of it)."""
    ensure_binaries()
    ensure_binaries((*BUILD, KUEUE))  # the JobSet and LWS controllers: a cold build must not eat the demo's --duration
    settle = 5.0
    demo = subprocess.Popen([sys.executable, "-m", "demo", "--duration", "600", "--alerts-after", "5",
                             "--quota-story", f"--quota-settle={settle:g}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kept = None
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
        workloads = _group(r"\$ kubectl get wls -A\n(.*?)\n\n", out).splitlines()
        names = {row.split()[1]: row.split()[3] for row in workloads[1:]}
        assert names == {"web": "deploy", "nightly-report": "job", "train": "js", "llm": "lws"}, workloads
        pods = {row.split()[1]: int(row.split()[2]) for row in workloads[1:]}
        assert pods == {"web": 8, "nightly-report": 4, "train": 8, "llm": 4}, workloads  # all of them: Ready

        # The printed NotReady instruction: the whole gpu pool.
        not_ready = f"-l cloud.google.com/gke-nodepool=gpu {NOT_READY}=true"
        command = next(line.strip() for line in lines if not_ready in line)
        kubectl = command.split()[:3]

        # The ClusterResourceClaim story played. The commands printed for it are those it ran, and
        # show where it ended.
        _story_checks(timed, settle)
        assert f"--quota-actuation=on --quota-settle={settle:g}" in out
        # The alerts the story raises: the pool, the claim over-allocated (held back by the runbooks'
        # inhibition while the pool's alert fires), and the workloads with pods on the lost nodes.
        prometheus = _group(r"\(Prometheus: (http://127\.0\.0\.1:\d+)/alerts\)", out)
        lost = {"gpu-2", "gpu-3"}
        _story_alerts(prometheus, {("NodeGroupNotReady", "warning", "gpu"),
                                   ("ClusterResourceClaimOverAllocated", "warning", "gpu")}
                      | _hurt_workloads(kubectl, lost), "half the gpu pool NotReady (--quota-story)")
        lose, claims, _, queues = _group(r"\nTake 2 of the gpu pool's 4 nodes away.*?\n(  /.*?)\n\n", out).splitlines()
        assert lose.strip() == " ".join(kubectl) + f" label nodes gpu-2 gpu-3 {NOT_READY}=true"
        assert _run(claims)[1][:8] == ["gpu", "local", "gpu", "64", "16", "125%", "False", "OverAllocated"]
        assert _run(queues) == [["NAME", "CPU", "GPU"], ["prod", "32", "4"], ["research", "32", "12"]]

        # Every command block it printed, pasted into a fresh shell, in order: the first names
        # KUBECONFIG and kubectl's directory, the others give both in full.
        blocks = _command_blocks(out)
        assert blocks[0].startswith("export KUBECONFIG=") and len(blocks) == 5, blocks
        for block in blocks:
            proc = _fresh_shell(block)
            assert proc.returncode == 0 and proc.stdout.strip(), f"{block}\n{proc.stdout}\n{proc.stderr}"
        look = _fresh_shell(blocks[0]).stdout
        assert "gke-nodepool-gpu" in look and "nightly-report" in look and "nws_nodegroup_nodes{" in look, look
        # The service's log was named: its last lines.
        workdir = _group(r"export KUBECONFIG=(\S+)/kubeconfig", out)
        assert blocks[1].startswith(f"tail -n 20 {workdir}/logs/node-workload-summary-")
        assert " INFO " in _fresh_shell(blocks[1]).stdout

        # The printed NotReady instruction (one of those blocks) worked: the gpu pool's NodeSummary shows it.
        wait_for(lambda: subprocess.run([*kubectl, "get", "nodesummary", "gke-nodepool-gpu", "-o",
                                         "jsonpath={.status.conditions[?(@.type=='NotReady')].count}"],
                                        capture_output=True, text=True).stdout == "4", timeout=30)
        assert _processes_mentioning(workdir)  # the demo's control plane is running
        # The blocks' stories, all at once now: the whole gpu pool NotReady, the cpu pool tainted.
        sick = {f"{pool}-{i}" for pool in ("gpu", "cpu") for i in range(4)}
        _story_alerts(prometheus, {("NodeGroupNotReady", "warning", "gpu"),
                                   ("NodeGroupDown", "critical", "gpu"),
                                   ("NodeGroupDisrupting", "info", "cpu"),
                                   ("ClusterResourceClaimOverAllocated", "warning", "gpu")}
                      | _hurt_workloads(kubectl, sick), "and the whole gpu pool NotReady, the cpu pool tainted")

        demo.send_signal(2)  # Ctrl-C
        rest, _ = demo.communicate(timeout=60)
        assert demo.returncode == 0, rest
        time.sleep(0.5)
        assert _processes_mentioning(workdir) == []
        assert not Path(workdir).exists()

        # The logs stay, where it said they would, the service's among them.
        kept = Path(_group(r"\[demo\] logs kept in (\S+)/ \(", rest))
        assert f"(kept in {kept}/ when the demo stops)" in out
        [log] = kept.glob("node-workload-summary-*.log")
        assert "serving on http://127.0.0.1:" in log.read_text() and (kept / "kube-apiserver.log").is_file()

        # The printout is the one the docs show (python -m demo.printout wrote it from a run).
        whole = printout.without_story(out + rest)
        for path, text in printout.samples(whole).items():
            shown_ = printout.normalized(printout.sample(path.read_text(), printout.HEADINGS[path]))
            ran = printout.normalized(text)
            assert shown_ == ran, f"{path.name}: run `.venv/bin/python -m demo.printout`\n" + "\n".join(
                difflib.unified_diff(shown_.splitlines(), ran.splitlines(), "docs", "this run", lineterm=""))
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        if kept is not None:
            shutil.rmtree(kept, ignore_errors=True)


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
