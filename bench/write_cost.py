"""What one summary write costs the service's own CPU, by HTTP client: the reconciler's status
apply of a WorkloadSummary (a body of its size, server-side apply, the answer read whole), sent
one after another on a local control plane, once through ``ApiClient.request`` (kept-alive
connections of our own, kubeindex/client/exchange.py) and once through an aiohttp session as
``ApiClient`` sent every request before. Rounds alternate between the two; the CPU is this
process's (user + system, TLS and the loopback's kernel work included; the kernel's part apart),
the API server's is not.

    python -m bench.write_cost --writes 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
from collections.abc import Awaitable, Callable

import aiohttp

from kubeindex.client.api import ApiClient, load_connection
from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import WORKLOAD_SUMMARIES
from localkube.cluster import LocalCluster, Options
from reconciler.desired import MANAGER
from reconciler.writer import APPLY

from .common import CRDS, add_out, sayer, write_results

say = sayer("write-cost")
PATH = WORKLOAD_SUMMARIES.path("default", "bench")
PARAMS = {"fieldManager": MANAGER, "force": "true"}


def status(n: int) -> dict:
    """A WorkloadSummary status as the reconciler writes one: counts, types, three node groups."""
    refs = [{"name": f"pool-{i}", "nodeCount": 3 + i, "unhealthyNodeCount": 0} for i in range(3)]
    return {"apiVersion": API_VERSION, "kind": "WorkloadSummary", "metadata": {"name": "bench", "namespace": "default"},
            "status": {"podCount": 50, "shortType": "deploy", "longType": "apps/Deployment",
                       "pods": {"Pending": n % 50, "Running": 50 - n % 50}, "nodeSummaryRefs": refs,
                       "placement": ",".join(f"{r['name']}={r['nodeCount']}" for r in refs)}}


Write = Callable[[int], Awaitable[None]]


async def measure(write: Write, writes: int, start: int) -> tuple[float, float]:
    """Microseconds of this process's CPU per write: in user space, and in the kernel."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    for n in range(start, start + writes):
        await write(n)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return ((after.ru_utime - before.ru_utime) / writes * 1e6, (after.ru_stime - before.ru_stime) / writes * 1e6)


async def run(kubeconfig: str, writes: int, rounds: int) -> dict:
    connection = load_connection(kubeconfig)
    async with ApiClient(connection) as api, aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=connection.ssl_context)) as session:
        await api.request("PATCH", PATH, {"apiVersion": API_VERSION, "kind": "WorkloadSummary",
                                          "metadata": {"name": "bench", "namespace": "default"},
                                          "spec": {"workloadRef": {"labelKey": "app", "labelValue": "bench"}}},
                          PARAMS, content_type=APPLY)

        async def own(n: int) -> None:
            await api.request("PATCH", f"{PATH}/status", status(n), PARAMS, content_type=APPLY, timeout=10)

        async def through_aiohttp(n: int) -> None:  # as ApiClient._send did, before exchange.py
            headers = {"Accept": "application/json", "User-Agent": "bench", **connection.headers(),
                       "Content-Type": APPLY}
            async with session.request("PATCH", connection.host + PATH + "/status",
                                       data=json.dumps(status(n)).encode(), params=PARAMS, headers=headers,
                                       timeout=aiohttp.ClientTimeout(total=10)) as resp:
                await resp.read()
                assert resp.status == 200, resp.status

        clients: dict[str, Write] = {"aiohttp": through_aiohttp, "own connections": own}
        await own(0)  # connections up, the object written once
        await through_aiohttp(0)
        cpu: dict[str, list[float]] = {name: [] for name in clients}
        kernel: dict[str, list[float]] = {name: [] for name in clients}
        for r in range(rounds):
            for i, (name, write) in enumerate(clients.items()):
                user, system = await measure(write, writes, (2 * r + i + 1) * writes)
                cpu[name].append(round(user + system, 1))
                kernel[name].append(round(system, 1))
                say(f"round {r + 1}: {name}: {cpu[name][-1]:.0f} µs of CPU per write ({system:.0f} in the kernel)")
    return {"writes_per_round": writes, "rounds": rounds, "body_bytes": len(json.dumps(status(0))),
            "cpu_us_per_write": cpu, "kernel_us_per_write": kernel,
            "median_us": {k: statistics.median(v) for k, v in cpu.items()},
            "median_kernel_us": {k: statistics.median(v) for k, v in kernel.items()}}


def markdown(r: dict) -> str:
    kernel = r.get("median_kernel_us", {})  # runs before it was reported have the sum only
    rows = [f"| {name} | {r['median_us'][name]:.0f} µs | {kernel[name]:.0f} µs | "
            f"{', '.join(f'{v:.0f}' for v in values)} |" if name in kernel else
            f"| {name} | {r['median_us'][name]:.0f} µs | | {', '.join(f'{v:.0f}' for v in values)} |"
            for name, values in r["cpu_us_per_write"].items()]
    return (f"{r['writes_per_round']} status applies per round, {r['rounds']} rounds each, alternating:\n\n"
            "| client | CPU per write (median) | of it in the kernel | rounds |\n|---|---|---|---|\n"
            + "\n".join(rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.write_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=2000, help="writes per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per client")
    add_out(parser, "write-cost.json", beside=(".md",))
    args = parser.parse_args(argv)
    with LocalCluster(Options(controller_manager=False)) as cluster:
        cluster.install_crds(CRDS)
        say(f"{args.rounds} rounds of {args.writes} writes per client ...")
        result = asyncio.run(run(str(cluster.kubeconfig), args.writes, args.rounds))
    write_results(args.out, result, markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
