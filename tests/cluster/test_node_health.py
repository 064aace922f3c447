"""Node state on a real control plane, through the real process: each transition moves the node's
state and reaches every workload with pods there on /metrics within 2 s, and healing leaves no
stale series. Plus the node health settings (no cluster)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from demo.workloads import create, deployment_chain, node_summarizer, ok, workload_summarizer
from kubeindex.model.index import NODE_STATES
from kubeindex.model.resources import NODES
from localkube.cluster import LocalCluster, Options
from localkube.service import Samples, ScrapeFailed, Service, select, value, wait_for
from tests.kube import create_node, create_pod, set_node_status
from tests.paths import CRDS

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor


NS = "health"


POOL = "example.com/pool"


GPU = "nvidia.com/gpu"


GPU_NODE = {"cpu": "16", "memory": "64Gi", "pods": "110", GPU: "8"}


SICK = "gpu-1"  # every transition happens here: train has two pods on it, serve one


WORKLOADS = {("train", "Deployment"): 2, ("serve", "Job"): 1}  # pods on SICK


HEALTHY_WORKLOAD = ("web", "Deployment")  # on the cpu pool only


def patch_node(kube: LocalCluster, body: dict, status: bool = False) -> None:
    path = NODES.path(name=SICK) + ("/status" if status else "")
    ok(kube.request(path, "PATCH", body, content_type="application/merge-patch+json"))


def conditions(kernel_deadlock: str) -> dict:
    return {"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "Test", "lastHeartbeatTime": None, "lastTransitionTime": None},
        {"type": "KernelDeadlock", "status": kernel_deadlock, "reason": "Test", "lastHeartbeatTime": None,
         "lastTransitionTime": None}]}}


@dataclass(frozen=True)
class Transition:
    state: str
    sick: Callable[[LocalCluster], object]  # what they return is not used
    heal: Callable[[LocalCluster], object]


TRANSITIONS = {
    "taint": Transition(
        "Disrupting",
        lambda k: patch_node(k, {"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}}),
        lambda k: patch_node(k, {"spec": {"taints": None}})),
    "condition": Transition(
        "Degraded", lambda k: patch_node(k, conditions("True"), status=True),
        lambda k: patch_node(k, conditions("False"), status=True)),
    "allocatable": Transition(
        "Degraded", lambda k: patch_node(k, {"status": {"allocatable": {GPU: "6"}}}, status=True),
        lambda k: patch_node(k, {"status": {"allocatable": {GPU: "8"}}}, status=True)),
    "cordon": Transition(
        "Cordoned", lambda k: patch_node(k, {"spec": {"unschedulable": True}}),
        lambda k: patch_node(k, {"spec": {"unschedulable": False}})),
    "not_ready": Transition(
        "NotReady", lambda k: set_node_status(k, SICK, "False"), lambda k: set_node_status(k, SICK, "True")),
}


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        yield c


@pytest.fixture(scope="module")
def service(kube: LocalCluster) -> Iterator[Service]:
    """Two gpu nodes, a cpu node; train (Deployment) and serve (Job) with pods on gpu-1 and gpu-2,
    web (Deployment) on the cpu node. Metrics only: the summaries are tested beside."""
    kube.kubectl("create", "namespace", NS)
    node_summarizer(kube, "pool", POOL)
    workload_summarizer(kube, "apps", [("apps", "Deployment"), ("batch", "Job")])
    create_node(kube, "gpu-1", {POOL: "gpu"}, allocatable=GPU_NODE)
    create_node(kube, "gpu-2", {POOL: "gpu"}, allocatable=GPU_NODE)
    create_node(kube, "cpu-1", {POOL: "cpu"})
    _, train = deployment_chain(kube, NS, "train")
    _, web = deployment_chain(kube, NS, "web")
    serve = create(kube, f"/apis/batch/v1/namespaces/{NS}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "serve"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}})
    for name, node, owner in [("train-0", "gpu-1", train), ("train-1", "gpu-1", train), ("train-2", "gpu-2", train),
                              ("serve-0", "gpu-1", serve), ("serve-1", "gpu-2", serve),
                              ("web-0", "cpu-1", web), ("web-1", "cpu-1", web)]:
        create_pod(kube, NS, name, node, owner=owner)
    svc = Service(kube, ("--no-reconciler",)).start()
    wait_for(lambda: value(svc.scrape(), "nws_workload_pods", **_workload("serve", "Job"), phase="Running") == 2,
             retry=ScrapeFailed)
    yield svc
    svc.stop()


def _workload(name: str, kind: str) -> dict[str, str]:
    return {"namespace": NS, "workload": name, "kind": kind}


def _states(s: Samples, group: str = "gpu") -> dict[str, float]:
    return {dict(k)["state"]: v for k, v in select(s, "nws_nodegroup_nodes_by_state", summarizer="pool",
                                                  group=group).items()}


def _impact_shown(s: Samples, state: str) -> bool:
    """gpu-1 is in ``state``, every workload with pods there says so, the others do not."""
    if _states(s) != {st: 1 if st in (state, "Ready") else 0 for st in NODE_STATES}:
        return False
    for (name, kind), pods in WORKLOADS.items():
        if select(s, "nws_workload_pods_by_node_state", workload=name) != {
                frozenset({*_workload(name, kind).items(), ("state", state)}): pods}:
            return False
        if value(s, "nws_workload_nodes_unhealthy", **_workload(name, kind)) != 1:
            return False
    return (not select(s, "nws_workload_nodes_unhealthy", workload=HEALTHY_WORKLOAD[0])
            and not select(s, "nws_workload_pods_by_node_state", workload=HEALTHY_WORKLOAD[0]))


def _all_healthy(s: Samples) -> bool:
    """Back to zero, nothing stale: no pods by node state at all, no unhealthy accelerators."""
    return (_states(s) == {st: 2 if st == "Ready" else 0 for st in NODE_STATES}
            and not select(s, "nws_workload_pods_by_node_state")
            and not select(s, "nws_nodegroup_accelerators_unhealthy")
            and not select(s, "nws_workload_nodes_unhealthy"))


@pytest.mark.parametrize("name", list(TRANSITIONS))
def test_transition_reaches_every_workload_on_the_node_within_2s(kube: LocalCluster, service: Service,
                                                                  name: str) -> None:
    transition = TRANSITIONS[name]
    s = service.scrape()
    assert _all_healthy(s), (_states(s), select(s, "nws_workload_pods_by_node_state"),
                             select(s, "nws_nodegroup_accelerators_unhealthy"))
    started = time.monotonic()
    transition.sick(kube)
    try:
        wait_for(lambda: _impact_shown(service.scrape(), transition.state), timeout=2, retry=ScrapeFailed)
    except AssertionError:
        s = service.scrape()
        raise AssertionError((_states(s), select(s, "nws_workload_pods_by_node_state"))) from None
    sick_took = time.monotonic() - started
    if name == "allocatable":
        assert value(service.scrape(), "nws_nodegroup_accelerators_unhealthy", summarizer="pool", group="gpu",
                     resource=GPU) == 2
    started = time.monotonic()
    transition.heal(kube)
    wait_for(lambda: _all_healthy(service.scrape()), timeout=2, retry=ScrapeFailed)
    print(f"{name}: {transition.state} on /metrics after {sick_took * 1000:.0f} ms, "
          f"healed after {(time.monotonic() - started) * 1000:.0f} ms")


def test_settings_reach_the_process(kube: LocalCluster, service: Service) -> None:
    """A taint configured by --disruption-taints makes the node Disrupting; a default one, no
    longer listed, does not; an empty --accelerator-resources sees no accelerators."""
    custom = Service(kube, ("--no-reconciler", "--disruption-taints=example.com/drain:NoExecute",
                            "--accelerator-resources=")).start()
    try:
        patch_node(kube, {"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}})
        patch_node(kube, {"status": {"allocatable": {GPU: "6"}}}, status=True)
        wait_for(lambda: _states(service.scrape())["Disrupting"] == 1, timeout=2, retry=ScrapeFailed)
        assert _states(custom.scrape())["Ready"] == 2
        assert not select(custom.scrape(), "nws_nodegroup_accelerators_unhealthy")
        patch_node(kube, {"spec": {"taints": [{"key": "example.com/drain", "effect": "NoExecute"}]}})
        wait_for(lambda: _states(custom.scrape())["Disrupting"] == 1, timeout=2, retry=ScrapeFailed)
    finally:
        custom.stop()
        patch_node(kube, {"spec": {"taints": None}})
        patch_node(kube, {"status": {"allocatable": {GPU: "8"}}}, status=True)
    wait_for(lambda: _all_healthy(service.scrape()), timeout=2, retry=ScrapeFailed)
