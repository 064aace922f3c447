"""A real node beside the KWOK ones: containerd, runc, a CNI bridge, the kubelet and kube-proxy,
registered with a local control plane started with ``Options(node_address=...)``.

Pods get addresses on a bridge of this machine (``POD_CIDR``, its gateway is the node's address
and the API server's advertised address), with no route or masquerade toward anything outside:
guard chains drop forwarded traffic that leaves the pod network, and host connections that a
Service would send elsewhere. One real node per machine at a time (the bridge, kube-proxy's
iptables chains and a few sysctls are global): a lock file says who holds them.

Everything else lives in the node's directory; ``stop()`` removes what is global (processes, pod
sandboxes through CRI so the CNI DEL runs, mounts, the bridge, iptables chains, conntrack entries,
cgroups, the sysctls the kubelet and the bridge plugin changed) and checks that nothing is left.

This machine's quirks, as the configuration below says where it meets them: cgroup v1 (the
kubelet needs ``failCgroupV1: false``), root without CAP_SYS_RESOURCE (no negative oom_score_adj,
RLIMIT_NOFILE as it is), iptables rules in the legacy backend.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path
from typing import TextIO

from . import pki
from .build import KUBERNETES_NODE, NODE_COMPONENTS, cache_root, ensure_binaries, go_binary
from .cluster import LocalCluster, Process, wait_until

NODE_ADDRESS = "10.88.0.1"  # the bridge's address: the node's InternalIP and the API server's
POD_CIDR = "10.88.0.0/16"
SERVICE_CIDR = "10.0.0.0/24"  # the control plane's --service-cluster-ip-range
BRIDGE = "nws0"
CHAIN = "NWS-NODE"
PAUSE_IMAGE = "localhost/localkube/pause:3.10"
# The real node's label and taint: only pods that ask for it (a nodeSelector and a toleration) run
# there; the rest stay on KWOK nodes, where any image "runs".
NODE_LABEL = "localkube.local/real-node"
NODE_TAINT = f"{NODE_LABEL}=true:NoSchedule"
POD_PLACEMENT = {"nodeSelector": {NODE_LABEL: "true"},
                 "tolerations": [{"key": NODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}]}
LOCK = Path("/run/localkube-node.lock")
SHIM_SOCKETS = Path("/run/localkube-node")  # containerd wants this at most 42 characters long
# Written by the kubelet (pod log links) and the CNI plugins (results) wherever they are configured.
FIXED_PATHS = (Path("/var/log/containers"), Path("/var/lib/cni/results"), Path("/var/lib/cni"))
IPTABLES_TOOLS = ("iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore")
SYSCTLS = ("vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
           "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes", "net.ipv4.ip_forward",
           "net.ipv4.conf.all.route_localnet", "net.bridge.bridge-nf-call-iptables")
DEBIAN_PACKAGES = ("runc", "containernetworking-plugins", "conntrack", "iptables", "podman")
CNI_BIN = Path("/usr/lib/cni")


class NodeError(RuntimeError):
    """The node cannot start here; the message says what is missing."""


def _with_sbin(path: str) -> str:
    """The system directories too (sysctl, modprobe, ip): a user's PATH may lack them."""
    parts = path.split(os.pathsep) if path else []
    return os.pathsep.join(parts + [d for d in ("/usr/sbin", "/sbin") if d not in parts])


def _run(*cmd: str, check: bool = True, env: dict[str, str] | None = None, cwd: Path | None = None,
         ) -> subprocess.CompletedProcess[str]:
    env = {**(env or os.environ), "PATH": _with_sbin((env or os.environ).get("PATH", ""))}
    return subprocess.run(cmd, capture_output=True, text=True, check=check, env=env, cwd=cwd)


def missing_host_parts() -> list[str]:
    """What the machine lacks for a real node (root, Debian's runc, CNI plugins, ...)."""
    missing = [] if os.geteuid() == 0 else ["root (the kubelet and containerd run as root)"]
    if shutil.which("runc", path=_with_sbin(os.environ.get("PATH", ""))) is None:
        missing.append("runc (Debian package runc)")
    if not (CNI_BIN / "bridge").exists():
        missing.append(f"{CNI_BIN}/bridge (Debian package containernetworking-plugins)")
    for tool in ("iptables-legacy", "conntrack", "podman"):
        if shutil.which(tool, path=_with_sbin(os.environ.get("PATH", ""))) is None:
            missing.append(f"{tool} (Debian packages: {' '.join(DEBIAN_PACKAGES)})")
    return missing


def _chains() -> set[tuple[str, str, str]]:
    """(tool, table, chain) of every user-defined iptables chain (legacy backend, IPv4 and IPv6)."""
    found = set()
    for tool in ("iptables-legacy", "ip6tables-legacy"):
        for table in ("filter", "nat", "mangle", "raw"):
            for rule in _run(tool, "-t", table, "-S", check=False).stdout.splitlines():
                if rule.startswith("-N "):
                    found.add((tool, table, rule.split()[1]))
    return found


def _kubepods() -> list[Path]:
    """The kubelet's cgroup trees (cgroupfs driver): one per controller on v1, one on v2."""
    return [*Path("/sys/fs/cgroup").glob("*/kubepods"), *Path("/sys/fs/cgroup").glob("kubepods")]


def _mounts_under(directory: Path) -> list[str]:
    return [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(f"{directory}/")]


def pause_image() -> Path:
    """The sandbox image, built once from the kubernetes module's own pause.c (static) with podman:
    no registry is needed. Cached as an OCI archive by Kubernetes version."""
    version = KUBERNETES_NODE.version
    archive = cache_root() / "images" / f"pause-{version}.oci.tar"
    if archive.exists():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    go = go_binary()
    source = _run(go, "list", "-m", "-f", "{{.Dir}}", KUBERNETES_NODE.module, cwd=KUBERNETES_NODE.dir).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        _run("gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION={version}", "-o", f"{tmp}/pause",
             f"{source}/build/pause/linux/pause.c")
        _run("strip", f"{tmp}/pause")
        Path(tmp, "Containerfile").write_text('FROM scratch\nCOPY pause /pause\nUSER 65535:65535\n'
                                              'ENTRYPOINT ["/pause"]\n')
        _run("podman", "build", "--isolation=chroot", "--pull=never", "-t", PAUSE_IMAGE, tmp)
        _run("podman", "save", "--format", "oci-archive", "-o", f"{archive}.tmp", PAUSE_IMAGE)
    os.replace(f"{archive}.tmp", archive)
    return archive


def _kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "default", "context": {"cluster": "local", "user": user}}],
        "current-context": "default",
    }))
    return path


class RealNode:
    def __init__(self, cluster: LocalCluster, name: str = "node-real", binaries: dict[str, Path] | None = None) -> None:
        if cluster.options.node_address != NODE_ADDRESS:
            raise NodeError(f"the control plane must be started with Options(node_address={NODE_ADDRESS!r})")
        self.cluster = cluster
        self.name = name
        self.binaries = binaries or ensure_binaries(NODE_COMPONENTS)
        self.dir = cluster.workdir / "node"
        self.sock = self.dir / "run/containerd/containerd.sock"
        self.processes: dict[str, Process] = {}
        self._chains_before: set[tuple[str, str, str]] = set()
        self._entries_before: dict[Path, set[Path] | None] = {}
        self._lock: TextIO | None = None  # the machine's lock file, open while this node holds it
        self._saved_sysctls: dict[str, str] = {}

    # -- start -------------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> RealNode:
        missing = missing_host_parts()
        if missing:
            raise NodeError("a real node needs: " + "; ".join(missing) + " (make node-tools installs them)")
        self._take_lock()
        try:
            self._refuse_foreign_node()
            self._snapshot()
            self._prepare()
            self._start_containerd()
            self.load_image(pause_image())
            self._start_kubelet_and_proxy()
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _take_lock(self) -> None:
        lock = LOCK.open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip()
            lock.close()
            raise NodeError(f"another real node runs on this machine ({LOCK}: {holder})") from None
        lock.truncate(0)
        lock.write(f"pid {os.getpid()}, {self.dir}\n")
        lock.flush()
        self._lock = lock

    def _refuse_foreign_node(self) -> None:
        """Another kubelet or kube-proxy on this machine (not ours: we hold the lock) would share
        what the teardown removes."""
        foreign = [str(p) for p in (Path("/var/lib/kubelet"), *_kubepods()) if p.exists()]
        foreign += ["KUBE- iptables chains"] if any(chain.startswith("KUBE-") for _, _, chain in _chains()) else []
        if foreign:
            raise NodeError(f"another kubelet or kube-proxy has state on this machine: {', '.join(foreign)}")

    def _snapshot(self) -> None:
        """What exists before the node: the teardown removes only what came after."""
        self._chains_before = _chains()
        self._entries_before = {d: set(d.iterdir()) if d.is_dir() else None for d in FIXED_PATHS}

    def _path(self, *parts: str) -> Path:
        path = self.dir.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def env(self) -> dict[str, str]:
        # The legacy iptables backend for everything the node runs: the machine's rules live there,
        # and Debian's default `iptables` is the nft one. A PATH of its own keeps the system as is.
        # containerd finds its shim on the PATH.
        shim = self.binaries["containerd-shim-runc-v2"].parent
        return {**os.environ, "PATH": _with_sbin(f"{self.dir / 'sbin'}:{shim}:{os.environ.get('PATH', '')}")}

    def _prepare(self) -> None:
        sbin = self._path("sbin")
        for tool in IPTABLES_TOOLS:
            target = re.sub(r"^(ip6?tables)", r"\1-legacy", tool)
            (sbin / tool).unlink(missing_ok=True)
            (sbin / tool).symlink_to(f"/usr/sbin/{target}")
        if shutil.which("modprobe", path=_with_sbin(os.environ.get("PATH", ""))):  # else built in, or absent
            _run("modprobe", "br_netfilter", check=False)
        values = {k: _run("sysctl", "-n", k, check=False).stdout.strip() for k in SYSCTLS}
        self._saved_sysctls = {k: v for k, v in values.items() if v}
        if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
            _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "replace", f"{NODE_ADDRESS}/16", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        _run("sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1")
        self._guard_rules()
        self._write_configs()

    def _guard_rules(self) -> None:
        """Nothing outside reaches the API server (bound on every address) or the kubelet, and
        nothing from a pod, or sent by a Service toward an address that is not here, leaves."""
        port = self.cluster.server.rsplit(":", 1)[1]
        closed = ["-i lo -j RETURN", f"-i {BRIDGE} -j RETURN", f"-p tcp -m multiport --dports {port},10250 -j DROP"]
        rules = [  # (tool, built-in chain, rules); the API server's wildcard socket takes IPv6 too
            ("iptables-legacy", "INPUT", closed),
            ("ip6tables-legacy", "INPUT", closed),
            ("iptables-legacy", "FORWARD", [f"-s {POD_CIDR} -d {POD_CIDR} -j RETURN", f"-s {POD_CIDR} -j DROP",
                                            f"-d {POD_CIDR} -j DROP"]),
            ("iptables-legacy", "OUTPUT", ["-o lo -j RETURN", f"-o {BRIDGE} -j RETURN",
                                           "-m conntrack --ctstate DNAT -j DROP"]),
        ]
        for tool, parent, lines in rules:
            chain = f"{CHAIN}-{parent[:3]}"
            _run(tool, "-N", chain, check=False)
            _run(tool, "-F", chain)
            for line in lines:
                _run(tool, "-A", chain, *line.split())
            if _run(tool, "-C", parent, "-j", chain, check=False).returncode != 0:
                _run(tool, "-I", parent, "1", "-j", chain)

    def _write_configs(self) -> None:
        d, p = self.dir, self.cluster._pki
        assert p is not None
        certs = self._path("pki")
        kcrt, kkey = pki.client_cert(p, certs, "kubelet", f"system:node:{self.name}", "system:nodes")
        pcrt, pkey = pki.client_cert(p, certs, "kube-proxy", "system:kube-proxy")
        server = f"https://{NODE_ADDRESS}:{self.cluster.server.rsplit(':', 1)[1]}"
        self.kubelet_kubeconfig = _kubeconfig(certs / "kubelet.kubeconfig", server, p.ca_cert, kcrt, kkey, "kubelet")
        self.proxy_kubeconfig = _kubeconfig(certs / "kube-proxy.kubeconfig", server, p.ca_cert, pcrt, pkey,
                                            "kube-proxy")
        (self._path("etc/cni/net.d") / "10-localkube.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "localkube",
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "dataDir": str(self._path("var/lib/cni/networks")),
                          "ranges": [[{"subnet": POD_CIDR, "rangeStart": "10.88.0.10", "gateway": NODE_ADDRESS}]],
                          "routes": [{"dst": SERVICE_CIDR}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }))
        run = self._path("run/containerd")
        (self._path("etc/containerd") / "config.toml").write_text(textwrap.dedent(f"""\
            version = 4
            root = "{self._path('var/lib/containerd')}"
            state = "{run}"
            imports = []
            disabled_plugins = ["io.containerd.nri.v1.nri"]  # NRI would open /var/run/nri/nri.sock
            [plugins.'io.containerd.server.v1.grpc']
              address = "{self.sock}"
            [plugins.'io.containerd.server.v1.ttrpc']
              address = "{run}/containerd.sock.ttrpc"
            [plugins.'io.containerd.server.v1.debug']
              address = ""
            [plugins.'io.containerd.server.v1.metrics']
              address = ""
            [plugins.'io.containerd.shim.v1.manager']
              socket_dir = "{SHIM_SOCKETS}"
            [plugins.'io.containerd.internal.v1.opt']
              path = "{self._path('var/lib/containerd-opt')}"
            [plugins.'io.containerd.cri.v1.images']
              snapshotter = "overlayfs"
              [plugins.'io.containerd.cri.v1.images'.pinned_images]
                sandbox = "{PAUSE_IMAGE}"
              [plugins.'io.containerd.cri.v1.images'.registry]
                config_path = ""
            [plugins.'io.containerd.cri.v1.runtime']
              enable_selinux = false
              disable_apparmor = true
              # Root here lacks CAP_SYS_RESOURCE: a negative oom_score_adj (kubelet asks -998 for
              # sandboxes) fails in runc init. Clamp every container's to containerd's own.
              restrict_oom_score_adj = true
              netns_mounts_under_state_dir = true
              cdi_spec_dirs = []
              [plugins.'io.containerd.cri.v1.runtime'.containerd]
                default_runtime_name = "runc"
                [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
                  runtime_type = "io.containerd.runc.v2"
                  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
                    BinaryName = "{shutil.which('runc', path=_with_sbin(os.environ.get('PATH', '')))}"
                    Root = "{self._path('run/runc')}"
                    SystemdCgroup = false
              [plugins.'io.containerd.cri.v1.runtime'.cni]
                bin_dirs = ["{CNI_BIN}"]
                conf_dir = "{d / 'etc/cni/net.d'}"
            [plugins.'io.containerd.grpc.v1.cri']
              stream_server_address = "127.0.0.1"
              stream_server_port = "0"
            """))
        (self._path("etc/kubelet") / "config.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": "/", "cgroupsPerQOS": True,
            "failSwapOn": False, "containerRuntimeEndpoint": f"unix://{self.sock}",
            "imageServiceEndpoint": f"unix://{self.sock}", "podLogsDir": str(self._path("var/log/pods")),
            "staticPodPath": "", "address": NODE_ADDRESS, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(p.ca_cert)}},
            "authorization": {"mode": "Webhook"},
            "clusterDomain": "cluster.local", "clusterDNS": [],
            "resolvConf": "",  # pods get no nameserver of this machine's: it is outside
            "hairpinMode": "hairpin-veth", "maxPods": 110,
            "protectKernelDefaults": False,
            "oomScoreAdj": 0, "maxOpenFiles": 20000,  # no CAP_SYS_RESOURCE for -999 or a higher limit
            "makeIPTablesUtilChains": True, "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "10s", "nodeStatusReportFrequency": "1m",
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "mergeDefaultEvictionSettings": False, "enforceNodeAllocatable": ["pods"],
            "shutdownGracePeriod": "0s",
        }))
        (self._path("etc/kube-proxy") / "config.yaml").write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "mode": "iptables", "clientConnection": {"kubeconfig": str(self.proxy_kubeconfig)},
            "hostnameOverride": self.name, "bindAddress": NODE_ADDRESS,
            "healthzBindAddress": "127.0.0.1:10256", "metricsBindAddress": "127.0.0.1:10249",
            "clusterCIDR": POD_CIDR, "detectLocalMode": "ClusterCIDR", "oomScoreAdj": 0,
            "nodePortAddresses": [f"{NODE_ADDRESS}/32"],
            # localhostNodePorts would set net.ipv4.conf.all.route_localnet=1
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False, "syncPeriod": "30s",
                         "minSyncPeriod": "0s"},
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},  # 0: the kernel's conntrack sysctls stay
        }))

    def _spawn(self, name: str, argv: list[str]) -> Process:
        proc = Process(name, argv, self.cluster.workdir / "logs", env=self.env)
        self.processes[name] = proc
        proc.start()
        return proc

    def _start_containerd(self) -> None:
        containerd = self._spawn("containerd", [str(self.binaries["containerd"]), "--config",
                                                str(self.dir / "etc/containerd/config.toml")])
        wait_until("containerd", lambda: self.ctr("version", check=False).returncode == 0, 30, [containerd])

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(str(self.binaries["ctr"]), "--address", str(self.sock), "-n", "k8s.io", *args, check=check)

    def load_image(self, archive: Path) -> None:
        """An OCI archive (``podman save --format oci-archive``, ``python -m deploy.image --save``)
        into the node's containerd: pods with ``imagePullPolicy: Never`` or IfNotPresent use it."""
        self.ctr("images", "import", str(archive))

    def _start_kubelet_and_proxy(self) -> None:
        self._spawn("kubelet", [
            str(self.binaries["kubelet"]), f"--config={self.dir / 'etc/kubelet/config.yaml'}",
            f"--kubeconfig={self.kubelet_kubeconfig}", f"--root-dir={self._path('var/lib/kubelet')}",
            f"--cert-dir={self._path('var/lib/kubelet/pki')}", f"--hostname-override={self.name}",
            f"--node-ip={NODE_ADDRESS}", f"--node-labels={NODE_LABEL}=true", f"--register-with-taints={NODE_TAINT}",
            "--v=2"])
        self._spawn("kube-proxy", [str(self.binaries["kube-proxy"]),
                                   f"--config={self.dir / 'etc/kube-proxy/config.yaml'}", "--v=2"])

    def _wait_ready(self, timeout: float) -> None:
        def ready() -> bool:
            proc = self.cluster.kubectl("get", "node", self.name, "-o",
                                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}", check=False)
            return proc.stdout.strip() == "True"
        wait_until(f"node {self.name} Ready", ready, timeout, list(self.processes.values()))

    # -- stop --------------------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Tear everything down; returns what could not be removed ([] when the machine is as before).
        A node that does not hold the machine's lock (never started, or stopped) touches nothing;
        of the shared places (iptables chains, /var/lib/cni, ...) only what came after its start goes."""
        if self._lock is None:
            return []
        try:
            self._stop_processes()
            self._unmount()
            _run("ip", "link", "del", BRIDGE, check=False)
            self._remove_iptables()
            for cidr in (("-s", POD_CIDR), ("-d", POD_CIDR)):  # the pods' flows, Service ones included
                _run("conntrack", "-D", *cidr, check=False)
            for tree in _kubepods():
                _run("find", str(tree), "-depth", "-type", "d", "-exec", "rmdir", "{}", ";", check=False)
            shutil.rmtree("/var/lib/kubelet", ignore_errors=True)  # its device-plugins directory is fixed
            shutil.rmtree(SHIM_SOCKETS, ignore_errors=True)
            self._remove_new_entries()
            for key, value in self._saved_sysctls.items():
                _run("sysctl", "-qw", f"{key}={value}", check=False)
        finally:
            self._lock.close()
            self._lock = None
        return self.leftovers()

    def _stop_processes(self) -> None:
        self.cluster.kubectl("delete", "node", self.name, "--wait=false", "--request-timeout=5s", check=False)
        for name in ("kube-proxy", "kubelet"):
            if name in self.processes:
                self.processes[name].stop(timeout=10)
        if self.sock.exists() and "crictl" in self.binaries:
            crictl = [str(self.binaries["crictl"]), "--runtime-endpoint", f"unix://{self.sock}", "--timeout", "30s"]
            _run(*crictl, "rm", "-af", check=False)
            _run(*crictl, "rmp", "-af", check=False)  # the CNI DEL: veth, IP lease, portmap rules
        if "containerd" in self.processes:
            self.processes["containerd"].stop(timeout=10)
        self._kill_leftover_shims()

    def _remove_new_entries(self) -> None:
        """What the kubelet and the CNI plugins wrote in their fixed places since the start."""
        for fixed in FIXED_PATHS:
            before = self._entries_before.get(fixed)
            for entry in set(fixed.iterdir()) - (before or set()) if fixed.is_dir() else ():
                if entry.is_symlink() or entry.is_file():
                    entry.unlink()
                else:
                    shutil.rmtree(entry, ignore_errors=True)
            if before is None and fixed.is_dir() and not any(fixed.iterdir()):
                fixed.rmdir()

    def _kill_leftover_shims(self) -> None:
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "containerd-shim-runc-v2" in cmdline and str(self.sock) in cmdline:
                _run("kill", "-KILL", proc.name, check=False)
        runc_root = self.dir / "run/runc"
        for namespace in runc_root.glob("*") if runc_root.exists() else ():
            for cid in _run("runc", "--root", str(namespace), "list", "-q", check=False).stdout.split():
                _run("runc", "--root", str(namespace), "delete", "-f", cid, check=False)

    def _unmount(self) -> None:
        for _ in range(3):
            mounts = _mounts_under(self.dir)
            if not mounts:
                return
            for m in sorted(mounts, reverse=True):
                if _run("umount", m, check=False).returncode != 0:
                    _run("umount", "-l", m, check=False)

    def _remove_iptables(self) -> None:
        """kube-proxy's own cleanup, then every chain that came after the start (kube-proxy's, the
        kubelet's, the CNI plugins', the guards) and the rules that jump to them."""
        if "kube-proxy" in self.binaries:
            _run(str(self.binaries["kube-proxy"]), "--cleanup", "--v=0", check=False, env=self.env)
        new = _chains() - self._chains_before
        for tool, table in {(tool, table) for tool, table, _ in new}:
            names = {chain for t, tb, chain in new if (t, tb) == (tool, table)}
            for rule in _run(tool, "-t", table, "-S", check=False).stdout.splitlines():
                parts = shlex.split(rule)  # --comment "..." holds spaces
                if parts[:1] == ["-A"] and parts[1] not in names and "-j" in parts \
                        and parts[parts.index("-j") + 1] in names:
                    _run(tool, "-t", table, "-D", *parts[1:], check=False)
            for verb in ("-F", "-X"):
                for chain in names:
                    _run(tool, "-t", table, verb, chain, check=False)

    def leftovers(self) -> list[str]:
        left = []
        if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
            left.append(f"interface {BRIDGE}")
        left += [f"iptables {tool} {table} {chain}" for tool, table, chain in _chains() - self._chains_before]
        left += [f"mount {m}" for m in _mounts_under(self.dir)]
        left += [f"{n} still running" for n, p in self.processes.items() if p.running()]
        left += [str(p) for p in (SHIM_SOCKETS, Path("/var/lib/kubelet"), *_kubepods()) if p.exists()]
        for fixed in FIXED_PATHS:
            before = self._entries_before.get(fixed)
            left += [str(e) for e in (set(fixed.iterdir()) - (before or set()) if fixed.is_dir() else ())]
        return left

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
