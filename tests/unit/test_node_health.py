"""Node state. Here, what needs no cluster; the scenarios against one:
tests/cluster/test_node_health.py."""

from __future__ import annotations

import pytest

from node_workload_summary.main import main
from node_workload_summary.settings import Settings, load


def parse(*args: str) -> Settings:
    return load(args)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in Settings.model_fields:
        monkeypatch.delenv(f"NWS_{name.upper()}", raising=False)
    return monkeypatch


def test_health_lists_default_replace_and_read_as_written(clean_env: pytest.MonkeyPatch) -> None:
    defaults = parse()
    assert "karpenter.sh/disrupted" in defaults.disruption_taints and "KernelDeadlock" in defaults.problem_conditions
    assert "aws.amazon.com/neuron*" in defaults.accelerator_resources
    assert parse("--disruption-taints", "a,b:NoExecute").disruption_taints == ["a", "b:NoExecute"]
    assert parse("--problem-conditions", "GPUXid", "--problem-conditions", "X").problem_conditions == ["GPUXid", "X"]
    assert parse("--accelerator-resources", "").accelerator_resources == []
    clean_env.setenv("NWS_ACCELERATOR_RESOURCES", '["example.com/fpga*"]')
    assert parse().accelerator_resources == ["example.com/fpga*"]


def test_health_lists_that_cannot_work_are_refused(clean_env: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--kubeconfig=/nonexistent/kc", "--disruption-taints=a:Sometimes",
                 "--accelerator-resources=nvidia.com/*gpu"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --disruption-taints: 'a:Sometimes' is not a taint key or key:Effect (an effect is one of "
        "NoSchedule, PreferNoSchedule, NoExecute)",
        "error: --accelerator-resources: 'nvidia.com/*gpu': a resource name, or a prefix followed by one * at the end"]
