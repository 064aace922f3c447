"""The JobSet, LeaderWorkerSet and Kueue controllers on a local control plane, with their real webhooks.

All are controller-runtime managers built from their pinned Go modules (``localkube/gomod/jobset``,
``localkube/gomod/lws``, ``localkube/gomod/kueue``; cached like the control plane, built on first
use). In a cluster they manage their own webhook certificates (``internalCertManagement``: a Secret
and a Service in their namespace, the CA injected into the webhook configurations) and wait for
them before starting any controller (``setupControllers`` in jobset's main.go and lws's
cmd/main.go block on ``certsReady``). Here the API server has no cluster network to reach a
Service's pods, so for JobSet and LWS instead:

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

Kueue's controller manager (``KueueController``, ``localkube/gomod/kueue``) differs in one point:
with ``internalCertManagement`` off its main.go also reads a metrics certificate from the fixed
path /etc/kueue/metrics/certs and exits without it. So it runs with its internal certificate
management on, as in a cluster, and the cluster's part is played here:

- its webhook Service ``kueue-webhook-service`` in ``kueue-system`` is an ExternalName Service for
  127.0.0.1 (the API server resolves a webhook's Service reference to the external name, and checks
  the certificate against ``kueue-webhook-service.kueue-system.svc``, as in a cluster);
- its certificate Secret starts empty (Kueue's manifests create it so); Kueue fills it and
  injects its CA into its webhook configurations (which keep their Service references); they are
  installed before it starts, as it starts no controller before its CA is in them;
- the Secret's ``tls.crt`` and ``tls.key`` are copied into ``webhook.certDir``, as the kubelet
  mounts that Secret into the pod (until then, a placeholder certificate lets its webhook server
  start: it exits without one); ``start`` returns once the webhook server serves the Secret's
  certificate and both configurations trust its CA;
- only the webhooks of the kinds it manages here are registered: its own and batch Jobs (its one
  integration here). It answers the others (pods, Deployments, JobSets, ...) with no-op webhooks,
  but registered they would put every such object, the project's pods among them, behind a
  webhook that must answer (failurePolicy Fail);
- ``VisibilityOnDemand`` off: that feature's API server listens on a fixed port, 8082.

    with LocalCluster(Options(controller_manager=True, scheduler=True, kwok=True)) as c:
        jobset = Controller(c, JOBSET_PROJECT).start()   # installs the CRDs too
        ...
        jobset.stop()   # webhook configurations removed first, then the process
    with LocalCluster(Options()) as c, KueueController(c):   # every Kueue CRD, its webhooks
        ...
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import yaml

from kubeindex.model.resources import SECRETS

from . import pki
from .build import (
    JOBSET,
    JOBSET_CONTROLLER,
    KUEUE_019_CONTROLLER,
    KUEUE_CONTROLLER,
    LWS,
    LWS_CONTROLLER,
    Component,
    ensure_binaries,
)
from .cluster import LocalCluster, Process, free_port, wait_until


@dataclass(frozen=True)
class Project:
    name: str  # also the prefix of its webhook configurations' names (its kustomize namePrefix)
    crds: Component
    controller: Component
    config_api: str  # apiVersion of the manager's Configuration file
    crds_bundle: str = ""  # the bundle of ``crds`` to install; default ``<name>-crds.yaml``

    @property
    def binary(self) -> str:
        return f"{self.name}-controller"

    @property
    def crds_file(self) -> str:
        return self.crds_bundle or f"{self.name}-crds.yaml"


JOBSET_PROJECT = Project("jobset", JOBSET, JOBSET_CONTROLLER, "config.jobset.x-k8s.io/v1alpha1")
LWS_PROJECT = Project("lws", LWS, LWS_CONTROLLER, "config.lws.x-k8s.io/v1alpha1")
KUEUE_PROJECT = Project("kueue", KUEUE_CONTROLLER, KUEUE_CONTROLLER, "config.kueue.x-k8s.io/v1beta1",
                        crds_bundle="kueue-all-crds.yaml")
KUEUE_019_PROJECT = Project("kueue", KUEUE_019_CONTROLLER, KUEUE_019_CONTROLLER, "config.kueue.x-k8s.io/v1beta2",
                            crds_bundle="kueue-all-crds.yaml")
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
    """One JobSet or LeaderWorkerSet controller manager (leader election off: one per cluster).
    Subclasses (``KueueController``) change how its webhooks get their certificate: the
    ``_settings``, ``_before_start`` and ``_ready`` steps of ``start``."""

    def __init__(self, cluster: LocalCluster, project: Project) -> None:
        self.cluster = cluster
        self.project = project
        self.paths: dict[str, Path] = {}
        self.process: Process | None = None
        self.webhook_port = 0
        self.probe_port = 0
        self._configurations: list[dict] = []
        self._ca = b""

    @property
    def name(self) -> str:
        return f"{self.project.name}-controller"

    @property
    def home(self) -> Path:
        return self.cluster.workdir / self.name

    def start(self, install_crds: bool = True, timeout: float = 60) -> Self:
        """Build (first use) and start the manager, then install its webhook configurations."""
        self.paths = ensure_binaries((self.project.crds, self.project.controller))
        self.webhook_port, self.probe_port = free_port(), free_port()
        if install_crds:
            self._install_crds()
        self.home.mkdir(parents=True, exist_ok=True)
        self.process = Process(self.name, self._argv(), self.cluster.workdir / "logs", self._env())
        # Registered with the cluster, so cluster.stop() stops it too and the leftover check sees it.
        self.cluster.processes[self.name] = self.process
        self._before_start()
        self.process.start()
        self._serving(timeout)
        self._wait("/readyz", lambda: self.cluster._http_ok(f"http://127.0.0.1:{self.probe_port}/readyz"), timeout)
        self._ready(timeout)
        return self

    def _argv(self) -> list[str]:
        """The manager's command line: its Configuration file, written here, and the kubeconfig."""
        config = self.home / "config.yaml"
        config.write_text(json.dumps({
            "apiVersion": self.project.config_api, "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port, "certDir": str(self.home / "certs")},
            "metrics": {"bindAddress": "0"},  # off: nothing here scrapes it
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.probe_port}"},
            "clientConnection": {"qps": 500, "burst": 500},
            **self._settings(),
        }, indent=2))
        return [str(self.paths[self.project.binary]), f"--config={config}",
                f"--kubeconfig={self.cluster.kubeconfig}", "--zap-log-level=info"]

    def _env(self) -> dict[str, str] | None:
        """The manager's environment; None: this process's."""
        return None

    def _serving(self, timeout: float) -> None:
        """Once started, before /readyz: its webhook server listens."""
        self._wait("webhook server", lambda: _listening(self.webhook_port), timeout)

    def _wait(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        assert self.process is not None
        wait_until(f"{self.name} {what}", check, timeout, [self.process])

    def _install_crds(self) -> None:
        self.cluster.install_crds(self.paths[self.project.crds_file])

    def _settings(self) -> dict[str, Any]:
        """The Configuration fields of this manager's own: its webhook certificate, made here."""
        self._ca = pki.webhook_serving(self.home / "certs", self.project.name).read_bytes()
        return {"internalCertManagement": {"enable": False}}

    def _before_start(self) -> None:
        """What the manager needs in the cluster before it starts."""

    def _ready(self, timeout: float) -> None:
        """Once it is ready: install its webhook configurations, calling it at 127.0.0.1."""
        self._apply(webhook_configurations(self.project, self.paths, self.webhook_port, self._ca))

    def _apply(self, configurations: list[dict]) -> None:
        self._configurations = configurations
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                             input=json.dumps({"apiVersion": "v1", "kind": "List", "items": configurations}))

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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


KUEUE_NAMESPACE = "kueue-system"  # Kueue's default namespace (its Configuration's ``namespace``)
KUEUE_SERVICE = "kueue-webhook-service"  # the defaults of ``internalCertManagement``
KUEUE_SECRET = "kueue-webhook-server-cert"
# The webhooks registered (the tails of their paths): its own kinds' (at the version it serves them:
# v1beta1 to v0.14, v1beta2 from v0.15), and batch Jobs', the integration it always has (an empty
# ``integrations.frameworks`` means ["batch/job"]).
KUEUE_SERVED = ("kueue-x-k8s-io-v1beta", "batch-v1-job")


def unserve(crds: str, versions: tuple[str, ...]) -> str:
    """Kueue's CRDs (a YAML stream) with ``versions`` set ``served: false``: what an API server of a
    later Kueue serves (v0.20 stopped serving v1beta1; the objects stay stored at v1beta2)."""
    docs = [d for d in yaml.safe_load_all(crds) if d]
    for doc in docs:
        for version in doc["spec"]["versions"]:
            if version["name"] in versions:
                version["served"] = False
    return yaml.safe_dump_all(docs)


def with_conversion(crds: str, patches: str, port: int) -> str:
    """Kueue's CRDs with the conversion webhook its kustomization patches in (``webhook_in_*.yaml``),
    calling its webhook Service on ``port``: its manager injects its CA there, and waits for that."""
    conversion = {p["metadata"]["name"]: p["spec"]["conversion"] for p in yaml.safe_load_all(patches) if p}
    docs = [d for d in yaml.safe_load_all(crds) if d]
    for doc in docs:
        patch = conversion.get(doc["metadata"]["name"])
        if patch is not None:
            service = {**patch["webhook"]["clientConfig"]["service"], "name": KUEUE_SERVICE,
                       "namespace": KUEUE_NAMESPACE, "port": port}
            doc["spec"]["conversion"] = {**patch, "webhook": {**patch["webhook"], "clientConfig": {"service": service}}}
    return yaml.safe_dump_all(docs)


def kueue_webhook_configurations(paths: dict[str, Path], port: int) -> list[dict]:
    """Kueue's webhook configurations as its kustomization names them (prefix ``kueue-``, Service
    ``kueue-webhook-service`` in ``kueue-system``), on ``port``, with only the webhooks of
    ``KUEUE_SERVED``, and no caBundle: Kueue injects its CA."""
    out = []
    for configuration in (c for c in yaml.safe_load_all(paths["kueue-webhooks.yaml"].read_text()) if c):
        configuration["metadata"]["name"] = f"kueue-{configuration['metadata']['name']}"
        webhooks = []
        for webhook in configuration["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            if path.split("-", 1)[1].startswith(KUEUE_SERVED):
                webhook["clientConfig"] = {"service": {"name": KUEUE_SERVICE, "namespace": KUEUE_NAMESPACE,
                                                       "path": path, "port": port}}
                webhooks.append(webhook)
        configuration["webhooks"] = webhooks
        out.append(configuration)
    return out


class KueueController(Controller):
    """Kueue's controller manager, with its internal certificate management (see the module's
    docstring): the cluster plays the Service and the kubelet's mount of its Secret."""

    def __init__(self, cluster: LocalCluster, project: Project = KUEUE_PROJECT, unserved: tuple[str, ...] = ()) -> None:
        super().__init__(cluster, project)
        self.unserved = unserved  # CRD versions not served (a later Kueue's API server)

    def _install_crds(self) -> None:
        """Every CRD of the module; from v0.19 with its conversion webhook (to its webhook Service)."""
        crds = self.paths[self.project.crds_file].read_text()
        if "kueue-conversion.yaml" in self.paths:
            crds = with_conversion(crds, self.paths["kueue-conversion.yaml"].read_text(), self.webhook_port)
        if self.unserved:
            crds = unserve(crds, self.unserved)
        path = self.home / "crds.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(crds)
        self.cluster.install_crds(path)

    def _settings(self) -> dict[str, Any]:
        # Until Kueue's own certificate is copied in: any one, so the webhook server starts.
        pki.webhook_serving(self.home / "certs", "placeholder")
        return {"namespace": KUEUE_NAMESPACE, "internalCertManagement": {"enable": True},
                "integrations": {"frameworks": ["batch/job"]},
                "featureGates": {"VisibilityOnDemand": False}}

    def _before_start(self) -> None:
        """Its namespace, its webhook Service (to 127.0.0.1), its certificate Secret (empty, or
        as an earlier start left it) and its webhook configurations, for it to inject its CA into."""
        metadata = {"namespace": KUEUE_NAMESPACE}
        self.cluster.kubectl("apply", "--server-side", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": KUEUE_SERVICE, **metadata},
                 "spec": {"type": "ExternalName", "externalName": "127.0.0.1"}},
                {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": KUEUE_SECRET, **metadata}}]}))
        self._apply(kueue_webhook_configurations(self.paths, self.webhook_port))

    def _get(self, path: str) -> dict[str, Any]:
        code, body = self.cluster.request(path)
        return body if code == 200 and isinstance(body, dict) else {}

    def _ready(self, timeout: float) -> None:
        """Ready, Kueue has made its certificate and injected its CA (it waits for both): copy the
        certificate into its ``certDir``, and wait until the webhook server serves it and both
        webhook configurations trust its CA."""
        secret = self._get(SECRETS.path(KUEUE_NAMESPACE, KUEUE_SECRET))
        data = {k: base64.b64decode(v) for k, v in secret.get("data", {}).items()}
        certs = self.home / "certs"
        # The key first: the manager reloads the pair when the certificate changes.
        (certs / "tls.key").write_bytes(data["tls.key"])
        (certs / "tls.crt").write_bytes(data["tls.crt"])
        want = ssl.PEM_cert_to_DER_cert(data["tls.crt"].decode())
        ca = base64.b64encode(data["ca.crt"]).decode()

        def trusted() -> bool:
            served = ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", self.webhook_port)))
            injected = {w["clientConfig"].get("caBundle") for c in self._configurations for w in self._get(
                f"/apis/admissionregistration.k8s.io/v1/{c['kind'].lower()}s/{c['metadata']['name']}")["webhooks"]}
            return served == want and injected == {ca}

        self._wait("webhook server serving, and its webhook configurations trusting, the certificate in its Secret",
                   trusted, timeout)
