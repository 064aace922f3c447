"""The README's commands work as written, pasted into a fresh shell after its setup step.

Each command block of "Try it locally: the demo" runs as one script in a fresh shell from the
checkout: `env -i`, HOME and a PATH of the system's directories and Go's (which the README asks
for), nothing activated. `make install`, the setup step, runs as written (a no-op once done).
`make demo` runs until Ctrl-C, a minute or more: its lines run with `--help` added to their
DEMO_ARGS, which proves the target, its prerequisites (the binaries, Prometheus) and the demo's
imports in the virtualenv; tests/cluster/test_demo.py runs the demo itself, checks the printout the README
shows and runs the commands that printout gives. Every other line runs as written
(`node-workload-summary --help`, `--version`). And no command elsewhere in the README names a
Python command off the virtualenv (`python -m ...`, `node-workload-summary`), which a fresh shell
answers with `command not found` or `No module named ...`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.image import version as package_version
from localkube.build import KUBERNETES_CONTROLLERS, KWOK, ensure_binaries
from tests.paths import ROOT
from tests.support.readme import SECTION, command_blocks, section, with_help


def fresh_shell(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in bash started with `env -i`: HOME, and PATH the system's and Go's directories."""
    go = shutil.which("go")
    path = ":".join(dict.fromkeys([*([str(Path(go).parent)] if go else []), "/usr/local/bin", "/usr/bin", "/bin"]))
    env = {"HOME": str(Path.home()), "PATH": path}
    env.update({k: os.environ[k] for k in ("NWS_CACHE_DIR", "XDG_CACHE_HOME") if k in os.environ})  # the binaries
    return subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", "-euo", "pipefail", "-c",
                           script], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.cluster
@pytest.mark.needs(KUBERNETES_CONTROLLERS, KWOK)
@pytest.mark.skipif(Path(sys.prefix).resolve() != (ROOT / ".venv").resolve(),
                    reason="the README's commands name the virtualenv .venv; these tests run in another")
def test_each_command_block_runs_in_a_fresh_shell() -> None:
    ensure_binaries()  # what `make demo` builds first (`localkube build`): built here, not timed below
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    outputs = []
    for block in command_blocks(section(SECTION)):
        proc = fresh_shell(with_help(block))
        assert proc.returncode == 0, f"{with_help(block)}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        outputs.append(proc.stdout)
    setup, more = outputs
    assert "usage: python -m demo" in setup and more.count("usage: python -m demo") == 3  # --karpenter among them
    assert "usage: node-workload-summary" in more and "--kubeconfig PATH" in more
    assert f"node-workload-summary {package_version()} (revision {head}, Python " in more
