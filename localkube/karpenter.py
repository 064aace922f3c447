"""Karpenter on a local control plane: its KWOK cloud provider, built from the pinned module
``sigs.k8s.io/karpenter`` (``localkube/gomod/karpenter``; ``KARPENTER`` in localkube/build.py).

The KWOK provider is Karpenter itself (the provisioner, the disruption controller, the NodeClaim
lifecycle, the NodePool counters) with a cloud that makes KWOK Nodes: a NodeClaim it launches becomes a
Node ``kwok-<nodeclaim>-...`` with ``spec.providerID: kwok://<node>`` and the label and the annotation
``kwok.x-k8s.io/node: fake`` (kwok/cloudprovider/cloudprovider.go, ``toNode``). What else it needs, and
how it runs here:

- a KWOKNodeClass (``karpenter.kwok.sh/v1alpha1``; its CRD defaults its status to Ready) and a NodePool
  whose ``spec.template.spec.nodeClassRef`` is ``{group: karpenter.kwok.sh, kind: KWOKNodeClass, name}``:
  ``node_class`` and ``node_pool`` below;
- kube-scheduler: Karpenter provisions for the pods it marks unschedulable (PodScheduled False,
  reason Unschedulable), and binds none itself; kube-controller-manager: the Deployments' pods, and
  the garbage collector that deletes a deleted NodePool's NodeClaims (their ownerReference);
- a KWOK controller managing its nodes: localkube's KWOK manages the nodes annotated
  ``kwok.x-k8s.io/node=fake`` (``LocalCluster._start_kwok``), which its nodes are. KWOK's stages make them
  Ready and run, complete and delete their pods; Karpenter then registers and initializes them;
- no webhooks (the module has none), no configuration file: flags, with the kubeconfig in
  ``KUBECONFIG`` (its flag set is its own, with no ``--kubeconfig``; controller-runtime's
  ``GetConfigOrDie`` reads the variable); leader election off (``--disable-leader-election``); metrics
  and health probes on free ports (``--metrics-port``, ``--health-probe-port``: it binds them on every
  address, ``:<port>``, and has no flag for the address);
- its provisioning batches end sooner than its defaults (``--batch-idle-duration`` 1s,
  ``--batch-max-duration`` 10s), so a test's pending pods get their NodeClaims within a second.

    with LocalCluster(Options(controller_manager=True, scheduler=True, kwok=True)) as c:
        karpenter = KarpenterController(c).start()   # installs its CRDs too
        apply(c, node_class("default"), node_pool("default"))
        ...
        karpenter.stop()                               # or: it stops with the cluster

Its disruption controller's own waits are constants of the module, not flags: it looks for candidates
every 10 s when it found none (``pollingPeriod``, pkg/controllers/disruption/controller.go), and an
empty node is deleted only after a second look 15 s later (``commandValidationDelay``,
pkg/controllers/disruption/consolidation.go). What a test tunes is the NodePool's:
``spec.disruption.consolidateAfter``, ``consolidationPolicy`` and ``budgets``.
"""

from __future__ import annotations

import json
import os
import urllib.request
from typing import Any, Self

from .build import KARPENTER
from .cluster import ClusterError, LocalCluster, free_port
from .controllers import Controller, Project

# The same component for CRDs and binary (one wrapper module); no Configuration file (config_api).
KARPENTER_PROJECT = Project("karpenter", KARPENTER, KARPENTER, config_api="")

NODE_CLASS_GROUP = "karpenter.kwok.sh"
NODE_CLASS_KIND = "KWOKNodeClass"
NODEPOOL_LABEL = "karpenter.sh/nodepool"  # on every NodeClaim and Node a NodePool launches
DISRUPTED_TAINT = "karpenter.sh/disrupted"  # NoSchedule, on a node Karpenter is disrupting
UNREGISTERED_TAINT = "karpenter.sh/unregistered"  # NoExecute, on its Node until the NodeClaim registers it
KWOK_NODE = "kwok.x-k8s.io/node"  # its nodes' label and annotation, value "fake": what KWOK manages here

# Linux, amd64, on-demand: of the instance types the KWOK provider embeds (kwok/cloudprovider/
# instance_types.json: c-, m- and s-families of 1 to 256 CPUs, amd64 and arm64, linux and windows, spot
# and on-demand in test-zone-a to -d), Karpenter launches the cheapest that fits.
REQUIREMENTS: tuple[dict[str, Any], ...] = (
    {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]},
    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
    {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
)


class KarpenterController(Controller):
    """Karpenter's KWOK provider, one per cluster (leader election off). The cluster must run
    kube-controller-manager, kube-scheduler and KWOK (``Options(controller_manager=True,
    scheduler=True, kwok=True)``)."""

    def __init__(self, cluster: LocalCluster, batch_idle: str = "200ms", batch_max: str = "2s",
                 log_level: str = "debug") -> None:
        super().__init__(cluster, KARPENTER_PROJECT)
        self.batch_idle = batch_idle
        self.batch_max = batch_max
        self.log_level = log_level  # debug: it logs each condition it sets ("marking drifted", ...)
        self.metrics_port = 0

    def start(self, install_crds: bool = True, timeout: float = 60) -> Self:
        missing = [name for name in ("kube-controller-manager", "kube-scheduler", "kwok")
                   if name not in self.cluster.processes]
        if missing:
            raise ClusterError(f"Karpenter needs {', '.join(missing)} beside it: start the cluster with "
                               "Options(controller_manager=True, scheduler=True, kwok=True)")
        return super().start(install_crds, timeout)

    def _argv(self) -> list[str]:
        self.metrics_port = free_port()
        return [str(self.paths[self.project.binary]),
                "--disable-leader-election",
                f"--metrics-port={self.metrics_port}",
                f"--health-probe-port={self.probe_port}",
                "--kube-client-qps=500", "--kube-client-burst=1000",
                f"--batch-idle-duration={self.batch_idle}",
                f"--batch-max-duration={self.batch_max}",
                f"--log-level={self.log_level}"]

    def _env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}

    def _serving(self, timeout: float) -> None:
        """No webhook server: /readyz alone (its caches synced, its CRDs served) says it runs."""

    def _ready(self, timeout: float) -> None:
        """No webhook configurations to install."""

    def metrics(self) -> str:
        """Its /metrics, as Prometheus would scrape it (karpenter_nodepools_allowed_disruptions, ...)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
            return resp.read().decode()


def node_class(name: str = "default", registration_delay: str = "") -> dict[str, Any]:
    """A KWOKNodeClass; ``registration_delay`` (``"5s"``): how long its Nodes take to appear."""
    spec = {"nodeRegistrationDelay": registration_delay} if registration_delay else {}
    return {"apiVersion": f"{NODE_CLASS_GROUP}/v1alpha1", "kind": NODE_CLASS_KIND, "metadata": {"name": name},
            "spec": spec}


def node_pool(name: str, node_class: str = "default", *, consolidation_policy: str = "WhenEmptyOrUnderutilized",
              consolidate_after: str = "Never", budgets: tuple[str, ...] = ("100%",),
              labels: dict[str, str] | None = None, requirements: tuple[dict[str, Any], ...] = REQUIREMENTS,
              expire_after: str = "Never", limits: dict[str, str] | None = None) -> dict[str, Any]:
    """A NodePool of ``node_class``'s KWOK nodes. ``labels`` go on its NodeClaims and Nodes (and are
    in the template's hash: changing them drifts its nodes); ``budgets``: each a ``nodes`` value."""
    template: dict[str, Any] = {
        "spec": {"nodeClassRef": {"group": NODE_CLASS_GROUP, "kind": NODE_CLASS_KIND, "name": node_class},
                 "requirements": list(requirements), "expireAfter": expire_after}}
    if labels:
        template["metadata"] = {"labels": labels}
    spec: dict[str, Any] = {
        "template": template,
        "disruption": {"consolidationPolicy": consolidation_policy, "consolidateAfter": consolidate_after,
                       "budgets": [{"nodes": nodes} for nodes in budgets]}}
    if limits:
        spec["limits"] = limits
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": spec}


def apply(cluster: LocalCluster, *objects: dict[str, Any]) -> None:
    """Server-side apply ``objects`` as one List."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                    input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))
