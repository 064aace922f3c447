"""Start and stop of the real `node-workload-summary` process: a start that cannot work ends with
one line naming what to fix (exit 1), and SIGTERM ends the process within seconds even when the
API server hangs; an unexpected error is logged with its traceback."""

from __future__ import annotations

import json
import signal
import time

from localkube.cluster import LocalCluster
from localkube.proxy import through_proxy
from localkube.service import Service, wait_for

FAST_LEASE = ("--lease-duration=6", "--renew-deadline=4", "--retry-period=1")


SHUTDOWN_BOUND = 8.0  # seconds from SIGTERM to exit; the service budgets 5


def _holder(cluster: LocalCluster, lease: str) -> str:
    got = cluster.kubectl("get", "lease", lease, "-n", "default", "-o", "json", check=False)
    return (json.loads(got.stdout)["spec"].get("holderIdentity") or "") if got.returncode == 0 else ""


def _terminate(svc: Service) -> float:
    """SIGTERM; the seconds until the process exited (it must exit on its own)."""
    assert svc.proc is not None
    started = time.monotonic()
    svc.proc.send_signal(signal.SIGTERM)
    svc.proc.wait(60)
    took = time.monotonic() - started
    print(f"exit {svc.proc.returncode} {took:.1f}s after SIGTERM\n{svc.log_text()[-1500:]}")
    return took


def test_sigterm_releases_the_lease_and_exits(cluster: LocalCluster) -> None:
    svc = Service(cluster, ("--lease-name=startup-release", "--identity=releasing", *FAST_LEASE)).start()
    try:
        wait_for(lambda: _holder(cluster, "startup-release") == "releasing", timeout=20)
        assert _terminate(svc) < SHUTDOWN_BOUND and svc.proc and svc.proc.returncode == 0
        assert _holder(cluster, "startup-release") != "releasing"  # the next replica need not wait it out
    finally:
        svc.stop()


def test_sigterm_under_a_hung_api_server_exits_within_the_bound(cluster: LocalCluster) -> None:
    proxy, proxied = through_proxy(cluster, "startup-stalled")
    svc = Service(cluster, (f"--kubeconfig={proxied}", "--lease-name=startup-stall", "--identity=stalled",
                            *FAST_LEASE)).start()
    try:
        wait_for(lambda: _holder(cluster, "startup-stall") == "stalled", timeout=20)
        assert proxy.stall_existing() > 0  # the watches and the Lease's connections now hear nothing
        assert _terminate(svc) < SHUTDOWN_BOUND and svc.proc and svc.proc.returncode == 0
    finally:
        svc.stop()
        proxy.close()
