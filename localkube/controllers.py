"""The JobSet and LeaderWorkerSet controllers on a local control plane, with their real webhooks.

Both are controller-runtime managers built from their pinned Go modules (``localkube/gomod/jobset``,
``localkube/gomod/lws``; cached like the control plane, built on first use). In a cluster they
manage their own webhook certificates (``internalCertManagement``: a Secret and a Service in their
namespace, the CA injected into the webhook configurations) and wait for them before starting any
controller (``setupControllers`` in jobset's main.go and lws's cmd/main.go block on ``certsReady``).
Here the API server has no cluster network to reach a Service, so instead:

- ``internalCertManagement.enable: false`` in the manager's configuration file (``certsReady`` is
  then closed at once), and ``webhook.certDir`` pointing at a certificate for 127.0.0.1 made by
  ``pki.webhook_serving``;
- the projects' own webhook configurations (``config/.../webhook/manifests.yaml`` with their
  kustomize patches, which scope the pod webhooks by objectSelector to the project's own pods),
  with each ``clientConfig.service`` replaced by ``url: https://127.0.0.1:<port><path>`` and that
  CA as caBundle, so the API server calls the webhooks as in a cluster.

The webhooks are not optional: JobSet's defaulting webhook fills ``spec.successPolicy``,
``startupPolicy`` and ``network`` that its controller dereferences, and LWS's pod webhook puts the
``worker-index`` and ``group-key`` labels on the pods, without which its pod controller never
creates a group's worker StatefulSet (``PodReconciler.Reconcile`` in pkg/controllers/pod_controller.go).

    with LocalCluster(Options(controller_manager=True, scheduler=True, kwok=True)) as c:
        jobset = Controller(c, JOBSET_PROJECT).start()   # installs the CRDs too
        ...
        jobset.stop()   # webhook configurations removed first, then the process
"""

from __future__ import annotations

import base64
import json
import socket
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import pki
from .build import JOBSET, JOBSET_CONTROLLER, LWS, LWS_CONTROLLER, Component, ensure_binaries
from .cluster import LocalCluster, Process, free_port, wait_until


@dataclass(frozen=True)
class Project:
    name: str  # also the prefix of its webhook configurations' names (its kustomize namePrefix)
    crds: Component
    controller: Component
    config_api: str  # apiVersion of the manager's Configuration file

    @property
    def binary(self) -> str:
        return f"{self.name}-controller"


JOBSET_PROJECT = Project("jobset", JOBSET, JOBSET_CONTROLLER, "config.jobset.x-k8s.io/v1alpha1")
LWS_PROJECT = Project("lws", LWS, LWS_CONTROLLER, "config.lws.x-k8s.io/v1alpha1")
# Everything both need, to build ahead (ensure_binaries(BUILD)) where a start must not wait for it.
BUILD = (JOBSET, JOBSET_CONTROLLER, LWS, LWS_CONTROLLER)


def _patched(configuration: dict, patch: list[dict]) -> dict:
    """The kustomize JSON 6902 patches of these projects: ``replace`` of ``/webhooks/<n>``."""
    for op in patch:
        _, field, index = op["path"].split("/")
        if op["op"] != "replace" or field != "webhooks":
            raise ValueError(f"unexpected webhook patch {op}")
        configuration["webhooks"][int(index)] = op["value"]
    return configuration


def webhook_configurations(project: Project, paths: dict[str, Path], port: int, ca: bytes) -> list[dict]:
    """The project's Mutating- and ValidatingWebhookConfiguration, patched as its kustomization
    does, calling the manager at https://127.0.0.1:``port``."""
    configurations = [c for c in yaml.safe_load_all(paths[f"{project.name}-webhooks.yaml"].read_text()) if c]
    patches = [p for p in yaml.safe_load_all(paths[f"{project.name}-webhook-patches.yaml"].read_text()) if p]
    kinds = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    out = []
    for configuration in configurations:
        configuration = _patched(configuration, patches[kinds.index(configuration["kind"])])
        configuration["metadata"]["name"] = f"{project.name}-{configuration['metadata']['name']}"
        for webhook in configuration["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}",
                                       "caBundle": base64.b64encode(ca).decode()}
        out.append(configuration)
    return out


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class Controller:
    """One JobSet or LeaderWorkerSet controller manager (leader election off: one per cluster)."""

    def __init__(self, cluster: LocalCluster, project: Project) -> None:
        self.cluster = cluster
        self.project = project
        self.paths: dict[str, Path] = {}
        self.process: Process | None = None
        self.webhook_port = 0
        self.probe_port = 0
        self._configurations: list[dict] = []

    @property
    def name(self) -> str:
        return f"{self.project.name}-controller"

    def start(self, install_crds: bool = True, timeout: float = 60) -> Controller:
        """Build (first use) and start the manager, then install its webhook configurations."""
        self.paths = ensure_binaries((self.project.crds, self.project.controller))
        if install_crds:
            self.cluster.install_crds(self.paths[f"{self.project.name}-crds.yaml"])
        home = self.cluster.workdir / self.name
        ca = pki.webhook_serving(home / "certs", self.project.name)
        self.webhook_port, self.probe_port = free_port(), free_port()
        config = home / "config.yaml"
        config.write_text(json.dumps({
            "apiVersion": self.project.config_api, "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(home / "certs")},
            "metrics": {"bindAddress": "0"},  # off: nothing here scrapes it
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.probe_port}"},
            "clientConnection": {"qps": 500, "burst": 500},
        }, indent=2))
        self.process = Process(self.name, [
            str(self.paths[self.project.binary]), f"--config={config}",
            f"--kubeconfig={self.cluster.kubeconfig}", "--zap-log-level=info",
        ], self.cluster.workdir / "logs")
        # Registered with the cluster, so cluster.stop() stops it too and the leftover check sees it.
        self.cluster.processes[self.name] = self.process
        self.process.start()
        wait_until(f"{self.name} webhook server", lambda: _listening(self.webhook_port), timeout, [self.process])
        wait_until(f"{self.name} /readyz", lambda: self.cluster._http_ok(f"http://127.0.0.1:{self.probe_port}/readyz"),
                   timeout, [self.process])
        self._configurations = webhook_configurations(self.project, self.paths, self.webhook_port, ca.read_bytes())
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                             input=json.dumps({"apiVersion": "v1", "kind": "List", "items": self._configurations}))
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.running()

    def log_tail(self, lines: int = 30) -> str:
        return self.process.log_tail(lines) if self.process else "(not started)"

    def stop(self) -> None:
        """Remove the webhook configurations (with failurePolicy Fail they would refuse the
        project's objects and pods once nothing answers), then stop the manager."""
        for configuration in self._configurations:
            self.cluster.kubectl("delete", configuration["kind"], configuration["metadata"]["name"],
                                 "--ignore-not-found", check=False)
        self._configurations = []
        if self.process is not None:
            self.process.stop()
            self.cluster.processes.pop(self.name, None)
            self.process = None

    def __enter__(self) -> Controller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
