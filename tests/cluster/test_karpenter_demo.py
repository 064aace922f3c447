"""`python -m demo --karpenter --duration 1` (make demo DEMO_ARGS=--karpenter): it starts the real
Karpenter, plays the drift rollout and prints what docs/karpenter.md shows: the pool's NodeSummary
with its three blocked nodes, the workloads, and the service's Events naming each blocker; then it
stops and exits 0."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.paths import ROOT

pytestmark = pytest.mark.karpenter


def test_the_karpenter_demo_plays_a_drift_rollout_and_names_its_blockers() -> None:
    proc = subprocess.run([sys.executable, "-m", "demo", "--karpenter", "--duration", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stderr, proc.stdout, sep="\n")  # the printout docs/karpenter.md shows
    assert re.search(r"Karpenter ready in \d+\.\ds", proc.stderr), proc.stderr
    before, after = proc.stdout.split("The rollout, ", 1)
    for part in (before, after):
        header, row = part.split("$ kubectl get nodesummaries -o wide\n", 1)[1].splitlines()[:2]
        assert row.startswith("pools-demo ") and row[header.index("BLOCKED"):].split()[0] == "3", (header, row)
        # Before the rollout nothing wants the held nodes; after it, all three are drifted and held.
        held = row[header.index("HELD"):header.index("AGE")].strip()  # blank: status.rollout.held absent
        assert held == ("" if part is before else "3"), (header, row)
        lines = part.split("{end}'\n", 1)[1].split("\n\n", 1)[0].splitlines()  # node, kind, namespace/name
        blockers = sorted(tuple(line.split("\t")[1:]) for line in lines)
        assert [kind for kind, _ in blockers] == ["Pod", "PodDisruptionBudget", "PodDisruptionBudget"], lines
        assert blockers[0][1].startswith("demo/pinned-") and blockers[1][1] == blockers[2][1] == "demo/guarded"
        workloads = part.split("$ kubectl get workloads.ux -A\n", 1)[1].split("\n\n", 1)[0]
        assert {line.split()[1] for line in workloads.splitlines()[1:]} == {"web", "pinned", "guarded"}
    events = after.split("COUNT:.series.count,MESSAGE:.message\n", 1)[1].split("\n\n", 1)[0]
    # One Event per workload; guarded's counts its two nodes (and Karpenter's repeats), web's its three.
    assert re.search(r"Warning\s+DisruptionBlocked\s+pinned\s+\S+\s+pod demo/pinned-\S+ "
                     r"\(karpenter\.sh/do-not-disrupt\) keeps Karpenter", events), events
    assert re.search(r"Warning\s+DisruptionBlocked\s+guarded\s+[2-9]\s+PodDisruptionBudget demo/guarded",
                     events), events
    assert re.search(r"Normal\s+DisruptionStarted\s+web\s+3\s+Karpenter is disrupting nodes of NodePool demo",
                     events), events
    assert len(events.strip().splitlines()) == 4, events  # the header, then one Event per workload
