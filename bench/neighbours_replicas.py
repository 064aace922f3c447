"""The neighbours soak's replicas, and the faults they meet, as processes of this checkout.

A ``Replica`` is what the soak checks: one running service it can scrape. A runner starts the
replicas and applies the faults that reach them: ``Processes`` (here: the service as processes,
one behind a StallingProxy) and ``bench.neighbours_pods.Pods`` (the chart's pods on a real node).

Every replica reads its initial state with one of the two consistent initial-list modes, in turn
(``list`` for the first, ``watchlist`` for the second, ...): both take the relists that API server
restarts and stalls cause.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from localkube.cluster import LocalCluster
from localkube.proxy import through_proxy
from localkube.service import Samples, Service, select, value

LEASE = ("--lease-duration=4", "--renew-deadline=3", "--retry-period=1")
INITIAL_LISTS = ("list", "watchlist")


@dataclass
class Replica:
    identity: str
    scrape: Callable[[], Samples]
    log: Path
    initial_list: str
    stallable: bool = False  # its API connections can be stalled
    writes: float = 0.0  # nws_reconciler_writes_total at the last scrape
    written: float = 0.0  # its writes since it started, through restarts in place
    started: float | None = None  # process_start_time_seconds at the last scrape
    gone: str = ""  # "killed" on purpose, "died" otherwise
    stalled_until: float = 0.0  # its stalled watches are noticed only by its read timeout
    # False while its container restarts in place after a kill (pods): not checked meanwhile
    ready: Callable[[], bool] = lambda: True

    def scrape_writes(self) -> float:
        """Its writes since the last scrape. A process restarted in place (a pod's container: a new
        start time) counts from 0."""
        if self.gone:
            return 0.0
        samples = self.scrape()
        now = sum(select(samples, "nws_reconciler_writes_total").values())
        started = value(samples, "process_start_time_seconds")
        increase = now if started != self.started or now < self.writes else now - self.writes
        self.writes, self.started = now, started
        self.written += increase
        return increase

    def leader(self) -> bool:
        return not self.gone and value(self.scrape(), "nws_reconciler_leader") == 1


class Runner(Protocol):
    """Starts the replicas and applies the faults that can reach them."""

    replicas: list[Replica]
    where: str  # "processes" or "pods"

    def prepare(self) -> None: ...  # before the soak's objects exist
    def start(self) -> None: ...  # after
    def deaths(self) -> list[tuple[Replica, dict]]: ...  # replicas that died since the last call
    def kill(self, leader: Replica) -> str: ...  # the leader killed as by a crash, and replaced
    def stall(self) -> list[Replica]: ...  # the API connections of some replicas made silent
    def settle(self) -> None: ...  # called after each check: faults that have served their time end
    def logs(self, dest: Path) -> None: ...
    def stop(self) -> None: ...


def service_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags every replica runs with, processes and pods alike."""
    return (*LEASE, f"--read-timeout={args.read_timeout}", "--quota-actuation=on",
            f"--quota-settle={args.settle}", f"--quota-max-writes-per-hour={args.quota_writes_per_hour}")


class Processes:
    """Replicas as processes of this checkout against the local control plane; every second one
    reaches the API server through a StallingProxy. A killed leader (SIGKILL) is replaced by a new
    process with a new identity and a new port, as a rollout would."""

    where = "processes"

    def __init__(self, cluster: LocalCluster, args: argparse.Namespace) -> None:
        self.cluster, self.args = cluster, args
        self.proxy, self.proxied_kubeconfig = through_proxy(cluster)
        self.replicas: list[Replica] = []
        self.services: dict[str, Service] = {}

    def prepare(self) -> None:
        pass  # the processes start once the objects exist: they read them in their first list

    def start(self) -> None:
        self._start("a", stallable=False)
        self._start("b", stallable=True)

    def _start(self, identity: str, stallable: bool) -> Replica:
        mode = INITIAL_LISTS[len(self.replicas) % len(INITIAL_LISTS)]
        args = [f"--identity={identity}", f"--initial-list={mode}", *service_args(self.args)]
        if stallable:
            args.append(f"--kubeconfig={self.proxied_kubeconfig}")
        svc = Service(self.cluster, tuple(args)).start()
        assert svc.log is not None
        replica = Replica(identity, svc.scrape, svc.log, mode, stallable)
        self.services[identity] = svc
        self.replicas.append(replica)
        return replica

    def deaths(self) -> list[tuple[Replica, dict]]:
        out = []
        for r in self.replicas:
            proc = self.services[r.identity].proc
            assert proc is not None
            if not r.gone and proc.poll() is not None:
                r.gone = "died"
                out.append((r, {"code": proc.returncode, "tail": r.log.read_text().splitlines()[-30:]}))
        return out

    def kill(self, leader: Replica) -> str:
        proc = self.services[leader.identity].proc
        assert proc is not None
        proc.kill()
        proc.wait()
        leader.gone = "killed"
        fresh = self._start(f"r{len(self.replicas)}", leader.stallable)
        return f"killed leader {leader.identity} (SIGKILL), started {fresh.identity} ({fresh.initial_list})"

    def stall(self) -> list[Replica]:
        self.proxy.stall_existing()
        return [r for r in self.replicas if not r.gone and r.stallable]

    def settle(self) -> None:
        pass  # the proxy stalls only the connections it had: new ones go through

    def logs(self, dest: Path) -> None:
        pass  # the processes log into the control plane's logs directory, copied with it

    def stop(self) -> None:
        for svc in self.services.values():
            svc.stop()
        self.proxy.close()
