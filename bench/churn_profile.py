"""Where the service's CPU goes under pod churn: `bench.ksm`'s cluster (nodes in pools, Deployments,
StatefulSets, Jobs, some nodes not Ready, the WorkloadSummarizer), the service started and synced,
then pod phase flips as fast as the API server takes them while py-spy samples the service. The
samples at work (not waiting in epoll) are grouped by the stage they were in (the innermost frame
of ours that names one) and by function; the CPU per 1,000 pod events is the service's CPU seconds
over the churn's updates. Beside them: the summary writes the API server took meanwhile, per
resource, and its own CPU.
Writes bench/results/churn-profile.{json,md} and the raw samples (py-spy's collapsed stacks)
beside them as .txt.

    python -m bench.churn_profile --nodes 1000 --seconds 60

py-spy comes with the `bench` extra (make install).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from kubeindex.client.api import ApiClient, load_connection
from kubeindex.model.resources import PODS
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, parse, select, wait_for

from .common import CRDS, add_out, cpu_split, run_and_write, sayer, writes_settled
from .fleet import api_counters
from .ksm import not_ready_nodes, service_sync, setup
from .populate import churn

say = sayer("churn-profile")
WRITTEN = ("nodesummaries", "workloadsummaries", "nodesummarizers", "workloadsummarizers")  # what the service writes
# A sample's stage: the innermost frame whose file is one of these (first match from the leaf).
STAGES = (
    ("decode", ("kubeindex/model/objects.py", "kubeindex/client/protobuf.py", "msgspec", "google/protobuf")),
    ("index", ("kubeindex/model/index.py", "kubeindex/model/owners.py", "kubeindex/model/nodeset.py",
               "kubeindex/model/kueue.py", "kubeindex/model/quantity.py")),
    ("watch (reflector)", ("kubeindex/watch/reflector.py", "kubeindex/watch/decode.py", "kubeindex/watch/store.py",
                           "kubeindex/watch/pager.py", "kubeindex/watch/contact.py")),
    ("summaries: desired state", ("reconciler/desired.py", "reconciler/fields.py", "reconciler/summarizers.py")),
    ("summaries: writes", ("reconciler/manager.py", "reconciler/summaries.py", "reconciler/writer.py",
                           "reconciler/workqueue.py", "reconciler/ratelimit.py", "reconciler/claims.py",
                           "reconciler/quota.py")),
    ("exporter", ("exporter/",)),
    ("API client (HTTP, TLS)", ("kubeindex/client/api.py", "kubeindex/client/watchstream.py",
                                "kubeindex/client/exchange.py", "aiohttp/", "ssl.py", "yarl/", "multidict/")),
    ("event loop", ("asyncio/",)),
)


def stage_of(stack: str) -> str:
    frames = stack.split(";")
    for frame in reversed(frames):
        for stage, files in STAGES:
            if any(f in frame for f in files):
                return stage
    return "other"


def leaf(stack: str) -> str:
    """The innermost frame, as py-spy names it: "function (file:line)" without the line."""
    frame = stack.rsplit(";", 1)[-1]
    return frame.rsplit(":", 1)[0] + ")" if ":" in frame else frame


def read_samples(path: Path) -> Counter[str]:
    samples: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            samples[stack] += int(count)
    return samples


def idle(stack: str) -> bool:
    """The event loop waiting in epoll: py-spy's --nonblocking samples cannot tell it from work."""
    return "select (selectors.py" in stack.rsplit(";", 1)[-1]


def breakdown(samples: Counter[str], top: int) -> dict:
    busy = Counter({stack: n for stack, n in samples.items() if not idle(stack)})
    total = sum(busy.values()) or 1
    stages: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    for stack, n in busy.items():
        stages[stage_of(stack)] += n
        leaves[leaf(stack)] += n
    return {"samples": total, "idle_samples": sum(samples.values()) - total,
            "stages": {s: round(100 * n / total, 1) for s, n in stages.most_common()},
            "functions": [{"function": f, "percent": round(100 * n / total, 1)} for f, n in leaves.most_common(top)]}


def run(args: argparse.Namespace) -> dict:
    pods = args.nodes * args.pods_per_node
    direct = {"StatefulSet": max(1, pods // 1000), "Job": max(1, pods // 1000)}  # as bench.ksm's defaults
    size: dict = {"nodes": args.nodes, "pods": pods, "groups": args.groups, "direct": direct, "direct_pods_each": 10,
                  "deployments": max(1, pods // 50), "not_ready": not_ready_nodes(args.nodes, args.groups)}
    options = Options(controller_manager=False, extra_apiserver_args=["--max-requests-inflight=4000"])
    with LocalCluster(options) as cluster:
        cluster.install_crds(CRDS)
        say(f"{args.nodes} nodes / {pods} pods: populating ...")
        setup(cluster, size)
        svc = Service(cluster, args=tuple(args.service_arg))
        try:
            sync = service_sync(svc)
            assert svc.proc is not None
            wait_for(lambda: sum(select(parse(svc.get("/metrics")[1]), "nws_nodegroup_pods").values()) == pods,
                     timeout=600, interval=1)
            if "--no-reconciler" not in args.service_arg:  # the first summaries are not the churn's cost
                say(f"service ready ({sync}); waiting for the first summaries ...")
                first = writes_settled(svc, args.groups + size["deployments"] + sum(direct.values()))
                say(f"the first summaries written in {first:.0f} s")
            say(f"settling {args.settle:.0f} s ...")
            time.sleep(args.settle)
            _, listed = cluster.request(f"{PODS.path('bench')}?limit=2000")
            assert isinstance(listed, dict)
            names = [item["metadata"]["name"] for item in listed["items"]]
            raw = args.out.with_suffix(".txt")
            raw.parent.mkdir(parents=True, exist_ok=True)
            spy = subprocess.Popen([args.py_spy, "record", "--pid", str(svc.proc.pid), "--rate", str(args.rate),
                                    "--format", "raw", "--output", str(raw), "--duration", str(int(args.seconds)),
                                    "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            apiserver = cluster.processes["kube-apiserver"].pid
            assert apiserver is not None
            api0, cpu0, started = api_counters(cluster, WRITTEN), cpu_split(svc.proc.pid), time.monotonic()
            apiserver0 = sum(cpu_split(apiserver))

            async def churn_pods() -> int:
                async with ApiClient(load_connection(str(cluster.kubeconfig)), max_connections=64) as api:
                    return await churn(api, names, args.seconds)

            say(f"churn for {args.seconds:.0f} s, py-spy sampling the service at {args.rate} Hz ...")
            updates = asyncio.run(churn_pods())
            user, system = (b - a for a, b in zip(cpu0, cpu_split(svc.proc.pid), strict=True))
            cpu, elapsed = user + system, time.monotonic() - started
            apiserver_cpu = sum(cpu_split(apiserver)) - apiserver0
            api1 = api_counters(cluster, WRITTEN)
            _, err = spy.communicate(timeout=120)
            if spy.returncode != 0:
                raise RuntimeError(f"py-spy: {err.decode()[-500:]}")
        finally:
            svc.stop()
    return {"nodes": args.nodes, "pods": pods, "churn_seconds": round(elapsed, 1), "pod_updates": updates,
            "service_cpu_seconds": round(cpu, 2), "service_system_cpu_seconds": round(system, 2),
            "cpu_ms_per_1000_events": round(1000 * cpu / max(updates, 1) * 1000, 1),
            "initial_sync": sync, "writes": applies(api0, api1), "apiserver_cpu_seconds": round(apiserver_cpu, 2),
            **breakdown(read_samples(raw), args.top)}


def applies(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """The API server's count of our writes (applies and status applies: its verb APPLY) per resource
    between two readings of its counters."""
    counter = "{} apiserver_request_total APPLY".format
    return {r: round(after.get(counter(r), 0) - before.get(counter(r), 0)) for r in WRITTEN}


def markdown(r: dict) -> str:
    lines = [f"{r['nodes']:,} nodes / {r['pods']:,} pods: {r['pod_updates']:,} pod updates in {r['churn_seconds']} s; "
             f"the service used {r['service_cpu_seconds']} CPU s "
             f"({r.get('service_system_cpu_seconds', '?')} of them in the kernel), "
             f"**{r['cpu_ms_per_1000_events']} ms per 1,000 pod events** ({r['samples']:,} samples at work; "
             f"{r['idle_samples']:,} waiting in epoll left out).", ""]
    if "writes" in r:
        lines += [f"Summary writes in the churn: {sum(r['writes'].values()):,} ("
                  + ", ".join(f"{n:,} {res}" for res, n in r["writes"].items() if n) + "); "
                  f"kube-apiserver used {r['apiserver_cpu_seconds']} CPU s meanwhile (the churn's own requests "
                  "included).", ""]
    lines += ["| stage | share of samples |", "|---|---|"]
    lines += [f"| {s} | {p} % |" for s, p in r["stages"].items()]
    lines += ["", "| innermost function | share |", "|---|---|"]
    lines += [f"| `{f['function']}` | {f['percent']} % |" for f in r["functions"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.churn_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods-per-node", type=int, default=30)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60, help="churn (and sampling) time")
    parser.add_argument("--settle", type=float, default=5,
                        help="seconds between the first summaries (the sync, with --no-reconciler) and the churn")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--top", type=int, default=20, help="functions to list")
    parser.add_argument("--service-arg", action="append", default=[], metavar="FLAG",
                        help="a flag for the service, e.g. --service-arg=--encoding=json (repeatable)")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"))
    add_out(parser, "churn-profile.json", (".md",))
    return run_and_write(parser, argv, run, markdown)


if __name__ == "__main__":
    sys.exit(main())
