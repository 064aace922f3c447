"""Karpenter's blockers and the Events on WorkloadSummaries, without a cluster: the notes Karpenter
v1.14.1 writes (kubeindex/model/disruption.py), a node group's blocked count as blockers come and go
(kubeindex/model/index.py), the notices of disruption, and the controller that turns them into one
rolled-up Event per workload (reconciler/disruptions.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from kubeindex.model.disruption import BLOCKER_TTL, NODE, PDB, POD, Blocker, Notice, parse_blocker
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import DisruptionEvent, EventRegarding, EventSeries, ObjectMeta
from reconciler.desired import MAX_BLOCKERS, NODE_SUMMARY_STATUS
from reconciler.disruptions import BLOCKED, STARTED, DisruptionEventController, SummaryRef, note
from reconciler.events import EventRecorder
from reconciler.writer import Writer
from tests.builders import DISRUPTED, configured, make_node, make_nodeclaim, make_pod, ref
from tests.unit.test_events import Clock, Server

POOL = "karpenter.sh/nodepool"
NOW = 1_800_000_000.0
GROUP = ("pools", "web")
DEPLOY = ("apps", "Deployment", "uid-web")
OTHER = ("apps", "Deployment", "uid-db")

# The notes as Karpenter v1.14.1 formats them (pkg/controllers/state/statenode.go, serrors, pretty.Sentence).
POD_NOTE = 'Pod has "karpenter.sh/do-not-disrupt" annotation (Pod=shop/web-0)'
PDB_NOTE = "Pdb prevents pod evictions (PodDisruptionBudget=[shop/web])"
PDBS_NOTE = "Eviction does not support multiple PDBs (PodDisruptionBudget(s)=[shop/a shop/b])"
NODE_NOTE = 'Disruption is blocked through the "karpenter.sh/do-not-disrupt" annotation'


def test_the_notes_karpenter_writes_name_their_blocker() -> None:
    assert parse_blocker(POD_NOTE) == Blocker(POD, "shop", ("web-0",))
    assert parse_blocker(PDB_NOTE) == Blocker(PDB, "shop", ("web",))
    assert parse_blocker(PDBS_NOTE) == Blocker(PDB, "shop", ("a", "b"))
    assert parse_blocker(NODE_NOTE) == Blocker(NODE, "", ())
    for nothing in ("Node is nominated for a pending pod", "Node isn't initialized",
                    "NodePool not found (NodePool=x)", "Node is deleting or marked for deletion", ""):
        assert parse_blocker(nothing) is None, nothing
    assert str(parse_blocker(POD_NOTE)) == "pod shop/web-0 (karpenter.sh/do-not-disrupt)"
    assert str(parse_blocker(PDB_NOTE)) == "PodDisruptionBudget shop/web (no disruption allowed)"


def _time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def blocked(name: str, node: str, note_: str, at: float = NOW, count: int = 1) -> DisruptionEvent:
    """Karpenter's Event as events.k8s.io/v1 shows a core Event: no eventTime, the deprecated stamps."""
    return DisruptionEvent(ObjectMeta(name=name, namespace="default"), EventRegarding("Node", node),
                           "DisruptionBlocked", note_, None, EventSeries(count, _time(at)) if count > 1 else None,
                           _time(at - 60), _time(at))


def cluster() -> ClusterIndex:
    """Two nodes of pool web; web-0 (Deployment web) on n1 and db-0 (Deployment db) on n1, web-1 on n2."""
    index = ClusterIndex()
    index.set_node_summarizer("pools", POOL)
    index.set_workload_summarizer("w", configured(("apps", "Deployment")))
    index.upsert_owner(("apps", "Deployment"), "shop", "web", "uid-web", None)
    index.upsert_owner(("apps", "Deployment"), "shop", "db", "uid-db", None)
    for node in ("n1", "n2"):
        index.upsert_node(make_node(node, {POOL: "web"}))
    index.upsert_pod(make_pod("web-0", "p0", "n1", owner=ref(DEPLOY, "web"), namespace="shop"))
    index.upsert_pod(make_pod("db-0", "p1", "n1", owner=ref(OTHER, "db"), namespace="shop"))
    index.upsert_pod(make_pod("web-1", "p2", "n2", owner=ref(DEPLOY, "web"), namespace="shop"))
    index.notices.enabled = True
    return index


def test_a_blocker_is_counted_in_its_node_group_until_it_no_longer_holds() -> None:
    index = cluster()
    index.upsert_blocked_event(blocked("e1", "n1", POD_NOTE), NOW)
    group = index.node_groups[GROUP]
    assert (group.blocked, group.blockers) == (1, {"n1": Blocker(POD, "shop", ("web-0",))})
    assert NODE_SUMMARY_STATUS["blockers"](group) == [
        {"node": "n1", "kind": "Pod", "namespace": "shop", "name": "web-0"}]
    assert NODE_SUMMARY_STATUS["blockedNodeCount"](group) == 1
    # The pod leaves: the node is no longer held.
    index.delete_pod("shop/web-0")
    assert (group.blocked, group.blockers) == (0, {})
    assert NODE_SUMMARY_STATUS["blockedNodeCount"](group) is None  # 0: left out
    # A PDB on n2; an older word on n2 does not replace it; the Event gone, it goes.
    index.upsert_blocked_event(blocked("e2", "n2", PDB_NOTE), NOW)
    index.upsert_blocked_event(blocked("e3", "n2", NODE_NOTE, at=NOW - 30), NOW)
    assert group.blockers == {"n2": Blocker(PDB, "shop", ("web",))}
    index.delete_blocked_event("default/e3")
    assert group.blocked == 1
    index.delete_blocked_event("default/e2")
    assert group.blocked == 0


def test_a_blocker_goes_when_karpenter_disrupts_the_node_when_its_node_goes_and_when_it_is_not_said_again() -> None:
    index = cluster()
    group = index.node_groups[GROUP]
    index.upsert_blocked_event(blocked("e1", "n1", PDB_NOTE), NOW)
    index.upsert_blocked_event(blocked("e2", "n2", PDB_NOTE), NOW)
    assert group.blocked == 2
    index.upsert_node(make_node("n1", {POOL: "web"}, taints=[DISRUPTED]))  # chosen: no longer blocked
    assert group.blockers.keys() == {"n2"}
    index.upsert_blocked_event(blocked("e1", "n1", PDB_NOTE, at=NOW + 1), NOW + 1)  # too late: being disrupted
    assert group.blockers.keys() == {"n2"}
    index.expire_blocks(NOW + BLOCKER_TTL - 1)
    assert group.blocked == 1
    index.expire_blocks(NOW + BLOCKER_TTL + 1)
    assert group.blocked == 0
    # A word already older than the TTL is none; a node deleted takes its blocker with it.
    index.upsert_blocked_event(blocked("e3", "n2", PDB_NOTE), NOW + BLOCKER_TTL + 1)
    assert group.blocked == 0
    index.upsert_blocked_event(blocked("e4", "n2", PDB_NOTE, at=NOW + 500), NOW + 500)
    assert group.blocked == 1
    index.delete_node("n2")
    assert GROUP not in index.node_groups or index.node_groups[GROUP].blocked == 0
    assert not index.node_blocks and not index.blocking_pods


def test_a_blocker_said_before_its_node_comes_counts_once_it_does() -> None:
    index = ClusterIndex()
    index.set_node_summarizer("pools", POOL)
    index.upsert_blocked_event(blocked("e1", "n9", NODE_NOTE), NOW)
    index.upsert_node(make_node("n9", {POOL: "web"}))
    assert index.node_groups[GROUP].blockers == {"n9": Blocker(NODE, "", ())}
    assert NODE_SUMMARY_STATUS["blockers"](index.node_groups[GROUP]) == [{"node": "n9", "kind": "Node", "name": "n9"}]


def test_a_node_group_names_at_most_ten_blockers() -> None:
    index = ClusterIndex()
    index.set_node_summarizer("pools", POOL)
    for i in range(MAX_BLOCKERS + 3):
        index.upsert_node(make_node(f"n{i:02}", {POOL: "web"}))
        index.upsert_blocked_event(blocked(f"e{i}", f"n{i:02}", PDB_NOTE), NOW)
    group = index.node_groups[GROUP]
    assert NODE_SUMMARY_STATUS["blockedNodeCount"](group) == MAX_BLOCKERS + 3
    assert [b["node"] for b in NODE_SUMMARY_STATUS["blockers"](group)] == [f"n{i:02}" for i in range(MAX_BLOCKERS)]


def test_notices_name_the_workloads_a_disruption_hits_and_those_that_block_it() -> None:
    index = cluster()
    index.upsert_blocked_event(blocked("e1", "n1", POD_NOTE), NOW)  # web-0's own annotation: web alone
    index.upsert_blocked_event(blocked("e2", "n2", PDB_NOTE), NOW)  # a PDB of shop: the workloads of shop on n2
    index.upsert_blocked_event(blocked("e2", "n2", PDB_NOTE), NOW)  # the same word again: nothing new
    index.upsert_blocked_event(blocked("e2", "n2", PDB_NOTE, at=NOW + 120, count=2), NOW + 120)  # said again
    pod, pdb = Blocker(POD, "shop", ("web-0",)), Blocker(PDB, "shop", ("web",))
    assert index.notices.take() == [Notice("uid-web", "n1", "web", pod), Notice("uid-web", "n2", "web", pdb),
                                    Notice("uid-web", "n2", "web", pdb)]
    index.upsert_node(make_node("n1", {POOL: "web"}, taints=[DISRUPTED]))
    index.upsert_node(make_node("n1", {POOL: "web"}, taints=[DISRUPTED]))  # still: no second notice
    assert index.notices.take() == [Notice("uid-db", "n1", "web"), Notice("uid-web", "n1", "web")]
    index.notices.enabled = False  # no one takes them: none kept
    index.upsert_node(make_node("n2", {POOL: "web"}, taints=[DISRUPTED]))
    assert index.notices.take() == []


def test_the_controller_records_one_rolled_up_event_per_workload_whose_series_counts_the_nodes() -> None:
    index = cluster()
    server, clock = Server(), Clock()
    summaries = {"uid-web": SummaryRef("shop", "web", "ws-1")}
    controller = DisruptionEventController(index, summaries.get, EventRecorder("nws", "replica-0", clock),
                                           Writer(server))
    controller.queue_changes()  # the first pass of a new leader: what came before is not its own
    for node in ("n1", "n2"):
        index.upsert_node(make_node(node, {POOL: "web"}, taints=[DISRUPTED]))
    index.upsert_pod(make_pod("late-0", "p9", "n3", owner=ref(DEPLOY, "web"), namespace="shop"))
    controller.queue_changes()
    assert asyncio.run(controller.reconcile(("workloadsummaries", "uid-web"))).requeue_after is None
    [event] = server.events.values()
    assert event["metadata"]["namespace"] == "shop" and event["type"] == "Normal"
    assert event["regarding"] == {"apiVersion": "ux.sean.example.com/v1alpha1", "kind": "WorkloadSummary",
                                  "namespace": "shop", "name": "web", "uid": "ws-1"}
    assert event["related"] == {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "name": "web"}
    assert (event["reason"], event["note"]) == (STARTED, note("web", None))
    assert event["series"]["count"] == 2  # two nodes, one Event
    # A blocker said twice (Karpenter's repeat): a Warning naming it, then the same Event counted again.
    index.upsert_node(make_node("n3", {POOL: "web"}))
    for at in (NOW, NOW + 120):
        index.upsert_blocked_event(blocked("e1", "n3", 'Pod has "karpenter.sh/do-not-disrupt" annotation '
                                                       "(Pod=shop/late-0)", at=at), at)
        controller.queue_changes()
        asyncio.run(controller.reconcile(("workloadsummaries", "uid-web")))
    [warning] = [e for e in server.events.values() if e["reason"] == BLOCKED]
    assert warning["type"] == "Warning" and warning["series"]["count"] == 2
    assert warning["note"] == ("pod shop/late-0 (karpenter.sh/do-not-disrupt) keeps Karpenter from disrupting "
                               "nodes of NodePool web that run this workload's pods")
    assert len(server.events) == 2


def test_a_notice_waits_for_its_workloads_summary_then_is_dropped() -> None:
    index = cluster()
    server = Server()
    summaries: dict[str, SummaryRef] = {}
    controller = DisruptionEventController(index, summaries.get, EventRecorder("nws", "r", Clock()), Writer(server))
    controller.queue_changes()
    index.upsert_node(make_node("n2", {POOL: "web"}, taints=[DISRUPTED]))
    controller.queue_changes()
    key = ("workloadsummaries", "uid-web")
    assert asyncio.run(controller.reconcile(key)).requeue_after is not None and not server.events
    summaries["uid-web"] = SummaryRef("shop", "web", "ws-1")
    asyncio.run(controller.reconcile(key))
    assert [e["reason"] for e in server.events.values()] == [STARTED]
    # A workload gone before its summary came: its notices are dropped, not kept for ever.
    index.upsert_node(make_node("n1", {POOL: "web"}, taints=[DISRUPTED]))
    controller.queue_changes()
    del summaries["uid-web"]
    index.delete_pod("shop/db-0")
    index.delete_owner(("apps", "Deployment"), "shop/db")
    assert "uid-db" not in index.workloads
    assert asyncio.run(controller.reconcile(("workloadsummaries", "uid-db"))).requeue_after is None
    assert "uid-db" not in controller.pending


def test_a_replica_that_does_not_lead_writes_no_event() -> None:
    """The Events go through the manager's writer, which checks leadership before each request: a
    replica that lost the lease between the pass and the write records nothing (counted as failed)."""
    index = cluster()
    server, leading = Server(), [True]
    recorder = EventRecorder("nws", "r", Clock())
    controller = DisruptionEventController(index, {"uid-web": SummaryRef("shop", "web", "ws-1")}.get, recorder,
                                           Writer(server, leading=lambda: leading[0]))
    controller.queue_changes()
    index.upsert_node(make_node("n2", {POOL: "web"}, taints=[DISRUPTED]))
    controller.queue_changes()
    leading[0] = False
    asyncio.run(controller.reconcile(("workloadsummaries", "uid-web")))
    assert server.calls == [] and recorder.counts == {"failed": 1}
def test_a_blocker_holds_a_rollout_when_karpenter_wants_its_node() -> None:
    """``held``: the blocked nodes whose NodeClaim is a candidate (drifted here); a blocker's notice
    waits until Karpenter wants the node, and comes when it does."""
    index = cluster()
    group = index.node_groups[GROUP]
    for node in ("n1", "n2"):
        index.upsert_nodeclaim(make_nodeclaim(f"c-{node}", node, expire_after="Never"))
    index.upsert_blocked_event(blocked("e1", "n1", POD_NOTE), NOW)
    assert (group.blocked, group.held) == (1, 0)
    assert NODE_SUMMARY_STATUS["rollout"](group) == {"upToDate": 2, "drifted": 0, "disrupting": 0}  # none held
    assert index.notices.take() == []  # nothing wants n1: it holds no rollout
    index.upsert_nodeclaim(make_nodeclaim("c-n1", "n1", {"Drifted": "True"}, expire_after="Never"))
    assert (group.blocked, group.held) == (1, 1)
    assert NODE_SUMMARY_STATUS["rollout"](group)["held"] == 1
    assert index.notices.take() == [Notice("uid-web", "n1", "web", Blocker(POD, "shop", ("web-0",)))]
    index.upsert_blocked_event(blocked("e2", "n2", PDB_NOTE), NOW)
    assert group.held == 1 and index.notices.take() == []
    index.delete_pod("shop/web-0")
    assert (group.blocked, group.held) == (1, 0)
