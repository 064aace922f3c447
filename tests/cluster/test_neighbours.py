"""The reconciler beside neighbours, on a real control plane: two replicas, other field managers
and people with kubectl, a lease that moves, colliding and odd names, forbidden credentials,
namespaces being deleted. Each test failed before the fix it covers."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from demo.workloads import create, node_summarizer, ok, workload_summarizer
from kubeindex.client.api import ApiClient, load_connection
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import (
    BY_PLURAL,
    LEASES,
    NODE_SUMMARIES,
    NODE_SUMMARIZERS,
    NODES,
    WORKLOAD_SUMMARIES,
    WORKLOAD_SUMMARIZERS,
)
from kubeindex.watch.sources import Sources
from localkube.cluster import LocalCluster
from localkube.proxy import through_proxy
from localkube.service import Service, select, wait_for
from reconciler.leader import LeaderElector, LeaseSettings
from reconciler.manager import Manager, ReconcilerSettings
from reconciler.summaries import Summary, SummaryController
from tests.kube import (
    RecordingApi,
    create_node,
    delete,
    deployment,
    found,
    get_object,
    is_leader,
    settled,
    summarized_cluster,
    token_kubeconfig,
    until,
    writes,
)

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor

NS = "team"
FAST_LEASE = ("--lease-duration=4", "--renew-deadline=3", "--retry-period=1", "--write-debounce=0.2")
LEASE = LEASES.path("default", "node-workload-summary")


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    with summarized_cluster(binaries, NS) as c:
        for i in range(2):
            create_node(c, f"n-{i}", {"pool": "a"})
        deployment(c, NS, "web")
        yield c


@pytest.fixture(scope="module")
def leader(kube: LocalCluster) -> Iterator[Service]:
    svc = Service(kube, ("--identity=replica-a", *FAST_LEASE)).start()
    wait_for(lambda: summary(kube, "workloadsummaries", "web", NS) is not None, timeout=15)
    yield svc
    svc.stop()


def summary(kube: LocalCluster, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
    return get_object(kube, BY_PLURAL[plural].path(namespace, name))


def errors(svc: Service) -> dict[frozenset, float]:
    return select(svc.scrape(), "nws_reconciler_write_errors_total")


# -- other field managers -----------------------------------------------------------------------

def test_foreign_labels_and_annotations_cause_no_writes(kube: LocalCluster, leader: Service) -> None:
    """A policy engine or a person labels and annotates our summaries: we must not re-apply every
    debounce period (the old code compared the whole labels map, forever)."""
    before = settled(leader)
    kube.kubectl("label", "workloadsummary", "web", "-n", NS, "team=ml")
    kube.kubectl("annotate", "nodesummary", "pool-a", "policy.example.com/checked=yes")
    kube.kubectl("label", "nodesummary", "pool-a", "cost-center=42")
    time.sleep(3)
    assert writes(leader) == before
    assert found(summary(kube, "workloadsummaries", "web", NS))["metadata"]["labels"]["team"] == "ml"


def test_a_field_of_ours_taken_by_kubectl_is_taken_back_once(kube: LocalCluster, leader: Service) -> None:
    before = settled(leader)
    ok(kube.request(NODE_SUMMARIES.path(name="pool-a", subresource="status"), "PATCH", {"status": {"nodeCount": 99}},
                    content_type="application/merge-patch+json"))
    wait_for(lambda: found(summary(kube, "nodesummaries", "pool-a"))["status"]["nodeCount"] == 2,
             timeout=10)
    assert settled(leader) - before == 1  # one status apply, then quiet again


def test_404_on_delete_is_not_a_write(kube: LocalCluster) -> None:
    """The worker deletes what the view of our objects holds and nothing wants. One of the two
    objects here is on the server (a write); the other the view holds but the server no longer
    has (deleted by someone else after the watch delivered it): its DELETE answers 404, which is
    no write. A reconciler of its own with nothing desired (its Sources are never started: no
    summarizer), watching only objects labelled for this test: the replicas here never see
    them, and it never sees theirs."""
    label = {"test.example.com/delete-404": "yes"}

    def node_summary(name: str) -> dict:
        return {"apiVersion": API_VERSION, "kind": "NodeSummary", "metadata": {"name": name, "labels": label},
                "spec": {"selector": {"matchLabels": {"pool": name}}}}

    there = NODE_SUMMARIES.path(name="delete-404-there")
    gone = NODE_SUMMARIES.path(name="delete-404-gone")
    create(kube, NODE_SUMMARIES.path(), node_summary("delete-404-there"))
    stale = msgspec.convert(node_summary("delete-404-gone"), Summary)
    stale.metadata.uid = "00000000-0000-4000-8000-000000000404"

    async def main() -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        async with RecordingApi(load_connection(str(kube.kubeconfig))) as api:
            sources = Sources(api, ClusterIndex())
            sources.ready.set()
            settings = ReconcilerSettings(debounce=0)
            manager = Manager(api, sources, None, settings)
            manager.add(SummaryController(api, sources.index, sources, manager.writer, settings))
            for reflector in manager.watches:
                reflector.selector = {"labelSelector": "test.example.com/delete-404=yes"}
            # Its own watches run without the Sources' others (which would see the replicas' summarizers).
            watches = [asyncio.create_task(r.run()) for r in manager.watches]
            running = asyncio.create_task(manager.run())
            try:
                await until(manager.ready.is_set)
                manager.watches[0].store.handler.upsert(stale)  # as the watch hands over an object

                def deletes() -> dict[str, int]:
                    return {path: status for method, path, status in api.requests if method == "DELETE"}

                await until(lambda: deletes().keys() == {there, gone})
            finally:
                for task in (running, *watches):
                    task.cancel()
                await asyncio.gather(running, *watches, return_exceptions=True)
            return deletes(), manager.writer.stats.writes, manager.writer.stats.errors

    try:
        deletes, written, failed = asyncio.run(main())
    finally:
        delete(kube, there)
    assert deletes == {there: 200, gone: 404}
    assert written == {"delete": 1} and failed == {}
    assert kube.request(there)[0] == 404


# -- names ---------------------------------------------------------------------------------------

def test_colliding_and_odd_names(kube: LocalCluster, leader: Service) -> None:
    """`gke` + `pool-a` and `gke-pool` + `a` both wanted `gke-pool-a`, and the two selectors took
    turns deleting and recreating it; `a..b` gave an invalid name and a 422 on every pass."""
    node_summarizer(kube, "gke", "gke")
    node_summarizer(kube, "gke-pool", "gke-pool")
    create_node(kube, "m-0", {"gke": "pool-a", "gke-pool": "a"})
    create_node(kube, "m-1", {"gke": "a..b", "gke-pool": "a.-b"})

    def mine() -> dict[str, dict]:
        items = json.loads(kube.kubectl("get", "nodesummaries", "-o", "json").stdout)["items"]
        return {o["metadata"]["name"]: o for o in items if o["metadata"]["ownerReferences"][0]["name"] in
                ("gke", "gke-pool")}

    wait_for(lambda: len(mine()) == 4, timeout=15)
    selectors = sorted(json.dumps(o["spec"]["selector"]) for o in mine().values())
    assert selectors == sorted(json.dumps({"matchLabels": {k: v}}) for k, v in
                               [("gke", "pool-a"), ("gke-pool", "a"), ("gke", "a..b"), ("gke-pool", "a.-b")])
    names = set(mine())
    before = settled(leader)
    time.sleep(3)
    assert writes(leader) == before and set(mine()) == names  # no delete/recreate dance
    assert not errors(leader), errors(leader)
    for name in ("gke", "gke-pool"):
        delete(kube, NODE_SUMMARIZERS.path(name=name))
    delete(kube, NODES.path(name="m-0"))
    delete(kube, NODES.path(name="m-1"))
    wait_for(lambda: not mine(), timeout=15)


# -- leadership ------------------------------------------------------------------------------------

def test_a_deposed_leader_writes_nothing(kube: LocalCluster, leader: Service) -> None:
    """The lease moves to another holder: the old leader stops at once and writes nothing, even
    with changes waiting (the old code kept applying queued, minutes-old state)."""
    settled(leader)
    lease = ok(kube.request(LEASE))
    lease["spec"] |= {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600,
                      "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())}
    ok(kube.request(LEASE, "PUT", lease))
    wait_for(lambda: not is_leader(leader), timeout=5)
    before = writes(leader)
    deployment(kube, NS, "api")  # a change the old leader would have written
    ok(kube.request(NODE_SUMMARIES.path(name="pool-a", subresource="status"), "PATCH", {"status": {"nodeCount": 7}},
                    content_type="application/merge-patch+json"))
    time.sleep(3)
    assert writes(leader) == before
    assert summary(kube, "workloadsummaries", "api", NS) is None
    lease = ok(kube.request(LEASE))
    lease["spec"] |= {"holderIdentity": None, "leaseDurationSeconds": 1}
    ok(kube.request(LEASE, "PUT", lease))
    wait_for(lambda: is_leader(leader), timeout=10)
    wait_for(lambda: summary(kube, "workloadsummaries", "api", NS) is not None, timeout=10)
    wait_for(lambda: found(summary(kube, "nodesummaries", "pool-a"))["status"]["nodeCount"] == 2,
             timeout=10)


def _token_kubeconfig(kube: LocalCluster, account: str, rules: str) -> Path:
    """A kubeconfig for a ServiceAccount bound to ``rules`` (a ClusterRole's YAML rules)."""
    kube.kubectl("create", "serviceaccount", account, "-n", "default")
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": account},
            "rules": yaml.safe_load(rules)}
    kube.kubectl("apply", "-f", "-", input=json.dumps(role))
    kube.kubectl("create", "clusterrolebinding", account, f"--clusterrole={account}",
                 f"--serviceaccount=default:{account}")
    return token_kubeconfig(kube, account, "default")


def test_an_unsynced_replica_never_holds_the_lease(kube: LocalCluster, leader: Service) -> None:
    """Credentials that can take the Lease but list nothing: that replica used to win the lease
    and hold it with /readyz 503 while the summaries went stale."""
    leases_only = _token_kubeconfig(kube, "leases-only", """
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
""")
    leader.stop()  # free the lease: the blind replica starts first and would take it
    lease = ok(kube.request(LEASE))
    lease["spec"] |= {"holderIdentity": None, "leaseDurationSeconds": 1}
    ok(kube.request(LEASE, "PUT", lease))
    blind = Service(kube, (f"--kubeconfig={leases_only}", "--identity=blind", *FAST_LEASE))
    blind.start(ready=False)
    try:
        time.sleep(3)
        assert ok(kube.request(LEASE))["spec"].get("holderIdentity") in (None, "")
        leader.start()
        wait_for(lambda: is_leader(leader), timeout=10)
        assert "not a candidate" in blind.log_text()
        # The healthy leader keeps the summaries current.
        create_node(kube, "n-9", {"pool": "a"})
        wait_for(lambda: found(summary(kube, "nodesummaries", "pool-a"))["status"]["nodeCount"] == 3,
                 timeout=10)
        delete(kube, NODES.path(name="n-9"))
    finally:
        blind.stop()


def test_a_missing_lease_namespace_is_said(kube: LocalCluster) -> None:
    svc = Service(kube, ("--identity=lost", "--lease-namespace=nowhere", *FAST_LEASE,
                         "--no-exporter")).start()
    try:
        wait_for(lambda: 'namespaces "nowhere" not found' in svc.log_text(), timeout=10)
        time.sleep(3)  # retried every second, said once a minute
        assert svc.log_text().count('namespaces "nowhere" not found') == 1
    finally:
        svc.stop()


# -- namespaces being deleted, summarizers' status -------------------------------------------------

def test_a_terminating_namespace_is_not_a_write_error(kube: LocalCluster, leader: Service) -> None:
    kube.kubectl("create", "namespace", "doomed")
    deployment(kube, "doomed", "old")
    wait_for(lambda: summary(kube, "workloadsummaries", "old", "doomed") is not None, timeout=10)
    kube.kubectl("delete", "namespace", "doomed", "--wait=false")  # no namespace controller: it stays
    delete(kube, WORKLOAD_SUMMARIES.path("doomed", "old"))  # recreating it is refused (403)
    time.sleep(3)
    assert not errors(leader), errors(leader)
    assert 'being terminated' not in leader.log_text()


def _ready(kube: LocalCluster, plural: str, name: str) -> dict:
    status = (summary(kube, plural, name) or {}).get("status") or {}
    return {c["type"]: c for c in status.get("conditions", [])}.get("Ready", {})


def test_summarizer_recreated_with_the_same_spec_gets_its_status(kube: LocalCluster, leader: Service) -> None:
    node_summarizer(kube, "again", "pool")
    wait_for(lambda: _ready(kube, "nodesummarizers", "again").get("reason") == "Summarizing", timeout=10)
    delete(kube, NODE_SUMMARIZERS.path(name="again"))
    wait_for(lambda: summary(kube, "nodesummarizers", "again") is None, timeout=10)
    node_summarizer(kube, "again", "pool")
    wait_for(lambda: _ready(kube, "nodesummarizers", "again").get("reason") == "Summarizing", timeout=10)
    delete(kube, NODE_SUMMARIZERS.path(name="again"))


def test_overlapping_summarizers_both_count_and_say_so(kube: LocalCluster, leader: Service) -> None:
    workload_summarizer(kube, "also-apps", [("apps", "Deployment"), ("apps", "StatefulSet")])
    wait_for(lambda: "also listed by apps" in _ready(kube, "workloadsummarizers", "also-apps").get("message", ""),
             timeout=10)
    count = found(summary(kube, "workloadsummarizers", "apps"))["status"]["workloadCount"]
    wait_for(lambda: found(summary(kube, "workloadsummarizers", "also-apps"))["status"].get("workloadCount") == count,
             timeout=10)
    assert "also listed by also-apps" in _ready(kube, "workloadsummarizers", "apps")["message"]
    delete(kube, WORKLOAD_SUMMARIZERS.path(name="also-apps"))


def test_cluster_scoped_kind_is_reported_and_never_written(kube: LocalCluster, leader: Service) -> None:
    workload_summarizer(kube, "nodes-as-workloads", [("", "Node")])
    wait_for(lambda: _ready(kube, "workloadsummarizers", "nodes-as-workloads").get("reason") == "KindNotNamespaced",
             timeout=15)
    assert _ready(kube, "workloadsummarizers", "nodes-as-workloads")["status"] == "False"
    time.sleep(2)
    assert not errors(leader), errors(leader)
    delete(kube, WORKLOAD_SUMMARIZERS.path(name="nodes-as-workloads"))


def test_a_leader_cut_off_from_the_api_server_gives_way(kube: LocalCluster, leader: Service) -> None:
    """A leader whose connections all hang (a dead load balancer in front of the API server)
    steps down once its watches have been cut off for longer than --sync-loss-grace, and a
    healthy replica takes over; /readyz of the cut-off replica says why."""
    proxy, proxied = through_proxy(kube, "cut-off")
    leader.stop()
    lease = ok(kube.request(LEASE))
    lease["spec"] |= {"holderIdentity": None, "leaseDurationSeconds": 1}
    ok(kube.request(LEASE, "PUT", lease))
    cut = Service(kube, (f"--kubeconfig={proxied}", "--identity=cut-off", "--read-timeout=2",
                         "--sync-loss-grace=2", *FAST_LEASE)).start()
    try:
        wait_for(lambda: is_leader(cut), timeout=10)
        leader.start()  # healthy, direct: a follower for now
        assert not is_leader(leader)
        proxy.stall_all()
        cut_at = time.monotonic()
        wait_for(lambda: is_leader(leader), timeout=30)
        took = time.monotonic() - cut_at
        print(f"healthy replica leads {took:.1f}s after the leader was cut off")
        assert not is_leader(cut)
        code, text = cut.get("/readyz")
        assert code == 503 and "no contact with the API server" in text, text
        # read timeout + grace + lease duration + retry periods, with slack for a busy machine
        assert took <= 2 + 2 + 4 + 2 * 1 + 6
    finally:
        cut.stop()
        proxy.close()


def test_a_new_leader_writes_from_a_fresh_view(kube: LocalCluster, leader: Service) -> None:
    """A replica whose watch connections died silently (a load balancer that drops flows without a
    reset) can still win the lease over new connections. Before, it then led on its frozen view
    until the read timeout noticed (minutes); now a new leader relists every watch first."""
    proxy, proxied = through_proxy(kube, "silent")
    standby = Service(kube, (f"--kubeconfig={proxied}", "--identity=silent", "--read-timeout=120",
                             *FAST_LEASE)).start()
    try:
        assert is_leader(leader) and not is_leader(standby)
        proxy.stall_existing()  # its watches go silent; new connections still work
        leader.kill()
        wait_for(lambda: is_leader(standby), timeout=20)
        deployment(kube, NS, "after-failover")
        ok(kube.request(NODE_SUMMARIES.path(name="pool-a", subresource="status"), "PATCH",
                        {"status": {"nodeCount": 99}}, content_type="application/merge-patch+json"))
        wait_for(lambda: summary(kube, "workloadsummaries", "after-failover", NS) is not None, timeout=10)
        wait_for(lambda: found(summary(kube, "nodesummaries", "pool-a"))["status"]["nodeCount"] == 2,
                 timeout=10)
        assert "every watch relisted" in standby.log_text()
    finally:
        standby.stop()
        proxy.close()
        leader.stop()
        leader.start()


def test_a_stalled_leader_sees_again_long_before_its_read_timeout(kube: LocalCluster, leader: Service) -> None:
    """The leader's connections go silent, its watches with them, while new connections pass (a
    load balancer that lost its flows). Its lease renewals fail over to new connections, so it
    keeps leading: before, on a view frozen until the read timeout (120 s here). Now the first of
    its requests that gets no answer has every watch reconnect from where it was, and a change
    made after the stall is summarized in seconds."""
    proxy, proxied = through_proxy(kube, "stalled-leader")
    leader.stop()  # releases the lease: the proxied replica leads
    stalled = Service(kube, (f"--kubeconfig={proxied}", "--identity=stalled-leader", "--read-timeout=120",
                             *FAST_LEASE)).start()
    try:
        wait_for(lambda: is_leader(stalled) and "every watch relisted" in stalled.log_text(), timeout=20)
        time.sleep(2)  # its watches, opened again after the relist, are running
        assert proxy.stall_existing() > 0  # they, and the lease's connection, now hear nothing
        stalled_at = time.monotonic()
        deployment(kube, NS, "after-stall")
        wait_for(lambda: summary(kube, "workloadsummaries", "after-stall", NS) is not None, timeout=60)
        took = time.monotonic() - stalled_at
        print(f"a change made after the stall summarized {took:.1f}s later (read timeout 120 s)")
        assert select(stalled.scrape(), "nws_watch_restarts_total", reason="reconnect")
        assert "they reconnect" in stalled.log_text()
    finally:
        stalled.stop()
        proxy.close()
        leader.start()


def test_the_leader_renews_in_one_request_and_gives_way_to_another_writer_of_the_lease(kube: LocalCluster) -> None:
    """The leader renews the lease as its last write left it (a PUT alone). Someone else writing the
    lease meanwhile (kubectl annotating it) moves its resourceVersion: the API server refuses that
    PUT (409), the leader reads the lease and renews what it read, keeping the other's annotation;
    then one PUT a renewal again. A lease of its own: the replicas of this module keep theirs."""
    name = "renew-fast-path"

    class Counted:
        def __init__(self, api: ApiClient) -> None:
            self.api = api
            self.methods: list[str] = []

        async def request(self, method: str, path: str, body: object = None, *, timeout: float = 30) -> bytes:
            self.methods.append(method)
            return await self.api.request(method, path, body, timeout=timeout)

    def lease() -> dict[str, Any]:
        return found(get_object(kube, LEASES.path("default", name)))

    async def main() -> None:
        async with ApiClient(load_connection(str(kube.kubeconfig))) as api:
            counted = Counted(api)
            elector = LeaderElector(counted, LeaseSettings("default", name=name, identity="fast"))
            await elector.step()
            assert elector.is_leader and counted.methods == ["GET", "POST"], elector.last_error
            for _ in range(2):
                counted.methods.clear()
                await elector.step()
                assert elector.is_leader and counted.methods == ["PUT"], elector.last_error
            renewed = lease()["spec"]["renewTime"]
            kube.kubectl("annotate", "lease", name, "-n", "default", "team=platform")
            counted.methods.clear()
            await elector.step()
            assert elector.is_leader and counted.methods == ["PUT", "GET", "PUT"], elector.last_error
            after = lease()
            assert after["metadata"]["annotations"]["team"] == "platform"
            assert after["spec"]["holderIdentity"] == "fast" and after["spec"]["renewTime"] > renewed
            assert after["spec"]["leaseTransitions"] == 0
            counted.methods.clear()
            await elector.step()
            assert counted.methods == ["PUT"]

    try:
        asyncio.run(main())
    finally:
        kube.request(LEASES.path("default", name), "DELETE")
