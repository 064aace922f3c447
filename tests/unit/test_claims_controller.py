"""The ClusterResourceClaim and ClusterQueue controllers without a cluster: the index fed
projections, a fake clock, an API server that records the writer's requests: status and patches,
the dry run, the settle timer kept in the status (a new leader goes on with it), condition times,
ClusterUnknown, the writes bounded per hour, a 409 counted, Hold."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
import pytest

from kubeindex.client.api import Conflict, Forbidden
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import (
    ClaimMeta,
    ClusterQueue,
    ClusterQueueSpec,
    ClusterResourceClaim,
    FlavorQuotas,
    ObjectMeta,
    ResourceFlavor,
    ResourceFlavorSpec,
    ResourceGroup,
    ResourceQuota,
    claim_status,
)
from kubeindex.model.resources import CLAIMS, CLUSTER_QUEUES, EVENTS
from kubeindex.runtime.logfields import FIELDS
from reconciler.claims import (
    ClaimController,
    Claims,
    ClaimSettings,
    ClusterQueueController,
    changes_text,
    settle_state,
)
from reconciler.events import EventRecorder
from reconciler.manager import DONE, RETRY, Key, Result
from reconciler.quota import QuotaChange, evaluate, parse_claim, queue_patch
from reconciler.writer import Writer
from tests.builders import GPU, make_node

NODE = {"cpu": "8", GPU: "4"}


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """The API server as the writer meets it: records each request (method, path, body); ``fail``
    is its answer while set."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.fail: Exception | None = None

    async def request(self, method: str, path: str, body: object = None, *, params: dict[str, str] | None = None,
                      content_type: str = "", timeout: float = 30) -> bytes:
        if self.fail is not None:
            raise self.fail
        self.calls.append((method, path, body))
        return b"{}"


def queue(name: str, version: str = "1", gpu: str = "0", api: str = "kueue.x-k8s.io/v1beta2") -> ClusterQueue:
    resources = [ResourceQuota("cpu", "0"), ResourceQuota(GPU, gpu)]
    return ClusterQueue(ObjectMeta(name=name, resourceVersion=version),
                        ClusterQueueSpec([ResourceGroup([FlavorQuotas("a100", resources)])]), api)


def claim(name: str = "pool", status: dict[str, Any] | None = None, cluster: str = "local") -> ClusterResourceClaim:
    spec = {"clusterName": cluster, "flavor": "a100", "resourceAssignments": [
        {"clusterQueueName": "research", "resources": {GPU: "3"}},
        {"clusterQueueName": "prod", "shares": {"cpu": "50%", GPU: "50%"}}]}
    return ClusterResourceClaim(ClaimMeta(name=name, generation=3, creationTimestamp="2026-01-01T00:00:00Z"),
                                spec, status or {})


@pytest.fixture
def index() -> ClusterIndex:
    index = ClusterIndex()
    index.kueue.upsert_flavor(ResourceFlavor(ObjectMeta(name="a100"), ResourceFlavorSpec({"pool": "a100"})))
    for n in (1, 2):
        index.upsert_node(make_node(f"n{n}", {"pool": "a100"}, allocatable=NODE))
    for name in ("research", "prod"):
        index.kueue.upsert_cluster_queue(queue(name))
    return index


def run(claims: Claims, key: Key, api: Recorder | Cluster) -> Result:
    """What the key's controller does with it, through a writer that leads, unthrottled."""
    controller = (ClaimController if key[0] == CLAIMS.plural else ClusterQueueController)(claims, Writer(api))
    return asyncio.run(controller.reconcile(key))


def changed(claims: Claims) -> list[Key]:
    """The keys a pass of both controllers queues: all of them after a change, else none."""
    return [*claims.claim_keys(), *claims.queue_keys()] if claims.changed("test") else []


def written_status(request: Recorder) -> dict[str, Any]:
    method, path, body = request.calls[-1]
    assert method == "PATCH" and path.endswith("/clusterresourceclaims/pool/status")
    return body["status"]


def test_capacity_is_the_allocatable_of_the_ready_nodes(index: ClusterIndex) -> None:
    assert index.kueue.capacity("a100") == {"cpu": 16 * 10**9, GPU: 8 * 10**9}
    index.upsert_node(make_node("n2", {"pool": "a100"}, ready="False", allocatable=NODE))
    assert index.kueue.capacity("a100") == {"cpu": 8 * 10**9, GPU: 4 * 10**9}
    assert index.kueue.capacity("missing") is None


def test_status_and_patch_with_actuation_and_none_in_a_dry_run(index: ClusterIndex) -> None:
    index.kueue.upsert_claim(claim())
    for actuation in (True, False):
        claims, request = Claims(index.kueue, ClaimSettings(actuation=actuation), Clock()), Recorder()
        assert set(changed(claims)) == {(CLAIMS.plural, "pool"), (CLUSTER_QUEUES.plural, "prod"),
                                        (CLUSTER_QUEUES.plural, "research")}
        assert changed(claims) == []  # nothing changed since
        assert run(claims, (CLAIMS.plural, "pool"), request) == DONE
        status = written_status(request)
        assert status["observedGeneration"] == 3 and "pendingSince" not in status
        assert status["settledFor"] == {"clusterName": "local", "flavor": "a100"}
        assert status["queues"] == [{"name": "prod", "resources": {"cpu": "8", GPU: "4"}, "flavor": "a100"},
                                    {"name": "research", "resources": {GPU: "3"}, "flavor": "a100"}]
        assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True"
        request.calls.clear()
        run(claims, (CLUSTER_QUEUES.plural, "prod"), request)
        if actuation:
            method, path, body = request.calls[0]
            assert (method, path) == ("PATCH", CLUSTER_QUEUES.at("v1beta2").path(name="prod"))
            assert body == [{"op": "replace", "path": "/metadata/resourceVersion", "value": "1"},
                            {"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota",
                             "value": "8"},
                            {"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/resources/1/nominalQuota",
                             "value": "4"}]
            assert claims.writes.counts == {("prod", "applied"): 1}
        else:
            assert request.calls == [] and claims.writes.counts == {}


def test_a_capacity_change_settles_and_a_new_leader_goes_on_with_the_timer(index: ClusterIndex) -> None:
    clock = Clock()
    claims, request = Claims(index.kueue, ClaimSettings(settle=120, actuation=True), clock), Recorder()
    index.kueue.upsert_claim(claim())
    run(claims, (CLAIMS.plural, "pool"), request)
    index.kueue.upsert_claim(claim(status=written_status(request)))  # the watch brings it back
    index.upsert_node(make_node("n2", {"pool": "a100"}, ready="False", allocatable=NODE))
    clock.now += 10
    again = run(claims, (CLAIMS.plural, "pool"), request)
    assert again.requeue_after == pytest.approx(120.5)
    status = written_status(request)
    assert status["pendingSince"] == "2027-01-15T08:00:10Z" and status["settledResources"][GPU] == "8"
    assert status["nominalResources"][GPU] == "4"
    index.kueue.upsert_claim(claim(status=status))

    # This replica is gone; a new leader 60 s later: the change is still 60 s away, not 120.
    clock.now += 60
    leader, request = Claims(index.kueue, ClaimSettings(settle=120, actuation=True), clock), Recorder()
    kept = claim_status(claim(status=status))
    assert settle_state(kept, ("local", "a100")).since == clock.now - 60
    assert settle_state(kept, ("local", "h100")).effective is None  # another flavor: afresh
    assert run(leader, (CLAIMS.plural, "pool"), request).requeue_after == pytest.approx(60.5)
    assert request.calls == []  # nothing to write: the same status
    run(leader, (CLUSTER_QUEUES.plural, "prod"), request)
    assert [op["value"] for op in request.calls[0][2][1:]] == ["8", "4"]  # still the settled capacity
    clock.now += 61
    request.calls.clear()
    assert run(leader, (CLAIMS.plural, "pool"), request) == DONE
    status = written_status(request)
    assert "pendingSince" not in status and status["settledResources"][GPU] == "4"
    over = next(c for c in status["conditions"] if c["type"] == "OverAllocated")
    assert over["status"] == "True" and over["lastTransitionTime"] == "2027-01-15T08:02:11Z"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == "2027-01-15T08:02:11Z"


def test_an_unchanged_condition_keeps_its_time(index: ClusterIndex) -> None:
    clock = Clock()
    claims, request = Claims(index.kueue, ClaimSettings(), clock), Recorder()
    index.kueue.upsert_claim(claim())
    run(claims, (CLAIMS.plural, "pool"), request)
    first = written_status(request)
    index.kueue.upsert_claim(claim(status=first))
    clock.now += 300
    index.kueue.upsert_claim(claim(status={**first, "conditions": [{**c, "message": "stale"}
                                                                   for c in first["conditions"]]}))
    run(claims, (CLAIMS.plural, "pool"), request)
    assert [c["lastTransitionTime"] for c in written_status(request)["conditions"]] == \
           [c["lastTransitionTime"] for c in first["conditions"]]


def test_a_queue_is_patched_at_the_version_it_was_read_at(index: ClusterIndex) -> None:
    """A ClusterQueue read at v1beta1 (a Kueue before v0.15) is patched there, with its field paths."""
    index.kueue.upsert_cluster_queue(queue("prod", api="kueue.x-k8s.io/v1beta1"))
    index.kueue.upsert_claim(claim())
    claims, request = Claims(index.kueue, ClaimSettings(actuation=True), Clock()), Recorder()
    run(claims, (CLUSTER_QUEUES.plural, "prod"), request)
    assert request.calls[0][:2] == ("PATCH", CLUSTER_QUEUES.at("v1beta1").path(name="prod"))


def test_kueue_served_only_at_versions_not_read_is_said_in_every_claims_ready(index: ClusterIndex) -> None:
    problem: list[str | None] = [None]
    claims, request = Claims(index.kueue, ClaimSettings(actuation=True), Clock(),
                             kueue_problem=lambda: problem[0]), Recorder()
    index.kueue.upsert_claim(claim())
    assert changed(claims) and changed(claims) == []
    problem[0] = "ClusterQueue (kueue.x-k8s.io): served only at kueue.x-k8s.io/v1"
    assert (CLAIMS.plural, "pool") in changed(claims)  # the problem's change alone queues the claims again
    run(claims, (CLAIMS.plural, "pool"), request)
    ready = next(c for c in written_status(request)["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "KueueVersionUnknown")
    assert ready["message"] == ("ClusterQueue (kueue.x-k8s.io): served only at kueue.x-k8s.io/v1; the quota last "
                                "applied for this claim is kept")


def test_a_claim_on_another_cluster_is_held_as_cluster_unknown(index: ClusterIndex) -> None:
    claims, request = Claims(index.kueue, ClaimSettings(actuation=True), Clock()), Recorder()
    index.kueue.upsert_claim(claim(cluster="member-1"))
    run(claims, (CLAIMS.plural, "pool"), request)
    ready = next(c for c in written_status(request)["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ClusterUnknown") and "member-1" in ready["message"]
    request.calls.clear()
    run(claims, (CLUSTER_QUEUES.plural, "prod"), request)
    assert request.calls == []


def test_writes_per_queue_are_bounded_per_hour_and_a_conflict_is_counted(index: ClusterIndex) -> None:
    clock = Clock()
    claims, request = Claims(index.kueue, ClaimSettings(actuation=True, max_writes_per_hour=2), clock), Recorder()
    index.kueue.upsert_claim(claim())
    for n in range(2):
        run(claims, (CLUSTER_QUEUES.plural, "prod"), request)
        index.kueue.upsert_cluster_queue(queue("prod", version=str(n + 2)))  # as if another manager reset it
        clock.now += 60
    assert run(claims, (CLUSTER_QUEUES.plural, "prod"), request).requeue_after == pytest.approx(3600 - 120)
    assert claims.writes.counts == {("prod", "applied"): 2, ("prod", "throttled"): 1}
    clock.now += 3600
    request.fail = Conflict(409, "Conflict", "the object has been modified")
    assert run(claims, (CLUSTER_QUEUES.plural, "prod"), request) == RETRY  # with backoff
    assert claims.writes.counts[("prod", "conflict")] == 1


def test_hold_keeps_the_contribution_kept_in_the_status(index: ClusterIndex) -> None:
    clock = Clock()
    claims, request = Claims(index.kueue, ClaimSettings(settle=0, actuation=True), clock), Recorder()
    held = claim()  # research 3 GPUs, prod 50%: 3 + 4 of 8 fit
    held.spec["overAllocation"] = "Hold"
    index.kueue.upsert_claim(held)
    run(claims, (CLAIMS.plural, "pool"), request)
    before = written_status(request)
    index.kueue.upsert_claim(ClusterResourceClaim(held.metadata, held.spec, before))  # the watch brings it back
    index.upsert_node(make_node("n2", {"pool": "a100"}, ready="False", allocatable=NODE))
    clock.now += 1
    run(claims, (CLAIMS.plural, "pool"), request)  # a settle of 0: at once
    status = written_status(request)
    assert status["shortfall"] == {GPU: "1"}  # research's 3 and half of 4 GPUs, of 4
    assert status["queues"] == before["queues"]  # held: what was applied
    assert claims.last is not None and claims.last.plan.desired["prod"] == {("a100", "cpu"): 8 * 10**9,
                                                                            ("a100", GPU): 4 * 10**9}


def test_a_quota_write_is_logged_and_recorded_as_an_event_on_each_claim_it_wrote_for(
        index: ClusterIndex, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    recorder = EventRecorder("node-workload-summary", "replica-a", clock)
    claims, request = Claims(index.kueue, ClaimSettings(actuation=True), clock, recorder=recorder), Recorder()
    index.kueue.upsert_claim(claim())
    caplog.set_level("INFO", logger="reconciler.claims")
    run(claims, (CLUSTER_QUEUES.plural, "prod"), request)
    assert [c[:2] for c in request.calls] == [("PATCH", CLUSTER_QUEUES.at("v1beta2").path(name="prod")),
                                              ("POST", EVENTS.path("default"))]
    [line] = [r for r in caplog.records if r.name == "reconciler.claims"]
    assert line.getMessage() == ("ClusterQueue prod nominalQuota written: flavor a100 cpu 0 -> 8,"
                                 " nvidia.com/gpu 0 -> 4 (claim pool)")
    assert getattr(line, FIELDS) == {"resource": "clusterqueues.kueue.x-k8s.io", "name": "prod", "claim": "pool"}
    event = request.calls[1][2]
    assert event["regarding"] == {"apiVersion": "ux.sean.example.com/v1alpha1", "kind": "ClusterResourceClaim",
                                  "name": "pool"}
    assert event["related"] == {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "name": "prod"}
    assert (event["reason"], event["action"], event["type"]) == ("QuotaWritten", "WriteQuota", "Normal")
    assert event["note"] == "ClusterQueue prod nominalQuota written: flavor a100 cpu 0 -> 8, nvidia.com/gpu 0 -> 4"
    assert event["reportingController"] == "node-workload-summary" and event["reportingInstance"] == "replica-a"

    # A failed Event leaves the write as it was: counted applied, nothing retried.
    index.kueue.upsert_cluster_queue(queue("research"))
    request.calls.clear()

    class RefusingEvents(Recorder):
        async def request(self, method: str, path: str, body: object = None, **kwargs: Any) -> bytes:
            if path.endswith("/events"):
                raise Forbidden(403, "Forbidden", "events is forbidden")
            return await super().request(method, path, body, **kwargs)

    assert run(claims, (CLUSTER_QUEUES.plural, "research"), RefusingEvents()) == DONE
    assert claims.writes.counts[("research", "applied")] == 1 and recorder.counts["failed"] == 1
    assert "ClusterQueue research nominalQuota written: flavor a100 nvidia.com/gpu 0 -> 3 (claim pool)" in caplog.text


def test_the_changes_of_a_write_are_told_by_flavor_with_the_claims_that_make_them() -> None:
    g = 10**9
    changes = [QuotaChange("a100", "cpu", "/0", 64 * g, 32 * g), QuotaChange("a100", GPU, "/1", 16 * g, 4 * g),
               QuotaChange("h100", GPU, "/2", None, 8 * g)]
    claims_of = {("a100", "cpu"): ("a100",), ("a100", GPU): ("a100",), ("h100", GPU): ("east-h100", "west-h100")}
    assert changes_text(changes, claims_of) == ("flavor a100 cpu 64 -> 32, nvidia.com/gpu 16 -> 4 (claim a100);"
                                                " flavor h100 nvidia.com/gpu none -> 8 (claims east-h100, west-h100)")
    assert changes_text(changes[:1]) == "flavor a100 cpu 64 -> 32"


def test_a_claim_moved_to_another_flavor_takes_its_capacity_at_once(index: ClusterIndex) -> None:
    index.kueue.upsert_flavor(ResourceFlavor(ObjectMeta(name="h100"), ResourceFlavorSpec({"pool": "h100"})))
    index.upsert_node(make_node("h1", {"pool": "h100"}, allocatable=NODE))
    clock = Clock()
    claims, request = Claims(index.kueue, ClaimSettings(settle=120), clock), Recorder()
    index.kueue.upsert_claim(claim())
    run(claims, (CLAIMS.plural, "pool"), request)
    moved = claim(status=written_status(request))
    moved.spec["flavor"] = "h100"
    index.kueue.upsert_claim(moved)
    clock.now += 1
    assert run(claims, (CLAIMS.plural, "pool"), request) == DONE  # nothing pending: no 120 s on a100's capacity
    status = written_status(request)
    assert status["settledResources"][GPU] == "4" and status["settledFor"]["flavor"] == "h100"
    assert "pendingSince" not in status


# -- held back: random claims, capacity changes and edits against a from-scratch computation -------

SETTLE = 10.0


class Cluster:
    """What the API server would do with the controller's writes: a status apply becomes the
    claim's status, a JSON patch of a ClusterQueue is applied (409 on a stale resourceVersion)."""

    def __init__(self, index: ClusterIndex) -> None:
        self.index = index
        self.version = 1

    async def request(self, method: str, path: str, body: Any = None, *, params: dict[str, str] | None = None,
                      content_type: str = "", timeout: float = 30) -> bytes:
        if path.endswith("/status"):
            old = self.index.kueue.claims[body["metadata"]["name"]]
            self.index.kueue.upsert_claim(ClusterResourceClaim(old.metadata, old.spec, body["status"]))
            return b"{}"
        if "/events" in path:
            return b"{}"
        assert content_type == "application/json-patch+json", content_type
        name = path.rsplit("/", 1)[1]
        queue = msgspec.to_builtins(self.index.kueue.queue_objects[name])
        for op in body:
            assert op["op"] == "replace"
            *parents, last = op["path"].strip("/").split("/")
            target = queue
            for part in parents:
                target = target[int(part)] if isinstance(target, list) else target[part]
            if op["path"] == "/metadata/resourceVersion" and op["value"] != target[last]:
                raise Conflict(409, "Conflict", "the object has been modified")
            target[last] = op["value"]
        self.version += 1
        queue["metadata"]["resourceVersion"] = str(self.version)
        self.index.kueue.upsert_cluster_queue(msgspec.convert(queue, ClusterQueue))
        return b"{}"


def reconcile(claims: Claims, cluster: Cluster, now: float, due: dict[tuple[str, str], float]) -> None:
    """One pass of the controllers and their workers: the changed keys and those due, each once."""
    keys = set(changed(claims)) | {k for k, when in due.items() if when <= now}
    for key in sorted(keys):
        due.pop(key, None)
        result = run(claims, key, cluster)
        again = 0.0 if result.requeue else result.requeue_after  # a retry: at once, as backoff would soon
        if again is not None:
            due[key] = now + again


@pytest.mark.parametrize("seed", range(20))
def test_random_capacity_and_edits_converge_to_the_quota_computed_from_scratch(seed: int) -> None:
    """Nodes going NotReady and back, claims edited, added and deleted, time passing, in random
    order; once the capacity has been still for the settle time, every ClusterQueue's nominalQuota
    is what quota.evaluate computes from scratch from the claims and the live capacity."""
    rng = random.Random(seed)
    index = ClusterIndex()
    index.kueue.upsert_flavor(ResourceFlavor(ObjectMeta(name="a100"), ResourceFlavorSpec({"pool": "a100"})))
    nodes = [f"n{i}" for i in range(4)]
    for node in nodes:
        index.upsert_node(make_node(node, {"pool": "a100"}, allocatable=NODE))
    for name in ("research", "prod", "dev"):
        index.kueue.upsert_cluster_queue(queue(name))
    clock = Clock()
    claims = Claims(index.kueue, ClaimSettings(settle=SETTLE, actuation=True), clock,
                    recorder=EventRecorder("node-workload-summary", "a", clock))
    cluster = Cluster(index)
    due: dict[tuple[str, str], float] = {}

    def random_spec() -> dict[str, Any]:
        assignments = []
        budget = 100
        for name in rng.sample(["research", "prod", "dev"], rng.randint(1, 3)):
            if rng.random() < 0.5:
                share = rng.randint(0, budget)
                budget -= share
                assignments.append({"clusterQueueName": name, "shares": {GPU: f"{share}%", "cpu": f"{share}%"}})
            else:
                assignments.append({"clusterQueueName": name, "resources": {GPU: str(rng.randint(0, 10))}})
        return {"clusterName": "local", "flavor": "a100", "resourceAssignments": assignments}

    def write(name: str) -> None:
        old = index.kueue.claims.get(name)
        meta = ClaimMeta(name=name, generation=(old.metadata.generation + 1) if old else 1,
                         creationTimestamp=f"2026-01-01T00:00:0{len(name)}Z")  # pool is older than extra
        index.kueue.upsert_claim(ClusterResourceClaim(meta, random_spec(), old.status if old else {}))

    write("pool")
    for _ in range(60):
        action = rng.choice(("node", "node", "edit", "time", "time"))
        if action == "node":
            index.upsert_node(make_node(rng.choice(nodes), {"pool": "a100"}, ready=rng.choice(("True", "False")),
                                        allocatable=NODE))
        elif action == "edit":
            if "extra" in index.kueue.claims and rng.random() < 0.3:
                index.kueue.delete_claim("extra")  # a duplicate of pool while it lives: it contributes nothing
            else:
                write(rng.choice(("pool", "extra")))
        else:
            clock.now += rng.uniform(0, 1.5 * SETTLE)
        reconcile(claims, cluster, clock.now, due)

    for _ in range(4):  # the capacity stays as it is now for longer than the settle time
        clock.now += SETTLE
        reconcile(claims, cluster, clock.now, due)
    parsed = [parse_claim({"metadata": {"name": c.metadata.name, "creationTimestamp": c.metadata.creationTimestamp},
                           "spec": c.spec}) for c in index.kueue.claims.values()]
    live = {("local", "a100"): index.kueue.capacity("a100")}
    queues = {n: msgspec.to_builtins(q) for n, q in index.kueue.queue_objects.items()}
    expected = evaluate(parsed, queues, live).quota
    assert expected, "no claim named a queue: the run tested nothing"
    for name, quotas in expected.items():
        assert queue_patch(queues[name], quotas) == [], (seed, name, quotas)
