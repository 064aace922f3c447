"""`localkube`: build the control plane binaries, or start a local control plane by hand."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from .build import COMPAT_MINORS, BuildError, core, ensure_binaries
from .build import main as build_main
from .cluster import WORKLOAD_API_MINORS, ClusterError, LocalCluster, Options, set_parent_death_signal
from .controllers import JOBSET_PROJECT, LWS_PROJECT, Controller, KueueController
from .karpenter import KarpenterController, apply, node_class, node_pool
from .node import NODE_ADDRESS, NodeError, RealNode


def _up(args: argparse.Namespace) -> int:
    options = Options(
        controller_manager=args.controllers or args.full or args.node or args.karpenter,
        scheduler=args.scheduler or args.full or args.node or args.karpenter,
        kwok=args.kwok or args.full or args.karpenter,
        workdir=Path(args.workdir) if args.workdir else None,
        node_address=NODE_ADDRESS if args.node else None,
        workload_api=args.workload_api,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    # If whatever started us (make, a test's timeout) dies, shut down as on Ctrl-C.
    set_parent_death_signal(signal.SIGTERM)
    if args.kubernetes and (options.controller_manager or options.scheduler):
        print("error: --kubernetes runs another kube-apiserver only; kube-controller-manager and kube-scheduler "
              "are built at the pinned version and must not be newer than the API server", file=sys.stderr)
        return 2
    if args.workload_api and args.kubernetes not in WORKLOAD_API_MINORS:
        print(f"error: --workload-api needs --kubernetes {' or '.join(WORKLOAD_API_MINORS)}: the in-tree Workload API "
              "is served as scheduling.k8s.io/v1beta1 from 1.37", file=sys.stderr)
        return 2
    try:
        binaries = ensure_binaries(core(args.kubernetes)) if args.kubernetes else None
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    cluster = LocalCluster(options, binaries)
    node: RealNode | None = None
    started = time.monotonic()
    print("[localkube] starting etcd and kube-apiserver ...", file=sys.stderr, flush=True)
    try:
        cluster.start()
        for path in args.crds:
            cluster.install_crds(Path(path))
        for project in [p for p, on in ((JOBSET_PROJECT, args.jobset), (LWS_PROJECT, args.lws)) if on]:
            print(f"[localkube] starting the {project.name} controller (built on first use) ...",
                  file=sys.stderr, flush=True)
            Controller(cluster, project).start()  # its CRDs and webhooks too; stopped with the cluster
        if args.kueue:
            print("[localkube] starting the kueue controller (built on first use) ...", file=sys.stderr, flush=True)
            KueueController(cluster).start()
        if args.karpenter:
            print("[localkube] starting Karpenter's KWOK provider (built on first use), KWOKNodeClass and NodePool "
                  "'default' ...", file=sys.stderr, flush=True)
            KarpenterController(cluster).start()  # its CRDs too; stopped with the cluster
            apply(cluster, node_class("default"),
                  node_pool("default", consolidate_after="30s", budgets=("10%",)))  # Karpenter's default budget
        if args.node:
            print("[localkube] starting a real node: containerd, the kubelet, kube-proxy (built on first use) ...",
                  file=sys.stderr, flush=True)
            node = RealNode(cluster).start()
            for archive in args.image:
                node.load_image(Path(archive))
        for path in args.apply:
            cluster.kubectl("apply", "-f", path)
    except (ClusterError, BuildError, NodeError, subprocess.CalledProcessError, OSError) as err:
        if node is not None:
            node.stop()
        cluster.stop()
        print(f"error: {err}", file=sys.stderr)
        return 1
    running = ", ".join([*cluster.processes, *(node.processes if node else ())])
    karpenter = ("\n  kubectl get nodepools,nodeclaims,nodes   # pending pods get NodeClaims of NodePool 'default'"
                 if args.karpenter else "")
    print(f"""
Local control plane is up in {time.monotonic() - started:.1f}s ({running}).

  kubeconfig: {cluster.kubeconfig}
  server:     {cluster.server}
  logs:       {cluster.workdir / 'logs'}

  export KUBECONFIG={cluster.kubeconfig}
  alias kubectl={cluster.kubectl_path}
  kubectl get nodesummarizers,workloadsummarizers
  kubectl get nodesummaries
  kubectl get workloads.ux -A{karpenter}

Press Ctrl-C to stop (every process is stopped and the working directory removed).""", flush=True)
    try:
        while not stop.wait(1):
            dead = [p.name for p in cluster.processes.values() if not p.running()]
            if dead:
                print(f"error: {', '.join(dead)} exited; see {cluster.workdir / 'logs'}", file=sys.stderr)
                return 1
    finally:
        print("[localkube] stopping ...", file=sys.stderr, flush=True)
        if node is not None:
            left = node.stop()
            if left:
                print(f"[localkube] could not remove: {', '.join(left)}", file=sys.stderr)
        cluster.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="localkube",
        description="A real Kubernetes control plane on loopback, built from pinned Go modules.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build or reuse the cached binaries and print their paths")
    build.add_argument("--core", action="store_true",
                       help="only etcd, kube-apiserver and kubectl (make test builds the rest behind its first tests)")
    build.add_argument("--kubernetes", metavar="MINOR", default="",
                       help=f"kube-apiserver and kubectl of this Kubernetes minor ({', '.join(COMPAT_MINORS)}); "
                            "implies --core")
    build.add_argument("--karpenter", action="store_true",
                       help="what Karpenter's tests need: the control plane, kube-controller-manager, kube-scheduler, "
                            "KWOK and Karpenter's KWOK provider (make test-karpenter)")
    up = sub.add_parser(
        "up",
        help="start etcd + kube-apiserver (and optionally more) and wait for Ctrl-C",
        description="Start a local control plane, print its kubeconfig path, and run until Ctrl-C.",
    )
    up.add_argument("--controllers", action="store_true", help="also run kube-controller-manager")
    up.add_argument("--scheduler", action="store_true", help="also run kube-scheduler")
    up.add_argument("--kwok", action="store_true",
                    help="also run KWOK: nodes annotated kwok.x-k8s.io/node=fake get fake kubelets")
    up.add_argument("--full", action="store_true", help="same as --controllers --scheduler --kwok")
    up.add_argument("--jobset", action="store_true",
                    help="also run the JobSet controller (its real CRDs and webhooks; needs --controllers for pods)")
    up.add_argument("--lws", action="store_true",
                    help="also run the LeaderWorkerSet controller (its real CRDs and webhooks; needs --controllers)")
    up.add_argument("--kueue", action="store_true",
                    help="also run Kueue's controller manager (every Kueue CRD, its webhooks for its own kinds and "
                         "batch Jobs)")
    up.add_argument("--karpenter", action="store_true",
                    help="also run Karpenter's KWOK provider (its CRDs, a KWOKNodeClass and a NodePool 'default': "
                         "pending pods get KWOK nodes; implies --full; docs/karpenter.md)")
    up.add_argument("--crds", action="append", default=[], metavar="PATH",
                    help="install the CRDs in PATH and wait until they are Established (repeatable)")
    up.add_argument("--apply", action="append", default=[], metavar="PATH",
                    help="kubectl apply -f PATH after start (repeatable)")
    up.add_argument("--node", action="store_true",
                    help=f"also run a real node (containerd, runc, a CNI bridge, the kubelet, kube-proxy) whose "
                         f"pods reach the API server at {NODE_ADDRESS}; needs root (implies --controllers "
                         "--scheduler)")
    up.add_argument("--image", action="append", default=[], metavar="ARCHIVE",
                    help="load this OCI archive into the real node's containerd (make image IMAGE_ARGS=--save ...)")
    up.add_argument("--kubernetes", metavar="MINOR", default="",
                    help=f"run kube-apiserver and kubectl of this Kubernetes minor ({', '.join(COMPAT_MINORS)}) "
                         "instead of the pinned one (built on first use); not with the controllers or --node")
    up.add_argument("--workload-api", action="store_true",
                    help="serve the in-tree Workload API (scheduling.k8s.io/v1beta1 Workload, PodGroup): its "
                         f"GenericWorkload feature gate and the version on; with --kubernetes "
                         f"{' or '.join(WORKLOAD_API_MINORS)}")
    up.add_argument("--workdir", help="working directory (default: a fresh one on /dev/shm, removed at exit)")
    args = parser.parse_args(argv)
    if args.command == "build":
        return build_main([*(["--core"] if args.core else []), *(["--karpenter"] if args.karpenter else []),
                           *([f"--kubernetes={args.kubernetes}"] if args.kubernetes else [])])
    return _up(args)


if __name__ == "__main__":
    sys.exit(main())
