"""Build the control plane binaries from their Go modules and cache them by version.

The pinned versions live in the wrapper modules under ``gomod/`` (their ``require`` line); the
binaries land in ``$NWS_CACHE_DIR/bin/<component>-<version>-<hash>/`` and are rebuilt only when a
wrapper's go.mod/go.sum or the Go toolchain changes.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

GOMOD_DIR = Path(__file__).parent / "gomod"


class BuildError(RuntimeError):
    """A binary could not be built (missing Go toolchain, failed compile)."""


@dataclass(frozen=True)
class Binary:
    name: str  # file name in the cache directory
    package: str  # Go package to build


@dataclass(frozen=True)
class Component:
    name: str  # wrapper module directory under gomod/
    module: str  # the Go module whose version is pinned
    binaries: tuple[Binary, ...]
    tags: str = ""
    # Files copied out of the module's source tree into the cache dir as one YAML stream.
    bundles: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Go string variables set to the pinned version, so `<binary> version` reports it.
    version_vars: tuple[str, ...] = ()
    # A Go toolchain other than the one on PATH (GOTOOLCHAIN, fetched by go through the module proxy
    # on first use): for a module whose go.mod asks for a newer Go; only its own build uses it.
    toolchain: str = ""

    @property
    def dir(self) -> Path:
        return GOMOD_DIR / self.name

    @property
    def names(self) -> tuple[str, ...]:
        """What it puts in its cache directory: its binaries and bundles, by file name."""
        return (*(b.name for b in self.binaries), *(name for name, _ in self.bundles))

    @property
    def version(self) -> str:
        text = (self.dir / "go.mod").read_text()
        match = re.search(rf"^(?:require)?\s+{re.escape(self.module)} (v\S+)", text, re.M)
        if not match:
            raise BuildError(f"{self.dir}/go.mod has no 'require {self.module} <version>' line")
        return match.group(1)

    def ldflags(self) -> str:
        if self.module != "k8s.io/kubernetes":
            return " ".join(["-s -w", *(f"-X {var}={self.version}" for var in self.version_vars)])
        v = self.version
        major, minor = v.lstrip("v").split(".")[:2]
        base = "k8s.io/component-base/version"
        return (
            f"-s -w -X {base}.gitVersion={v} -X {base}.gitMajor={major} -X {base}.gitMinor={minor}"
            f" -X {base}.gitTreeState=clean"
        )


ETCD = Component("etcd", "go.etcd.io/etcd/server/v3", (Binary("etcd", "go.etcd.io/etcd/server/v3"),))


def _kubernetes(*commands: str) -> Component:
    """Binaries of the pinned k8s.io/kubernetes (one wrapper module, one cache directory)."""
    return _kubernetes_at("kubernetes", *commands)


def _kubernetes_at(wrapper: str, *commands: str, toolchain: str = "") -> Component:
    return Component(wrapper, "k8s.io/kubernetes",
                     tuple(Binary(cmd, f"k8s.io/kubernetes/cmd/{cmd}") for cmd in commands), tags="selinux,notest",
                     toolchain=toolchain)


KUBERNETES = _kubernetes("kube-apiserver", "kubectl")
# The controllers a LocalCluster starts when its options ask (Options.controller_manager, .scheduler).
KUBERNETES_CONTROLLERS = _kubernetes("kube-controller-manager", "kube-scheduler")
KWOK = Component(
    "kwok",
    "sigs.k8s.io/kwok",
    (Binary("kwok", "sigs.k8s.io/kwok/cmd/kwok"),),
    # KWOK's own default stages (what kwokctl loads), plus its chaos stages so tests can make
    # a node NotReady or a pod Failed with a label.
    bundles=(
        (
            "kwok-stages.yaml",
            tuple(
                f"kustomize/stage/{path}.yaml"
                for path in (
                    "node/fast/node-initialize",
                    "node/heartbeat-with-lease/node-heartbeat-with-lease",
                    "node/chaos/node-not-ready",
                    "pod/fast/pod-ready",
                    "pod/fast/pod-complete",
                    "pod/fast/pod-delete",
                    "pod/chaos/pod-container-running-failed",
                )
            ),
        ),
    ),
)
CORE: tuple[Component, ...] = (ETCD, KUBERNETES)  # a bare control plane (etcd, kube-apiserver) and kubectl

# The other Kubernetes minors the compatibility suite runs against (make compat, docs/compatibility.md):
# kube-apiserver and kubectl of each, one wrapper module per minor (localkube/gomod/kubernetes-<minor>).
# KUBERNETES above is the version everything else is tested on.
COMPAT_MINORS = ("1.32", "1.33", "1.34", "1.35", "1.37", "1.38")
PINNED_MINOR = KUBERNETES.version.lstrip("v").rsplit(".", 1)[0]  # "1.36"
# The minors whose go.mod asks for a newer Go than the project's (v1.38.0-beta.0's says go 1.27.0):
# built with this toolchain, the one approved for it; every other build keeps the Go on PATH.
TOOLCHAINS = {"1.38": "go1.27.3"}


def kubernetes_minor(minor: str) -> Component:
    """kube-apiserver and kubectl of one Kubernetes minor: the pinned one, or one of COMPAT_MINORS."""
    if minor == PINNED_MINOR:
        return KUBERNETES
    if minor not in COMPAT_MINORS:
        known = ", ".join(sorted({*COMPAT_MINORS, PINNED_MINOR}))
        raise BuildError(f"no wrapper module for Kubernetes {minor}: the versions built here are {known}")
    return _kubernetes_at(f"kubernetes-{minor}", "kube-apiserver", "kubectl", toolchain=TOOLCHAINS.get(minor, ""))


def core(minor: str = "") -> tuple[Component, ...]:
    """CORE, with kube-apiserver and kubectl of ``minor`` when one is given."""
    return (ETCD, kubernetes_minor(minor)) if minor else CORE


COMPONENTS: tuple[Component, ...] = (*CORE, KUBERNETES_CONTROLLERS, KWOK)  # `localkube build`

# Not in COMPONENTS: only the chart tests need helm, so the demo and `localkube build` skip it.
HELM = Component(
    "helm",
    "helm.sh/helm/v4",
    (Binary("helm", "helm.sh/helm/v4/cmd/helm"),),
    version_vars=("helm.sh/helm/v4/internal/version.version",),
)

# Not in COMPONENTS: a real node (localkube/node.py: `localkube up --node`, `make test-node`) runs
# the kubelet and kube-proxy from the same module as the control plane, on containerd.
KUBERNETES_NODE = _kubernetes("kubelet", "kube-proxy")
_CONTAINERD = "github.com/containerd/containerd/v2"
CONTAINERD = Component(
    "containerd",
    _CONTAINERD,
    tuple(Binary(cmd, f"{_CONTAINERD}/cmd/{cmd}") for cmd in ("containerd", "ctr", "containerd-shim-runc-v2")),
    tags="urfave_cli_no_docs no_btrfs",  # no btrfs snapshotter: it needs cgo and btrfs headers
    version_vars=(f"{_CONTAINERD}/version.Version",),
)
# crictl: the node's teardown removes pod sandboxes through CRI, so the CNI DEL runs.
CRICTL = Component(
    "cri-tools",
    "sigs.k8s.io/cri-tools",
    (Binary("crictl", "sigs.k8s.io/cri-tools/cmd/crictl"),),
    version_vars=("sigs.k8s.io/cri-tools/pkg/version.Version",),
)
NODE_COMPONENTS = (KUBERNETES_NODE, CONTAINERD, CRICTL)

# Not in COMPONENTS: the node tests run Prometheus as a pod with the configuration the Prometheus
# Operator generates, which discovers targets through the Kubernetes API; Debian's package leaves
# that discovery out. Built with it alone (no cloud discoveries) and without the web UI's assets.
PROMETHEUS = Component(
    "prometheus",
    "github.com/prometheus/prometheus",
    (Binary("prometheus", "github.com/prometheus/prometheus/cmd/prometheus"),),
    tags="remove_all_sd,enable_kubernetes_sd",
)


def prometheus_release(module_version: str) -> str:
    """The Prometheus release of a module version: v0.316.0 is Prometheus v3.16.0."""
    major_minor, patch = module_version.removeprefix("v0.").split(".")
    return f"v{major_minor[0]}.{int(major_minor[1:])}.{patch}"

# Not in COMPONENTS: only tests/unit/test_release.py lints the GitHub Actions workflows with it.
ACTIONLINT = Component(
    "actionlint",
    "github.com/rhysd/actionlint",
    (Binary("actionlint", "github.com/rhysd/actionlint/cmd/actionlint"),),
    version_vars=("github.com/rhysd/actionlint.version",),
)

# Not in COMPONENTS: only the tests of our monitoring objects use the Prometheus Operator's
# real CRDs (their schemas validate our ServiceMonitor and PrometheusRule) and its operator (the
# scrape config it generates from them).
PROMETHEUS_OPERATOR = Component(
    "prometheus-operator",
    "github.com/prometheus-operator/prometheus-operator",
    (Binary("operator", "github.com/prometheus-operator/prometheus-operator/cmd/operator"),),
    bundles=tuple(
        (name, tuple(f"example/prometheus-operator-crd/monitoring.coreos.com_{crd}.yaml" for crd in crds))
        for name, crds in (
            ("monitoring-crds.yaml", ("servicemonitors", "prometheusrules")),
            # The rest of what the operator's Prometheus controller watches.
            ("prometheus-operator-crds.yaml", ("prometheuses", "podmonitors", "probes")),
        )
    ),
)


# Not in COMPONENTS: localkube/ksm.py runs kube-state-metrics for bench/ksm.py and
# bench/apiserver_bill.py, to measure the service beside what users run today (and bench.ksm's
# smoke run in tests/cluster/test_bench_smoke.py, the last of TEST_TOOLS).
KUBE_STATE_METRICS = Component(
    "kube-state-metrics",
    "k8s.io/kube-state-metrics/v2",
    (Binary("kube-state-metrics", "k8s.io/kube-state-metrics/v2"),),
    version_vars=("github.com/prometheus/common/version.Version",),
)


# Not in COMPONENTS: the real CRDs of the workload and queueing projects, for the tests and the
# demo that create their objects (no binaries: only the YAML, copied out of the pinned module).
def _crds(name: str, module: str, bundle: str, paths: tuple[str, ...]) -> Component:
    return Component(name, module, (), bundles=((bundle, paths),))


JOBSET = _crds("jobset", "sigs.k8s.io/jobset", "jobset-crds.yaml",
               ("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",))
LWS = _crds("lws", "sigs.k8s.io/lws", "lws-crds.yaml",
            ("config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",))
_KUEUE_CRDS = (  # bundle -> the CRDs the service reads (a fleet hub's members among them)
    ("kueue-crds.yaml", ("resourceflavors", "clusterqueues", "localqueues", "cohorts", "workloads")),
    ("multikueue-crds.yaml", ("multikueueclusters",)),
)


def _kueue_crds(wrapper: str) -> Component:
    return Component(wrapper, "sigs.k8s.io/kueue", (), bundles=tuple(
        (bundle, tuple(f"config/components/crd/bases/kueue.x-k8s.io_{plural}.yaml" for plural in plurals))
        for bundle, plurals in _KUEUE_CRDS))


# Kueue v0.14 (kueue.x-k8s.io/v1beta1 only; localkube/gomod/kueue) and v0.19, the newest release the
# module proxy serves (v1beta2, and v1beta1 still served; localkube/gomod/kueue-0.19). The tests' Kueue
# cells (demo/kueue.py) install one of them; make test the newest, make test-kueue-matrix the others.
KUEUE = _kueue_crds("kueue")
KUEUE_019 = _kueue_crds("kueue-0.19")


# Not in COMPONENTS: the JobSet and LeaderWorkerSet controller managers (the wrapper modules' `tool`
# lines), built on first use by the tests and the demo that run them (localkube.controllers), with
# the projects' webhook configurations and their kustomize patches (the objectSelectors that scope
# the pod webhooks to the project's own pods). Same wrapper modules, so same cache dirs, as the CRDs.
JOBSET_CONTROLLER = Component(
    "jobset", "sigs.k8s.io/jobset",
    (Binary("jobset-controller", "sigs.k8s.io/jobset"),),
    version_vars=("sigs.k8s.io/jobset/pkg/version.GitVersion",),
    bundles=(
        ("jobset-webhooks.yaml", ("config/components/webhook/manifests.yaml",)),
        ("jobset-webhook-patches.yaml", tuple(f"config/components/webhook/patches/{kind}-patch.yaml"
                                              for kind in ("mutating", "validating"))),
    ),
)
LWS_CONTROLLER = Component(
    "lws", "sigs.k8s.io/lws",
    (Binary("lws-controller", "sigs.k8s.io/lws/cmd"),),
    version_vars=("sigs.k8s.io/lws/pkg/version.GitVersion",),
    bundles=(
        ("lws-webhooks.yaml", ("config/webhook/manifests.yaml",)),
        ("lws-webhook-patches.yaml", tuple(f"config/webhook/{kind}-patch.yaml" for kind in ("mutating", "validating"))),
    ),
)
# Not in COMPONENTS either: Kueue's controller manager, built on first use by the tests that run it
# (localkube.controllers.KueueController). It watches more kinds than the tests create (admission
# checks, topologies, MultiKueue, ...), so it comes with every CRD of the module (kueue-all-crds.yaml;
# KUEUE's bundle keeps the five the service reads), and with its webhook configurations; from v0.19,
# with the CRD conversion webhook patches its kustomization applies (the manager injects its CA there).
_KUEUE_ALL = ("admissionchecks", "clusterqueues", "cohorts", "localqueues", "multikueueclusters", "multikueueconfigs",
              "provisioningrequestconfigs", "resourceflavors", "topologies", "workloadpriorityclasses", "workloads")
_KUEUE_CONVERTED = ("localqueues", "clusterqueues", "cohorts", "workloads", "multikueueclusters")


def _kueue_controller(wrapper: str, conversion: bool) -> Component:
    bundles = [
        ("kueue-all-crds.yaml", tuple(f"config/components/crd/bases/kueue.x-k8s.io_{plural}.yaml"
                                      for plural in _KUEUE_ALL)),
        ("kueue-webhooks.yaml", ("config/components/webhook/manifests.yaml",)),
    ]
    if conversion:
        bundles.append(("kueue-conversion.yaml", tuple(f"config/components/crd/patches/webhook_in_{plural}.yaml"
                                                       for plural in _KUEUE_CONVERTED)))
    return Component(wrapper, "sigs.k8s.io/kueue", (Binary("kueue-controller", "sigs.k8s.io/kueue/cmd/kueue"),),
                     version_vars=("sigs.k8s.io/kueue/pkg/version.GitVersion",), bundles=tuple(bundles))


KUEUE_CONTROLLER = _kueue_controller("kueue", conversion=False)
KUEUE_019_CONTROLLER = _kueue_controller("kueue-0.19", conversion=True)


# Not in COMPONENTS: Karpenter's KWOK cloud provider, the module's `package main` at sigs.k8s.io/karpenter/kwok
# (NodeClaims become KWOK Nodes, of the instance types it embeds), built on first use by make test-karpenter
# and `localkube up --karpenter` (localkube.karpenter), with the CRDs its chart installs: NodePool, NodeClaim,
# NodeOverlay (karpenter.sh) and CapacityBuffer (autoscaling.x-k8s.io) from kwok/charts/crds, and KWOKNodeClass
# (karpenter.kwok.sh), which the module has in kwok/apis/crds only. v1.15.0 needs Go >= 1.26.9
# (its go.mod's go line; the toolchain here is older and GOTOOLCHAIN=local), so v1.14.1 is pinned.
KARPENTER = Component(
    "karpenter", "sigs.k8s.io/karpenter",
    (Binary("karpenter-controller", "sigs.k8s.io/karpenter/kwok"),),
    version_vars=("sigs.k8s.io/karpenter/pkg/operator.Version",),
    bundles=(("karpenter-crds.yaml", (
        *(f"kwok/charts/crds/karpenter.sh_{plural}.yaml" for plural in ("nodepools", "nodeclaims", "nodeoverlays")),
        "kwok/charts/crds/autoscaling.x-k8s.io_capacitybuffers.yaml",
        "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml",
    )),),
)
# What Karpenter's tests and `localkube up --karpenter` run: the control plane, kube-controller-manager and
# kube-scheduler (it provisions for the pods the scheduler marks unschedulable), KWOK (the fake kubelets of its
# nodes) and Karpenter itself (`localkube build --karpenter`, make test-karpenter).
KARPENTER_COMPONENTS: tuple[Component, ...] = (*CORE, KUBERNETES_CONTROLLERS, KWOK, KARPENTER)


def cache_root() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "node-workload-summary"
    return Path(os.environ.get("NWS_CACHE_DIR", default))


def go_binary() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "the Go toolchain ('go') is not on PATH: it is needed once to build kube-apiserver, "
            "etcd, kubectl and KWOK from their Go modules (Go >= 1.26, see localkube/gomod/*/go.mod)"
        )
    return go


def go_env(component: Component) -> dict[str, str]:
    """The environment of the go commands for ``component``: GOTOOLCHAIN where it names its own."""
    return {**os.environ, "GOTOOLCHAIN": component.toolchain} if component.toolchain else dict(os.environ)


def _go_version(go: str, component: Component | None = None) -> str:
    """The Go version that builds ``component`` (its own toolchain, downloaded on first use)."""
    env = go_env(component) if component is not None else None
    toolchain = component.toolchain if component is not None else ""
    try:
        return subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=True, env=env,
                              cwd=component.dir if component is not None else None).stdout.strip()
    except subprocess.CalledProcessError as err:
        raise BuildError(f"go env GOVERSION{f' with GOTOOLCHAIN={toolchain}' if toolchain else ''} failed: "
                         f"{err.stderr.strip()}") from None


def output_dir(component: Component, go_version: str) -> Path:
    digest = hashlib.sha256(go_version.encode())
    for name in ("go.mod", "go.sum"):
        digest.update((component.dir / name).read_bytes())
    return cache_root() / "bin" / f"{component.name}-{component.version}-{digest.hexdigest()[:10]}"


def _say(msg: str) -> None:
    print(f"[localkube] {msg}", file=sys.stderr, flush=True)


def _build_one(go: str, component: Component, binary: Binary, dest: Path,
               cancel: threading.Event | None = None) -> None:
    cmd = [go, "build", "-trimpath", "-o", str(dest), "-ldflags", component.ldflags()]
    if component.tags:
        cmd += ["-tags", component.tags]
    cmd.append(binary.package)
    if cancel is not None and shutil.which("nice"):
        cmd = ["nice", "-n", "19", *cmd]  # a build behind running tests yields the CPU to them
    # GOGC=400: the compiler collects less often. Measured on kubectl (a cold build cache, 2 cores):
    # 148 CPU-s instead of 191, its largest process 1.09 GB instead of 1.03.
    env = {"GOGC": "400", **go_env(component), "CGO_ENABLED": "0"}
    started = time.monotonic()
    done = threading.Event()
    # Its own process group, so a cancelled build stops with the compilers it started.
    proc = subprocess.Popen(cmd, cwd=component.dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)

    def watch() -> None:
        ticks = 0
        while not done.wait(1):
            ticks += 1
            if cancel is not None and cancel.is_set():
                os.killpg(proc.pid, signal.SIGKILL)
                return
            if ticks % 30 == 0:
                _say(f"  still building {binary.name}: {time.monotonic() - started:.0f}s")

    threading.Thread(target=watch, daemon=True).start()
    try:
        _, stderr = proc.communicate()
    finally:
        done.set()
    if cancel is not None and cancel.is_set():
        raise BuildError(f"building {binary.name} was cancelled")
    if proc.returncode != 0:
        raise BuildError(f"building {binary.name} failed:\n{stderr[-4000:]}")
    _say(f"  built {binary.name} in {time.monotonic() - started:.0f}s")


def _write_bundles(go: str, component: Component, out: Path) -> None:
    if not component.bundles:
        return
    # A component without binaries has nothing that downloads its module: do it here (a no-op
    # when it is in the module cache already).
    env = go_env(component)
    subprocess.run([go, "mod", "download", component.module], cwd=component.dir, capture_output=True, check=True,
                   env=env)
    source = subprocess.run(
        [go, "list", "-m", "-f", "{{.Dir}}", component.module],
        cwd=component.dir, capture_output=True, text=True, check=True, env=env,
    ).stdout.strip()
    for name, files in component.bundles:
        docs = [(Path(source) / f).read_text().strip() for f in files]
        tmp = out / f".{name}.tmp"
        tmp.write_text("\n---\n".join(docs) + "\n")
        tmp.rename(out / name)


def _missing(component: Component, out: Path) -> set[str]:
    return {name for name in component.names if not (out / name).exists()}


def ensure_binaries(components: tuple[Component, ...] = COMPONENTS,
                    cancel: threading.Event | None = None) -> dict[str, Path]:
    """Return {binary or bundle name: path}, building whatever is not cached yet. With ``cancel``
    (a build in the background, see BackgroundBuild), at the lowest CPU priority, and stopped
    when it is set."""
    paths: dict[str, Path] = {}
    go: str | None = None
    go_version = ""
    for component in components:
        if go is None:
            go = go_binary()
            go_version = _go_version(go)
        out = output_dir(component, _go_version(go, component) if component.toolchain else go_version)
        if _missing(component, out):
            out.mkdir(parents=True, exist_ok=True)
            with (out / ".lock").open("w") as lock:
                # Two test processes on a fresh machine: one builds, the other waits and reuses.
                fcntl.flock(lock, fcntl.LOCK_EX)
                missing = _missing(component, out)
                if missing:
                    _say(f"building {component.name} {component.version} ({', '.join(sorted(missing))}) into {out}")
                for binary in (b for b in component.binaries if b.name in missing):
                    tmp = out / f".{binary.name}.tmp"
                    _build_one(go, component, binary, tmp, cancel)
                    tmp.rename(out / binary.name)  # atomic: a killed build never leaves a half binary
                if any(name in missing for name, _ in component.bundles):
                    _write_bundles(go, component, out)
        for binary in component.binaries:
            paths[binary.name] = out / binary.name
        for name, _ in component.bundles:
            paths[name] = out / name
    return paths


# What the tests build on first use beyond CORE, in the order `make test` builds them in the
# background (tests/conftest.py --prebuild; the modules that need them declare it, and run last in
# this order): Kueue's CRDs are a download; the rest are Go builds of minutes each on a fresh machine.
# Kueue: the newest cell's CRDs and controller (v0.19), and v0.14's CRDs (bench.fleet's smoke run writes
# v1beta1); make test-kueue-matrix builds v0.14's controller on first use.
TEST_TOOLS: tuple[Component, ...] = (KUEUE_019, KUEUE, KUBERNETES_CONTROLLERS, KWOK, HELM, PROMETHEUS_OPERATOR,
                                     ACTIONLINT, JOBSET, JOBSET_CONTROLLER, LWS, LWS_CONTROLLER, KUEUE_019_CONTROLLER,
                                     KUBE_STATE_METRICS)
BENCH_ONLY: tuple[Component, ...] = (KUBE_STATE_METRICS,)  # built in the background only for a run that needs it


class BackgroundBuild:
    """Builds components one after another in a thread, at the lowest CPU priority, while the
    caller goes on: the tests' tools are built behind the first tests (tests/conftest.py). A test
    that needs one meanwhile waits on its lock and reuses it; a build that fails here is built
    again, and reported, by the test that needs it."""

    def __init__(self, components: tuple[Component, ...]) -> None:
        self.components = components
        self.failed: list[str] = []
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="background-build", daemon=True)

    def start(self) -> BackgroundBuild:
        self._thread.start()
        return self

    def _run(self) -> None:
        for component in self.components:
            if self._cancel.is_set():
                return
            try:
                ensure_binaries((component,), self._cancel)
            except (BuildError, OSError, subprocess.CalledProcessError) as err:
                if not self._cancel.is_set():
                    self.failed.append(f"{component.name}: {str(err).splitlines()[0]}")

    def stop(self) -> None:
        """Cancel what is still building (a run that ended early) and wait for the thread."""
        self._cancel.set()
        self._thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m localkube.build",
        description="Build (or reuse cached) etcd, kube-apiserver, kube-controller-manager, "
        "kube-scheduler, kubectl and kwok from the pinned Go modules, and print their paths.",
    )
    parser.add_argument("--core", action="store_true",
                        help="only etcd, kube-apiserver and kubectl: what every cluster test needs first "
                             "(make test builds the rest behind the first tests)")
    parser.add_argument("--kubernetes", metavar="MINOR", default="",
                        help="kube-apiserver and kubectl of this Kubernetes minor instead of the pinned one "
                             f"(one of {', '.join(COMPAT_MINORS)}; implies --core): what make compat runs against")
    parser.add_argument("--karpenter", action="store_true",
                        help="what Karpenter's tests need: the control plane, kube-controller-manager, kube-scheduler, "
                             "KWOK and Karpenter's KWOK provider with its CRDs (make test-karpenter)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.karpenter:
        components = KARPENTER_COMPONENTS
    else:
        components = core(args.kubernetes) if args.core or args.kubernetes else COMPONENTS
    try:
        paths = ensure_binaries(components)
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}\t{path}")
    _say(f"binaries ready in {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
