"""A real Kubernetes control plane on loopback: etcd + kube-apiserver with TLS and an admin
kubeconfig, optionally kube-controller-manager, kube-scheduler and KWOK (fake kubelets).

Every child runs with PR_SET_PDEATHSIG=SIGKILL, so even a SIGKILLed parent leaves no process
behind; the working directory lives on tmpfs and stale ones of dead parents are swept at start.
PDEATHSIG follows the *thread* that started the child: start a cluster from a thread that
outlives it (the main thread in tests and commands).
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from . import pki
from .build import CORE, KUBERNETES_CONTROLLERS, KWOK, ensure_binaries

_PR_SET_PDEATHSIG = 1
_WORKDIR_PREFIX = "localkube-"


# The in-tree Workload API (scheduling.k8s.io/v1beta1 Workload and PodGroup): beta and off by default in
# Kubernetes 1.37 and 1.38.0-beta.0 alike, behind its GenericWorkload feature gate and with the group
# version disabled (docs/kubectl.md, from their sources). Options.workload_api turns both on.
WORKLOAD_API_MINORS = ("1.37", "1.38")
WORKLOAD_API_ARGS = ("--feature-gates=GenericWorkload=true", "--runtime-config=scheduling.k8s.io/v1beta1=true")


APISERVER_STOP_GRACE = 2.0  # seconds kube-apiserver has to exit on SIGTERM when the cluster stops


class ClusterError(RuntimeError):
    """The control plane (or one of its processes) failed to start or stopped unexpectedly."""


@dataclass
class Options:
    controller_manager: bool = False
    scheduler: bool = False
    kwok: bool = False
    # Controllers for kube-controller-manager. The node lifecycle controller is off by default:
    # tests set node conditions themselves and must not have them overwritten after 40 s.
    controllers: str = "*,-node-lifecycle-controller"
    workdir: Path | None = None  # default: a fresh directory on /dev/shm
    keep_workdir: bool = False
    start_timeout: float = 90.0
    extra_apiserver_args: list[str] = field(default_factory=list)
    # Serve the in-tree Workload API (WORKLOAD_API_ARGS; a kube-apiserver of WORKLOAD_API_MINORS).
    workload_api: bool = False
    # Real nodes (kubelet + kube-proxy + containerd): the host address that pods reach the API
    # server at (the pod bridge's gateway, e.g. 10.88.0.1). Set, the API server binds 0.0.0.0,
    # advertises this address (the `kubernetes` Service's endpoint, kept by the lease reconciler),
    # has it in its serving certificate, authorizes kubelets with the Node authorizer, and keeps
    # the ServiceAccount admission plugin (pods get their token volume).
    node_address: str | None = None


def set_parent_death_signal(sig: int) -> None:
    """Have the kernel send ``sig`` to this process when the thread that started it dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)


def _die_with_parent() -> None:  # preexec_fn of every child
    set_parent_death_signal(signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tmp_root() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def _sweep_stale_workdirs() -> None:
    """Remove working directories left by parents that were killed before they could clean up."""
    for path in _tmp_root().glob(f"{_WORKDIR_PREFIX}*"):
        owner = path / "owner.pid"
        try:
            pid = int(owner.read_text())
        except (OSError, ValueError):
            continue
        if not Path(f"/proc/{pid}").exists():
            shutil.rmtree(path, ignore_errors=True)


# Every child started by this Python process, pid -> executable, to prove none outlives stop().
_started: dict[int, str] = {}


def _alive(pid: int, exe: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and cmdline.split(b"\0", 1)[0].decode(errors="replace") == exe


def leftover_processes() -> list[tuple[int, str]]:
    """Children started by this process (any LocalCluster) that are still running."""
    return [(pid, exe) for pid, exe in _started.items() if _alive(pid, exe)]


class Process:
    """One child process with its log file, started with the same arguments on every restart."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}.log"
        self.env = env  # None: this process's environment
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = self.log_path.open("ab")
        try:
            self.popen = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                preexec_fn=_die_with_parent,
            )
            _started[self.popen.pid] = self.argv[0]
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.popen = None


def wait_until(what: str, check: Callable[[], bool], timeout: float, procs: list[Process]) -> None:
    """Until ``check()`` holds, or a ClusterError: one of ``procs`` exited (its log tail said) or
    ``timeout`` passed (with the last error the check raised)."""
    deadline = time.monotonic() + timeout
    last_error: object = None
    while time.monotonic() < deadline:
        for proc in procs:
            if not proc.running():
                raise ClusterError(f"{proc.name} exited while waiting for {what}:\n{proc.log_tail()}")
        try:
            if check():
                return
        except (OSError, urllib.error.URLError, ssl.SSLError) as err:
            last_error = err
        time.sleep(0.1)
    tails = "\n".join(f"--- {p.name} ---\n{p.log_tail()}" for p in procs)
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what} (last error: {last_error})\n{tails}")


class LocalCluster:
    """Start with ``with LocalCluster(Options(...)) as cluster:`` or ``start()``/``stop()``."""

    def __init__(self, options: Options | None = None, binaries: dict[str, Path] | None = None) -> None:
        self.options = options or Options()
        self._binaries = binaries
        self.processes: dict[str, Process] = {}
        self.workdir = Path()
        self.kubeconfig = Path()
        self.server = ""
        self.etcd_url = ""
        self._pki: pki.Pki | None = None
        self._ssl: ssl.SSLContext | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        binaries = self._binaries or ensure_binaries(CORE)
        optional = ((KUBERNETES_CONTROLLERS, self.options.controller_manager or self.options.scheduler),
                    (KWOK, self.options.kwok))
        needed = tuple(c for c, wanted in optional if wanted and not set(c.names) <= binaries.keys())
        if needed:  # built (or waited for, while a background build makes them) on first use
            binaries = {**ensure_binaries(needed), **binaries}  # what was given wins (a test's stand-in)
        self._binaries = binaries
        _sweep_stale_workdirs()
        if self.options.workdir:
            self.workdir = self.options.workdir
            if self.workdir.exists() and any(self.workdir.iterdir()):
                raise ClusterError(f"working directory {self.workdir} is not empty")
            self.workdir.mkdir(parents=True, exist_ok=True)
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX, dir=_tmp_root()))
        (self.workdir / "owner.pid").write_text(str(os.getpid()))
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        try:
            extra_ips = (self.options.node_address,) if self.options.node_address else ()
            self._pki = pki.generate(self.workdir / "pki", extra_ips=extra_ips)
            self._start_etcd(binaries, logs)
            self._start_apiserver(binaries, logs)
            self._write_kubeconfig()
            if self.options.controller_manager:
                self._start_controller_manager(binaries, logs)
            if self.options.scheduler:
                self._start_scheduler(binaries, logs)
            if self.options.kwok:
                self._start_kwok(binaries, logs)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process (reverse start order) and remove the working directory."""
        for proc in reversed(list(self.processes.values())):
            # On SIGTERM kube-apiserver waits for its open watches for up to its request timeout (60 s):
            # a client still watching (a service stopped later, a test's reflector) would hold every
            # teardown; etcd keeps the state, so it is killed after a short grace.
            proc.stop(timeout=APISERVER_STOP_GRACE if proc.name == "kube-apiserver" else 10.0)
        if self.workdir != Path() and not self.options.keep_workdir and not self.options.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes.values() if p.pid is not None]

    # -- components ------------------------------------------------------------------------

    def _start_etcd(self, binaries: dict[str, Path], logs: Path) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        proc = Process("etcd", [
            str(binaries["etcd"]),
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync",  # tmpfs anyway; durability is not a test concern
            "--quota-backend-bytes=8589934592",
            "--log-level=warn",
        ], logs)
        self.processes["etcd"] = proc
        proc.start()
        self._wait_http(proc, f"{self.etcd_url}/health")

    def _start_apiserver(self, binaries: dict[str, Path], logs: Path) -> None:
        assert self._pki
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        p = self._pki
        node = self.options.node_address
        if node:
            real_node_args = [
                "--bind-address=0.0.0.0",
                f"--advertise-address={node}",
                "--endpoint-reconciler-type=lease",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--disable-admission-plugins=TaintNodesByCondition",
                # `kubectl logs/exec` on real pods: the API server's client certificate to kubelets.
                f"--kubelet-client-certificate={p.admin_cert}",
                f"--kubelet-client-key={p.admin_key}",
                # Reach kubelets at their InternalIP: the default tries the Hostname first, a DNS
                # lookup to the machine's resolver, which does not know the node.
                "--kubelet-preferred-address-types=InternalIP,Hostname",
            ]
        else:
            real_node_args = [
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--authorization-mode=RBAC",
                # No kubelets mount tokens here, so pods need not wait for default ServiceAccounts; and
                # with the node lifecycle controller off nothing would lift the not-ready taint that
                # TaintNodesByCondition puts on new nodes.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--endpoint-reconciler-type=none",
            ]
        proc = Process("kube-apiserver", [
            str(binaries["kube-apiserver"]),
            f"--etcd-servers={self.etcd_url}",
            *real_node_args,
            f"--secure-port={port}",
            f"--tls-cert-file={p.serving_cert}",
            f"--tls-private-key-file={p.serving_key}",
            f"--client-ca-file={p.ca_cert}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}",
            "--allow-privileged=true",
            "--max-requests-inflight=2000",
            "--max-mutating-requests-inflight=1000",
            "--profiling=false",
            *(WORKLOAD_API_ARGS if self.options.workload_api else ()),
            *self.options.extra_apiserver_args,
        ], logs)
        self.processes["kube-apiserver"] = proc
        self._ssl = ssl.create_default_context(cafile=str(p.ca_cert))
        self._ssl.load_cert_chain(str(p.admin_cert), str(p.admin_key))
        proc.start()
        self.wait_apiserver_ready()

    def wait_apiserver_ready(self) -> None:
        procs = [self.processes["etcd"], self.processes["kube-apiserver"]]
        wait_until("kube-apiserver /readyz", lambda: self._http_ok(f"{self.server}/readyz"),
                   self.options.start_timeout, procs)
        wait_until("namespace default", lambda: self._http_ok(f"{self.server}/api/v1/namespaces/default"),
                   self.options.start_timeout, procs)

    def _wait_http(self, proc: Process, url: str) -> None:
        """Wait for a component's health endpoint (its serving certificate is self-signed)."""
        wait_until(f"{proc.name} {url}", lambda: self._http_ok(url, verify=False), self.options.start_timeout, [proc])

    def _component_args(self, port: int) -> list[str]:
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={port}",
            "--leader-elect=false",
            "--kube-api-qps=1000",
            "--kube-api-burst=2000",
        ]

    def _start_controller_manager(self, binaries: dict[str, Path], logs: Path) -> None:
        assert self._pki
        port = free_port()
        proc = Process("kube-controller-manager", [
            str(binaries["kube-controller-manager"]),
            *self._component_args(port),
            f"--controllers={self.options.controllers}",
            f"--service-account-private-key-file={self._pki.sa_key}",
            f"--root-ca-file={self._pki.ca_cert}",
            f"--cluster-signing-cert-file={self._pki.ca_cert}",
            f"--cluster-signing-key-file={self._pki.ca_key}",
            "--concurrent-deployment-syncs=20",
            "--concurrent-replicaset-syncs=20",
            "--concurrent-gc-syncs=50",
        ], logs)
        self.processes["kube-controller-manager"] = proc
        proc.start()
        self._wait_http(proc, f"https://127.0.0.1:{port}/healthz")

    def _start_scheduler(self, binaries: dict[str, Path], logs: Path) -> None:
        port = free_port()
        proc = Process("kube-scheduler", [str(binaries["kube-scheduler"]), *self._component_args(port)], logs)
        self.processes["kube-scheduler"] = proc
        proc.start()
        self._wait_http(proc, f"https://127.0.0.1:{port}/readyz")

    def _start_kwok(self, binaries: dict[str, Path], logs: Path) -> None:
        port = free_port()
        proc = Process("kwok", [
            str(binaries["kwok"]),
            f"--kubeconfig={self.kubeconfig}",
            f"--config={binaries['kwok-stages.yaml']}",
            "--manage-all-nodes=false",
            # Only nodes annotated like this get fake kubelets; tests own the status of others.
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            f"--server-address=127.0.0.1:{port}",
            "--node-ip=10.0.1.1",
            "--cidr=10.1.0.0/16",
        ], logs)
        self.processes["kwok"] = proc
        proc.start()
        self._wait_http(proc, f"http://127.0.0.1:{port}/healthz")

    def _write_kubeconfig(self) -> None:
        assert self._pki
        self.kubeconfig = self.workdir / "kubeconfig"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "localkube", "cluster": {
                "server": self.server, "certificate-authority": str(self._pki.ca_cert)}}],
            "users": [{"name": "admin", "user": {
                "client-certificate": str(self._pki.admin_cert),
                "client-key": str(self._pki.admin_key)}}],
            "contexts": [{"name": "localkube", "context": {"cluster": "localkube", "user": "admin"}}],
            "current-context": "localkube",
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2))  # JSON is valid YAML

    def inline_kubeconfig(self, server: str | None = None) -> str:
        """The admin kubeconfig with its certificates and key inline (``*-data``): what a Secret
        holds (a fleet hub's member, as MultiKueue reads it). ``server``: another address (a proxy)."""
        assert self._pki
        data = {key: base64.b64encode(path.read_bytes()).decode() for key, path in (
            ("certificate-authority-data", self._pki.ca_cert), ("client-certificate-data", self._pki.admin_cert),
            ("client-key-data", self._pki.admin_key))}
        config = json.loads(self.kubeconfig.read_text())
        config["clusters"][0]["cluster"] = {"server": server or self.server,
                                            "certificate-authority-data": data["certificate-authority-data"]}
        config["users"][0]["user"] = {k: data[k] for k in ("client-certificate-data", "client-key-data")}
        return json.dumps(config, indent=2)

    # -- helpers for tests, the demo and benchmarks ----------------------------------------

    def _http_ok(self, url: str, verify: bool = True, method: str = "GET", body: bytes | None = None) -> bool:
        context = None
        if url.startswith("https://"):
            if verify:
                context = self._ssl
            else:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        request = urllib.request.Request(url, data=body, method=method)
        try:
            with urllib.request.urlopen(request, timeout=2, context=context) as resp:
                return 200 <= resp.status < 300
        except urllib.error.HTTPError:
            return False

    def request(self, path: str, method: str = "GET", body: object | None = None,
                content_type: str = "application/json") -> tuple[int, object]:
        """A raw API request as the admin user; returns (status, decoded JSON body)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=30, context=self._ssl) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    @property
    def kubectl_path(self) -> Path:
        assert self._binaries
        return self._binaries["kubectl"]

    def install_crds(self, path: Path, timeout: float = 60) -> None:
        """Apply the CRDs in ``path`` (file or directory) and wait until they are Established. One
        still being deleted (a test's cleanup deletes without waiting) is waited for and made again:
        an apply to it changes nothing, and its kind refuses every create until it is gone."""
        out = self.kubectl("apply", "--server-side", "-f", str(path), "-o", "name").stdout.split()
        got = json.loads(self.kubectl("get", *out, "-o", "json").stdout) if out else {}
        items = got.get("items", [got] if "metadata" in got else [])  # one name: the object itself
        terminating = [f"customresourcedefinition.apiextensions.k8s.io/{i['metadata']['name']}" for i in items
                       if i["metadata"].get("deletionTimestamp")]
        if terminating:
            # Up to 3 minutes: the API server's CRD finalizer retries with a growing backoff, and one
            # that met "storage is (re)initializing" (a CRD deleted just after it was made) was seen
            # to take 90 s.
            self.kubectl("wait", "--for=delete", f"--timeout={max(timeout, 180):.0f}s", *terminating,
                         timeout=max(timeout, 180) + 30)
            out = self.kubectl("apply", "--server-side", "-f", str(path), "-o", "name").stdout.split()
        deadline = time.monotonic() + timeout
        while out:
            proc = self.kubectl("wait", "--for=condition=Established", f"--timeout={timeout:.0f}s", *out, check=False)
            if proc.returncode == 0:
                return
            # A CRD whose status has no conditions yet (a loaded API server) makes kubectl wait
            # fail at once with ".status.conditions accessor error" instead of waiting: ask again.
            if "accessor error" not in proc.stderr or time.monotonic() > deadline:
                raise ClusterError(f"kubectl wait for the CRDs in {path} failed ({proc.returncode}):\n{proc.stderr}")
            time.sleep(0.2)

    def kubectl_argv(self, *args: str) -> list[str]:
        # A discovery cache of this cluster's own: kubectl's default (~/.kube/cache, by host:port)
        # would hand a later cluster on a reused port the resources of an earlier one.
        return [str(self.kubectl_path), f"--kubeconfig={self.kubeconfig}", f"--cache-dir={self.workdir / 'kube-cache'}",
                *args]

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.kubectl_argv(*args), input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    def restart_apiserver(self, down_seconds: float = 0.0, graceful: bool = False) -> None:
        """Restart kube-apiserver; in-flight watches break. By default it is killed, like a crash
        (a graceful stop waits up to ~10 s for open watches to drain)."""
        proc = self.processes["kube-apiserver"]
        proc.stop(sig=signal.SIGTERM if graceful else signal.SIGKILL)
        time.sleep(down_seconds)
        proc.start()
        self.wait_apiserver_ready()

    def _etcd_post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"{self.etcd_url}{path}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def compact_etcd(self) -> int:
        """Compact etcd at its current revision. Reads that reach etcd at an older resourceVersion
        get 410 Gone; the apiserver's watch cache may still serve recent ones."""
        header = self._etcd_post("/v3/kv/range", {"key": "AA=="})["header"]  # key "\0": any key works
        revision = int(header["revision"])
        self._etcd_post("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    def expire_resource_versions(self) -> int:
        """Make every resourceVersion issued so far too old, as after a long partition: compact
        etcd and restart kube-apiserver (its watch cache then starts at the compacted revision),
        so a watch or paged LIST from an older resourceVersion is answered with 410 Gone."""
        revision = self.compact_etcd()
        self.restart_apiserver()
        return revision
