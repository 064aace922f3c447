"""The fleet (kubeindex/watch/fleet.py). Here, what needs no cluster; the scenarios against one:
tests/cluster/test_fleet.py."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from kubeindex.client.api import NotFound
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import (
    KUEUE_GROUP,
    ClaimMeta,
    ClusterResourceClaim,
    KubeConfigLocation,
    LabelSelector,
    MemberNodeSummary,
    MultiKueueCluster,
    MultiKueueClusterSpec,
    NodeSummaryCapacity,
    NodeSummarySpec,
    ObjectMeta,
    ResourceFlavor,
    ResourceFlavorSpec,
)
from kubeindex.model.quantity import NANO
from kubeindex.model.resources import CLAIMS, SECRETS, Resource
from kubeindex.watch.fleet import RECHECK, Fleet
from kubeindex.watch.fleet import Member as FleetMember
from kubeindex.watch.reflector import Reflector
from reconciler.claims import ClaimController, Claims, ClaimSettings, member_claim_name
from reconciler.writer import Writer
from tests.clock import FakeClock, settle
from tests.fleetkit import (
    GPU,
)


def kubeconfig(server: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "m",
                       "clusters": [{"name": "m", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                       "users": [{"name": "u", "user": {"token": "t"}}],
                       "contexts": [{"name": "m", "context": {"cluster": "m", "user": "u"}}]})


class Secrets:
    """The hub's Secrets in kueue-system, served as the API server would."""

    def __init__(self) -> None:
        self.kubeconfigs = {"member-a": kubeconfig("https://127.0.0.1:9")}

    async def get(self, path: str, params: dict[str, str] | None = None, accept: str = "",
                  timeout: float = 0) -> bytes:
        assert path.startswith(SECRETS.path("kueue-system") + "/")
        name = path.rsplit("/", 1)[1]
        if name not in self.kubeconfigs:
            raise NotFound(404, "NotFound", f'secrets "{name}" not found')
        return json.dumps({"data": {"kubeconfig": base64.b64encode(self.kubeconfigs[name].encode()).decode()}}).encode()


async def v1beta2(api: object) -> list[Resource]:
    """A member's discovery: ResourceFlavors served at v1beta2 (and v1beta1, less preferred)."""
    return [Resource(KUEUE_GROUP, v, "ResourceFlavor", "resourceflavors", False) for v in ("v1beta2", "v1beta1")]


def multikueue_cluster(name: str, secret: str) -> MultiKueueCluster:
    return MultiKueueCluster(ObjectMeta(name=name), MultiKueueClusterSpec(KubeConfigLocation(secret)))


def feed(member: FleetMember, gpus: str = "8") -> None:
    """The member's watches deliver a flavor a100 (pool=a100), a flavor of every node, and the
    NodeSummary of pool=a100 (16 cpu and ``gpus`` GPUs on its Ready nodes); then they are listed
    and in contact."""
    summaries, flavors = member.reflectors
    flavors.store.handler.upsert(ResourceFlavor(ObjectMeta(name="a100"), ResourceFlavorSpec({"pool": "a100"})))
    flavors.store.handler.upsert(ResourceFlavor(ObjectMeta(name="any")))
    summaries.store.handler.upsert(MemberNodeSummary(ObjectMeta(name="pool-a100"), NodeSummarySpec(
        LabelSelector({"pool": "a100"})), NodeSummaryCapacity({"cpu": "24", GPU[1]: "12"},
                                                              {"cpu": "8", GPU[1]: str(12 - int(gpus))})))
    for reflector in member.reflectors:
        reflector.synced.set()
        reflector.contact.connected = True


def test_a_members_capacity_through_its_life() -> None:
    async def scenario() -> None:
        clock, listed = FakeClock(), [False]
        watches: dict[str, Reflector] = {}
        secrets = Secrets()
        fleet = Fleet(secrets, lambda r: watches.__setitem__(r.name, r), lambda name: watches.__delitem__(name),
                      grace=10, listed=lambda: listed[0], clock=clock, discover=v1beta2)
        # Before the MultiKueueClusters are listed nothing is known; after, a name without one is gone.
        assert fleet.capacity("a", "a100") is None and _reason(fleet, "a") == "MemberConnecting"
        listed[0] = True
        assert fleet.capacity("a", "a100") == {} and _reason(fleet, "a") == "MemberUnreachable"

        fleet.upsert(multikueue_cluster("a", "member-a"))
        await settle()
        assert sorted(watches) == ["member-a-nodesummaries", "member-a-resourceflavors"]
        assert fleet.capacity("a", "a100") is None and _reason(fleet, "a") == "MemberConnecting"
        member = fleet.members["a"]
        feed(member)
        assert fleet.problem("a") is None
        assert fleet.capacity("a", "a100") == {"cpu": 16 * NANO, GPU[1]: 8 * NANO}
        assert fleet.capacity("a", "any") is None and "has no nodeLabels" in fleet.why_unknown("a", "any")
        assert fleet.capacity("a", "h100") is None and "has no ResourceFlavor h100" in fleet.why_unknown("a", "h100")
        assert fleet.wanted_claims() == [("a", "a100")]
        version = fleet.version
        feed(member, gpus="4")
        assert fleet.version > version and fleet.capacity("a", "a100") == {"cpu": 16 * NANO, GPU[1]: 4 * NANO}

        # Out of contact: the last capacity stands for the grace, then counts as gone.
        for reflector in member.reflectors:
            reflector.contact.connected, reflector.contact.lost_at = False, clock.now
        await clock.advance(9.5)
        assert fleet.problem("a") is None and fleet.capacity("a", "a100") == {"cpu": 16 * NANO, GPU[1]: 4 * NANO}
        await clock.advance(1)
        assert fleet.capacity("a", "a100") == {} and _reason(fleet, "a") == "MemberUnreachable"
        assert "past the 10s grace" in str(fleet.problem("a"))

        # A rotated kubeconfig: read again after RECHECK, and the member reconnected with it.
        secrets.kubeconfigs["member-a"] = kubeconfig("https://127.0.0.1:10")
        await clock.advance(RECHECK)
        assert fleet.members["a"] is not member and fleet.members["a"].api.connection.host == "https://127.0.0.1:10"
        assert sorted(watches) == ["member-a-nodesummaries", "member-a-resourceflavors"]
        assert watches["member-a-nodesummaries"] is fleet.members["a"].reflectors[0]

        # A Secret that cannot be read: said, and retried.
        fleet.upsert(multikueue_cluster("b", "member-b"))
        await settle()
        assert "b" not in fleet.members and 'secrets "member-b" not found' in fleet.errors["b"]
        assert _reason(fleet, "b") == "MemberConnecting" and "member-b" in str(fleet.problem("b"))

        # Gone: its watches stop, its capacity is zero at once (the settle time and policy follow).
        fleet.delete("a")
        assert sorted(watches) == [] and fleet.capacity("a", "a100") == {}
        await fleet.stop()

    asyncio.run(scenario())


def _reason(fleet: Fleet, name: str) -> str:
    problem = fleet.problem(name)
    return problem.reason if problem is not None else ""


def test_a_members_flavor_gets_a_claim_named_after_both() -> None:
    assert member_claim_name("a", "a100", set()) == "a-a100"
    taken = member_claim_name("a", "a100", {"a-a100"})
    assert taken != "a-a100" and taken.startswith("a-a100-")
    long = member_claim_name("m" * 200, "f" * 100, set())
    assert len(long) <= 63 and long.startswith("m")


class Requests:
    """The API server as the writer meets it: each request recorded (method, path, body)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, body: object = None, *, params: dict[str, str] | None = None,
                      content_type: str = "", timeout: float = 30) -> bytes:
        self.calls.append((method, path, body))
        return b"{}"


async def reconcile(claims: Claims, name: str, requests: Requests) -> None:
    await ClaimController(claims, Writer(requests)).reconcile((CLAIMS.plural, name))


def queued(claims: Claims) -> list[tuple[str, str]]:
    """The claim keys a pass queues: all of them after a change, else none."""
    return claims.claim_keys() if claims.changed("test") else []


def seen(name: str, spec: dict[str, Any], status: dict[str, Any] | None = None) -> ClusterResourceClaim:
    """A claim as the hub's watch hands it over."""
    return ClusterResourceClaim(ClaimMeta(name=name, generation=1, creationTimestamp="2026-01-01T00:00:00Z"), spec,
                                status or {})


def test_a_hub_makes_a_claim_per_member_flavor_and_its_ready_says_what_the_member_is() -> None:
    async def scenario() -> None:
        clock, index, requests = FakeClock(), ClusterIndex(), Requests()
        fleet = Fleet(Secrets(), lambda r: None, lambda name: None, grace=10, clock=clock, discover=v1beta2)
        claims = Claims(index.kueue, ClaimSettings(), clock=lambda: 1_800_000_000.0 + clock.now, fleet=fleet)
        fleet.upsert(multikueue_cluster("a", "member-a"))
        await settle()
        assert (CLAIMS.plural, "a-a100") not in queued(claims)  # not synced yet: no capacity, no claim
        feed(fleet.members["a"])
        assert (CLAIMS.plural, "a-a100") in queued(claims)
        await reconcile(claims, "a-a100", requests)
        method, path, body = requests.calls[-1]
        assert (method, path) == ("POST", CLAIMS.path())
        assert body["metadata"] == {"name": "a-a100", "labels": {"ux.sean.example.com/member": "a"}}
        assert body["spec"] == {"clusterName": "a", "flavor": "a100", "resourceAssignments": []}

        index.kueue.upsert_claim(seen("a-a100", body["spec"]))
        assert (CLAIMS.plural, "a-a100") in queued(claims) and claims.wanted == {}
        await reconcile(claims, "a-a100", requests)
        status = requests.calls[-1][2]["status"]
        assert status["nominalResources"] == {"cpu": "16", GPU[1]: "8"}
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "AssignmentsFit")

        # A hub that just started, member a still connecting: the claim keeps its status (no write).
        index.kueue.upsert_claim(seen("a-a100", body["spec"], status))
        restarted = Fleet(Secrets(), lambda r: None, lambda name: None, grace=10, clock=clock, discover=v1beta2)
        restarted.upsert(multikueue_cluster("a", "member-a"))
        await settle()
        assert _reason(restarted, "a") == "MemberConnecting"
        writes = len(requests.calls)
        await reconcile(Claims(index.kueue, ClaimSettings(), clock=lambda: 1_800_000_000.0 + clock.now,
                               fleet=restarted), "a-a100", requests)
        assert len(requests.calls) == writes
        await restarted.stop()

        # Past the grace out of contact: Ready names the member and the grace.
        for reflector in fleet.members["a"].reflectors:
            reflector.contact.connected, reflector.contact.lost_at = False, clock.now
        await clock.advance(11)
        await reconcile(claims, "a-a100", requests)
        ready = next(c for c in requests.calls[-1][2]["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "MemberUnreachable") and "member a" in ready["message"]

        # A claim on a member whose kubeconfig cannot be read: no capacity ever known, and why.
        fleet.upsert(multikueue_cluster("b", "member-b"))
        await settle()
        index.kueue.upsert_claim(seen("b", {"clusterName": "b", "flavor": "a100"}))
        await reconcile(claims, "b", requests)
        ready = next(c for c in requests.calls[-1][2]["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "CapacityUnknown")
        assert 'secrets "member-b" not found' in ready["message"] and ready["message"].endswith("is kept")
        await fleet.stop()

    asyncio.run(scenario())
