"""Unit tests of the ClusterResourceClaim arithmetic (reconciler/quota.py): examples of each rule,
hypothesis properties, and a randomized run against a from-scratch model written here."""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeindex.model.quantity import NANO, format_quantity, parse_nano
from reconciler.quota import (
    MILLI,
    Contribution,
    Plan,
    Policy,
    ResourceClaim,
    Settler,
    SettleState,
    evaluate,
    parse_claim,
    parse_spec,
    queue_patch,
)

G = NANO  # one unit
GI, TI = 2**30 * G, 2**40 * G
GPU = "nvidia.com/gpu"
KEY = ("local", "a100")


# -- builders --------------------------------------------------------------------------------------


def absolute(queue: str, resources: object) -> dict[str, Any]:  # any JSON: bad specs too
    return {"clusterQueueName": queue, "resources": resources}


def shares(queue: str, values: dict[str, str]) -> dict[str, Any]:
    return {"clusterQueueName": queue, "shares": values}


def claim_object(name: str, *assignments: dict[str, Any], flavor: str = "a100", created: str = "2024-01-01T00:00:00Z",
                 **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created},
            "spec": {"flavor": flavor, "resourceAssignments": list(assignments), **spec}}


def claim(name: str, *assignments: dict[str, Any], **kw: Any) -> ResourceClaim:
    parsed = parse_claim(claim_object(name, *assignments, **kw))
    assert parsed.problems == ()
    return parsed


def cq(name: str, flavors: dict[str, dict[str, Any]], rv: str = "1") -> dict[str, Any]:
    """A ClusterQueue, one resource group per flavor; a resource's value is its nominalQuota, or a dict
    of its fields."""
    groups = []
    for flavor, resources in flavors.items():
        entries = [{"name": r, **(v if isinstance(v, dict) else {"nominalQuota": v})} for r, v in resources.items()]
        groups.append({"coveredResources": list(resources), "flavors": [{"name": flavor, "resources": entries}]})
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
            "metadata": {"name": name, "resourceVersion": rv}, "spec": {"cohort": "all", "resourceGroups": groups}}


def queues(*objects: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {q["metadata"]["name"]: q for q in objects}


def apply_patch(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """As the API server would: the resourceVersion must match (else 409), each path must exist."""
    out = copy.deepcopy(obj)
    assert ops[0] == {"op": "replace", "path": "/metadata/resourceVersion", "value": obj["metadata"]["resourceVersion"]}
    for op in ops[1:]:
        assert op["op"] == "replace" and op["path"].endswith("/nominalQuota"), op
        *parents, last = op["path"].strip("/").split("/")
        node: Any = out
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert last in node, op
        node[last] = op["value"]
    out["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
    return out


def condition(plan: Plan, name: str, type_: str) -> dict[str, str]:
    return next(c for c in plan.claims[name].status["conditions"] if c["type"] == type_)


def cap(**values: int) -> dict[str, int]:
    return {("nvidia.com/gpu" if r == "gpu" else r): v for r, v in values.items()}


# -- the spec --------------------------------------------------------------------------------------


def test_spec_defaults_and_units() -> None:
    c = claim("c", absolute("research", {"cpu": "64", GPU: 16}), shares("prod", {"cpu": "50%", GPU: "12.5%"}))
    assert (c.spec.cluster, c.spec.flavor, c.spec.policy) == ("local", "a100", Policy.SCALE)
    research, prod = c.spec.assignments
    assert research.resources == {"cpu": 64 * G, GPU: 16 * G} and research.shares == {}
    assert prod.shares == {"cpu": 500, GPU: 125} and prod.resources == {}  # tenths of a percent
    assert c.created == 1704067200.0


INVALID = [
    ({"flavor": "a100", "resourceAssignments": [{"clusterQueueName": "q", "resources": {"cpu": "1"},
                                                 "shares": {"cpu": "1%"}}]}, "needs exactly one of resources or"),
    ({"flavor": "a100", "resourceAssignments": [{"clusterQueueName": "q"}]}, "needs exactly one of resources or"),
    ({"flavor": "a100", "resourceAssignments": [absolute("q", {"cpu": "-1"})]}, "resources[cpu] '-1' is negative"),
    ({"flavor": "a100", "resourceAssignments": [absolute("q", {"cpu": "lots"})]}, "'lots' is not a quantity"),
    ({"flavor": "a100", "resourceAssignments": [absolute("q", {"cpu": True})]}, "True is not a quantity"),
    ({"flavor": "a100", "resourceAssignments": [shares("q", {"cpu": "50"})]}, "'50' is not a share like 50% or 12.5%"),
    ({"flavor": "a100", "resourceAssignments": [shares("q", {"cpu": "100.5%"})]}, "'100.5%' is above 100%"),
    ({"flavor": "a100", "resourceAssignments": [shares("q", {"cpu": "60%"}), shares("p", {"cpu": "40.5%"})]},
     "the shares of cpu add up to 100.5% (at most 100%)"),
    ({"flavor": "a100", "resourceAssignments": [absolute("q", {}), absolute("q", {})]},
     "resourceAssignments[1]: clusterQueueName q appears more than once"),
    ({"flavor": "a100", "resourceAssignments": [absolute("Bad_Queue", {})]}, "'Bad_Queue' is not a ClusterQueue name"),
    ({"flavor": "a100", "resourceAssignments": {"q": {}}}, "resourceAssignments is not a list"),
    ({"flavor": "a100", "resourceAssignments": ["q"]}, "resourceAssignments[0] is not an object"),
    ({"flavor": "a100", "resourceAssignments": [absolute("q", ["cpu"])]}, "resources is not a map"),
    ({"flavor": "a100", "resourceAssignments": [absolute(f"q{i}", {}) for i in range(65)]},
     "resourceAssignments has 65 entries (at most 64)"),
    ({"resourceAssignments": []}, "flavor is missing"),
    ({"flavor": "A100"}, "flavor 'A100' is not a ResourceFlavor name"),
    ({"flavor": "a100", "clusterName": "My_Cluster"}, "clusterName 'My_Cluster' is not a DNS-1123 subdomain"),
    ({"flavor": "a100", "overAllocation": "Drop"}, "overAllocation 'Drop' is neither Scale nor Hold"),
    ("a100", "spec is not an object"),
]


@pytest.mark.parametrize(("spec", "problem"), INVALID)
def test_an_invalid_spec_gives_one_line_per_problem(spec: Any, problem: str) -> None:
    _, problems = parse_spec(spec)
    assert len(problems) == 1 and problem in problems[0], problems
    assert "\n" not in problems[0]


def test_an_invalid_claim_keeps_what_was_applied_for_it() -> None:
    bad = parse_claim(claim_object("c", shares("prod", {"cpu": "70%"}), shares("dev", {"cpu": "40%"})))
    assert bad.problems
    held = {"c": Contribution("a100", {"prod": {"cpu": 5 * G}})}
    plan = evaluate([bad], queues(cq("prod", {"a100": {"cpu": 1}})), {KEY: cap(cpu=100 * G)}, held=held)
    assert plan.claims["c"].contribution == held["c"]
    assert plan.desired == {"prod": {("a100", "cpu"): 5 * G}}
    ready = condition(plan, "c", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "the shares of cpu add up to 110%" in ready["message"]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.sampled_from(["50%", "12.5%", "1Gi", "-1", "a100", "q", "cpu"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["flavor", "clusterName", "overAllocation", "resourceAssignments", "clusterQueueName",
                         "resources", "shares", "cpu", GPU]), inner, max_size=5),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_parsing_never_raises(value: Any) -> None:
    _, problems = parse_spec(value)
    assert all(isinstance(p, str) and "\n" not in p for p in problems)
    parse_claim({"metadata": value, "spec": value})


# -- rounding --------------------------------------------------------------------------------------


def test_a_gpu_share_is_rounded_down_to_whole_gpus() -> None:
    """50% of 3 GPUs is 1500m, which Kueue's Value() would count as 2: it is written as 1."""
    c = claim("c", shares("prod", {GPU: "50%", "cpu": "33.3%", "memory": "50%"}))
    q = cq("prod", {"a100": {GPU: 0, "cpu": 0, "memory": 0}})
    plan = evaluate([c], queues(q), {KEY: {GPU: 3 * G, "cpu": 1 * G, "memory": 3 * G}})
    assert plan.claims["c"].contribution.queues == {"prod": {GPU: 1 * G, "cpu": 333 * MILLI, "memory": 1 * G}}
    values = {op["path"].split("/")[7]: op["value"] for op in plan.patch(q)[1:]}  # by the resource's index
    assert values == {"0": "1", "1": "333m", "2": "1"}


def test_absolute_quantities_are_taken_as_written() -> None:
    c = claim("c", absolute("research", {GPU: "1500m", "cpu": "250m"}))
    plan = evaluate([c], {}, {KEY: cap(gpu=4 * G, cpu=G)})
    assert plan.claims["c"].contribution.queues == {"research": {GPU: 1500 * MILLI, "cpu": 250 * MILLI}}


# -- per claim -------------------------------------------------------------------------------------


def test_status_of_a_claim_that_fits() -> None:
    c = claim("c", absolute("research", {"cpu": "64", GPU: "16"}), shares("prod", {"cpu": "25%", GPU: "50%"}))
    qs = queues(cq("research", {"a100": {"cpu": 0, GPU: 0}}), cq("prod", {"a100": {"cpu": 0, GPU: 0}}))
    live = {KEY: cap(cpu=120 * G, gpu=30 * G, memory=512 * GI)}
    settled = {KEY: cap(cpu=128 * G, gpu=32 * G, memory=512 * GI)}
    status = evaluate([c], qs, settled, live).claims["c"].status
    assert status == {
        "nominalResources": {"cpu": "120", "memory": "512Gi", GPU: "30"},
        "settledResources": {"cpu": "128", "memory": "512Gi", GPU: "32"},
        "assigned": {"cpu": "96", GPU: "32"},
        "unassigned": {"cpu": "32", "memory": "512Gi", GPU: "0"},
        "queues": [{"name": "prod", "resources": {"cpu": "32", GPU: "16"}},
                   {"name": "research", "resources": {"cpu": "64", GPU: "16"}}],
        "assignedPercent": "100%",
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "AssignmentsFit",
             "message": "the assignments fit; prod, research get quota of flavor a100"},
            {"type": "OverAllocated", "status": "False", "reason": "WithinCapacity",
             "message": "the assignments fit the settled capacity"},
            {"type": "QueueMissing", "status": "False", "reason": "QueuesFound",
             "message": "every named ClusterQueue has the flavor and resources"},
            {"type": "Duplicate", "status": "False", "reason": "Unique",
             "message": "no older claim is on this cluster and flavor"},
        ],
    }


def test_a_capacity_of_zero_shows_zero_for_each_resource_the_claim_names() -> None:
    """A pool with no Ready node left: nominalResources and settledResources say 0 for the cpu and
    GPUs the assignments name (kubectl's CPU and GPU columns print 0, not nothing), beside what the
    capacity still has; an unknown capacity shows nothing."""
    c = claim("c", absolute("research", {GPU: "4"}), shares("prod", {"cpu": "50%"}))
    for capacity, shown in (({}, {"cpu": "0", GPU: "0"}), (cap(cpu=0, gpu=0), {"cpu": "0", GPU: "0"}),
                            (cap(memory=GI), {"cpu": "0", "memory": "1Gi", GPU: "0"})):
        status = evaluate([c], {}, {KEY: capacity}, {KEY: capacity}).claims["c"].status
        assert status["nominalResources"] == status["settledResources"] == shown, capacity
        assert status["shortfall"] == {GPU: "4"} and status["unassigned"] == {"cpu": "0", **shown, GPU: "0"}
    unknown = evaluate([c], {}, {KEY: None}).claims["c"].status
    assert "nominalResources" not in unknown and "settledResources" not in unknown


def test_assigned_percent_is_the_highest_ratio() -> None:
    c = claim("c", absolute("research", {"cpu": "96", GPU: "8"}))
    status = evaluate([c], {}, {KEY: cap(cpu=128 * G, gpu=32 * G)}).claims["c"].status
    assert status["assignedPercent"] == "75%"


# -- over-allocation -------------------------------------------------------------------------------


def test_scale_shrinks_the_shares_first() -> None:
    """research 60 absolute, prod 50% and dev 25% of 100 = 135 asked: the shares share the 40 left."""
    c = claim("c", absolute("research", {"cpu": "60"}), shares("prod", {"cpu": "50%"}), shares("dev", {"cpu": "25%"}))
    plan = evaluate([c], {}, {KEY: cap(cpu=100 * G)})
    assert plan.claims["c"].contribution.queues == {
        "research": {"cpu": 60 * G}, "prod": {"cpu": 26666 * MILLI}, "dev": {"cpu": 13333 * MILLI}}
    status = plan.claims["c"].status
    assert status["shortfall"] == {"cpu": "35"} and status["assigned"] == {"cpu": "135"}
    over = condition(plan, "c", "OverAllocated")
    assert over["status"] == "True"
    assert over["message"] == (
        "cpu short by 35 (assigned 135, capacity 100); Scale shrank"
        " cpu of queue dev 25 -> 13333m (25% share of capacity 100, shrunk into the 40 the absolute amounts leave);"
        " cpu of queue prod 50 -> 26666m (50% share of capacity 100, shrunk into the 40 the absolute amounts leave)"
        ": lower the assignments or add capacity")


def test_scale_says_which_amounts_it_shrank_and_leaves_the_others_out() -> None:
    """One share shrunk (the demo's pool after losing half its nodes): the message names that one
    share, its queue and resource, old and new, and not the absolute amount or the cpu that fit."""
    c = claim("c", absolute("research", {"cpu": "32", GPU: "12"}), shares("prod", {"cpu": "50%", GPU: "50%"}))
    plan = evaluate([c], {}, {KEY: cap(cpu=64 * G, gpu=16 * G)})
    assert plan.claims["c"].contribution.queues == {"research": {"cpu": 32 * G, GPU: 12 * G},
                                                    "prod": {"cpu": 32 * G, GPU: 4 * G}}
    assert condition(plan, "c", "OverAllocated")["message"] == (
        "nvidia.com/gpu short by 4 (assigned 20, capacity 16); Scale shrank nvidia.com/gpu of queue prod 8 -> 4"
        " (50% share of capacity 16, shrunk into the 4 the absolute amounts leave): lower the assignments or add"
        " capacity")


def test_scale_then_shrinks_the_absolutes() -> None:
    """Absolutes 60 + 20 > 40: the shares go to 0, the absolutes shrink proportionally."""
    c = claim("c", absolute("research", {"cpu": "60"}), absolute("ops", {"cpu": "20"}), shares("prod", {"cpu": "50%"}))
    plan = evaluate([c], {}, {KEY: cap(cpu=40 * G)})
    assert plan.claims["c"].contribution.queues == {
        "research": {"cpu": 30 * G}, "ops": {"cpu": 10 * G}, "prod": {"cpu": 0}}
    assert condition(plan, "c", "OverAllocated")["message"] == (
        "cpu short by 60 (assigned 100, capacity 40); Scale shrank"
        " cpu of queue ops 20 -> 10 (absolute amount, shrunk in proportion into capacity 40);"
        " cpu of queue prod 20 -> 0 (50% share of capacity 40: the absolute amounts alone exceed it);"
        " cpu of queue research 60 -> 30 (absolute amount, shrunk in proportion into capacity 40)"
        ": lower the assignments or add capacity")


def test_scaled_gpus_are_whole_and_other_resources_are_left_alone() -> None:
    c = claim("c", absolute("a", {GPU: "4", "cpu": "1"}), absolute("b", {GPU: "4", "cpu": "1"}))
    plan = evaluate([c], {}, {KEY: cap(gpu=5 * G, cpu=8 * G)})
    assert plan.claims["c"].contribution.queues == {"a": {GPU: 2 * G, "cpu": G}, "b": {GPU: 2 * G, "cpu": G}}
    assert plan.claims["c"].status["shortfall"] == {GPU: "3"}


def test_hold_keeps_the_quota_last_applied() -> None:
    c = claim("c", absolute("research", {"cpu": "60"}), shares("prod", {"cpu": "50%"}), overAllocation="Hold")
    q = cq("research", {"a100": {"cpu": "60"}}, rv="3")
    last = Contribution("a100", {"research": {"cpu": 60 * G}, "prod": {"cpu": 50 * G}})
    fits = evaluate([c], queues(q), {KEY: cap(cpu=120 * G)}, held={"c": last})
    assert fits.claims["c"].contribution.queues == {"research": {"cpu": 60 * G}, "prod": {"cpu": 60 * G}}
    over = evaluate([c], queues(q), {KEY: cap(cpu=80 * G)}, held={"c": last})
    assert over.claims["c"].contribution == last and over.patch(q) == []
    message = condition(over, "c", "OverAllocated")["message"]
    assert message.startswith("cpu short by 20 (assigned 100, capacity 80); the quota last applied for this claim")


def test_hold_keeps_nothing_of_another_flavor_or_when_nothing_was_applied() -> None:
    c = claim("c", absolute("research", {"cpu": "60"}), overAllocation="Hold")
    other = Contribution("h100", {"research": {"cpu": 60 * G}})
    for held in ({"c": other}, {}):
        plan = evaluate([c], queues(cq("research", {"a100": {"cpu": "7"}})), {KEY: cap(cpu=10 * G)}, held=held)
        assert plan.claims["c"].contribution.queues == {} and plan.desired == {}


def test_unknown_capacity_keeps_what_was_applied() -> None:
    c = claim("c", shares("prod", {"cpu": "50%"}))
    last = Contribution("a100", {"prod": {"cpu": 64 * G}})
    plan = evaluate([c], queues(cq("prod", {"a100": {"cpu": "64"}})), {KEY: None}, held={"c": last})
    assert plan.claims["c"].contribution == last and plan.quota == {"prod": {("a100", "cpu"): 64 * G}}
    assert (condition(plan, "c", "Ready")["reason"], condition(plan, "c", "OverAllocated")["status"]) == (
        "CapacityUnknown", "Unknown")
    assert "assigned" not in plan.claims["c"].status


# -- duplicates and sums ---------------------------------------------------------------------------


def test_the_newer_claim_on_a_cluster_and_flavor_is_a_duplicate() -> None:
    old = claim("zeta", absolute("prod", {"cpu": "10"}), created="2024-01-01T00:00:00Z")
    new = claim("alpha", absolute("prod", {"cpu": "20"}), created="2024-01-02T00:00:00Z")
    tie = claim("beta", absolute("prod", {"cpu": "40"}), created="2024-01-02T00:00:00Z")
    plan = evaluate([tie, new, old], queues(cq("prod", {"a100": {"cpu": 0}})), {KEY: cap(cpu=100 * G)})
    assert plan.desired == {"prod": {("a100", "cpu"): 10 * G}}
    assert plan.claims["alpha"].contribution.queues == {} and plan.claims["beta"].contribution.queues == {}
    dup = condition(plan, "beta", "Duplicate")
    assert dup["status"] == "True" and dup["message"].startswith("claim zeta already claims cluster local flavor a100")
    assert condition(plan, "zeta", "Duplicate")["status"] == "False"
    assert condition(plan, "alpha", "Ready")["reason"] == "Duplicate"
    without_old = evaluate([tie, new], queues(cq("prod", {"a100": {"cpu": 0}})), {KEY: cap(cpu=100 * G)})
    assert without_old.desired == {"prod": {("a100", "cpu"): 20 * G}}  # same time: the name decides


def test_claims_of_two_clusters_on_one_queue_add_up() -> None:
    local = claim("local-a100", absolute("prod", {"cpu": "10"}))
    member = claim("m1-a100", shares("prod", {"cpu": "50%"}), clusterName="m1")
    settled = {KEY: cap(cpu=100 * G), ("m1", "a100"): cap(cpu=64 * G)}
    plan = evaluate([local, member], queues(cq("prod", {"a100": {"cpu": 0}})), settled)
    assert plan.desired == {"prod": {("a100", "cpu"): 42 * G}}


def test_missing_queues_flavors_and_resources_are_reported_and_not_written() -> None:
    c = claim("c", absolute("gone", {"cpu": "1"}), absolute("cpuonly", {"cpu": "1"}),
              absolute("partial", {"cpu": "2", GPU: "1", "memory": "1Gi"}))
    qs = queues(cq("cpuonly", {"cpu-pool": {"cpu": 0}}), cq("partial", {"a100": {"cpu": 0}}))
    plan = evaluate([c], qs, {KEY: cap(cpu=100 * G, gpu=8 * G, memory=TI)})
    assert plan.desired == {"partial": {("a100", "cpu"): 2 * G}}
    missing = condition(plan, "c", "QueueMissing")
    assert missing["status"] == "True"
    assert missing["message"] == ("ClusterQueue cpuonly has no flavor a100; ClusterQueue gone does not exist; "
                                  "ClusterQueue partial flavor a100 has no memory, nvidia.com/gpu (it has cpu): "
                                  "add them to the ClusterQueues, or remove the assignments")
    assert condition(plan, "c", "Ready")["reason"] == "QueueMissing"


# -- the patch -------------------------------------------------------------------------------------


def kueue_queue() -> dict[str, Any]:
    return cq("prod", {
        "cpu-pool": {"cpu": "100", "memory": "1Ti"},
        "a100": {"cpu": {"nominalQuota": "8", "borrowingLimit": "4"},
                 "memory": {"nominalQuota": "64Gi", "lendingLimit": "16Gi"},
                 GPU: {"nominalQuota": 2, "borrowingLimit": "1", "lendingLimit": "1"}},
    }, rv="41")


def test_the_patch_replaces_only_the_changed_nominal_quotas_after_the_resource_version() -> None:
    q = kueue_queue()
    c = claim("c", absolute("prod", {"cpu": "8000m", "memory": "512Gi", GPU: "4"}))
    plan = evaluate([c], queues(q), {KEY: cap(cpu=64 * G, memory=TI, gpu=8 * G)})
    ops = plan.patch(q)
    assert ops == [
        {"op": "replace", "path": "/metadata/resourceVersion", "value": "41"},
        {"op": "replace", "path": "/spec/resourceGroups/1/flavors/0/resources/1/nominalQuota", "value": "512Gi"},
        {"op": "replace", "path": "/spec/resourceGroups/1/flavors/0/resources/2/nominalQuota", "value": "4"},
    ]  # cpu asks 8000m = 8: unchanged, not rewritten
    after = apply_patch(q, ops)
    expected = copy.deepcopy(q)
    expected["spec"]["resourceGroups"][1]["flavors"][0]["resources"][1]["nominalQuota"] = "512Gi"
    expected["spec"]["resourceGroups"][1]["flavors"][0]["resources"][2]["nominalQuota"] = "4"
    expected["metadata"]["resourceVersion"] = "42"
    assert after == expected  # borrowingLimit, lendingLimit, the cpu-pool flavor: as they were
    assert evaluate([c], queues(after), {KEY: cap(cpu=64 * G, memory=TI, gpu=8 * G)}).patch(after) == []


def test_no_patch_without_a_resource_version_or_for_an_unnamed_queue() -> None:
    q = kueue_queue()
    del q["metadata"]["resourceVersion"]
    assert queue_patch(q, {("a100", GPU): 5 * G}) == []
    assert queue_patch(kueue_queue(), {}) == []
    assert queue_patch(kueue_queue(), {("h100", GPU): 5 * G}) == []


def test_nominal_quota_is_not_lowered_below_the_lending_limit() -> None:
    q = kueue_queue()  # a100 memory: nominal 64Gi, lendingLimit 16Gi
    c = claim("c", absolute("prod", {"memory": "4Gi"}))
    plan = evaluate([c], queues(q), {KEY: cap(memory=TI)})
    assert plan.desired["prod"] == {("a100", "memory"): 4 * GI}
    assert plan.quota["prod"] == {("a100", "memory"): 16 * GI}
    assert plan.patch(q)[1:] == [
        {"op": "replace", "path": "/spec/resourceGroups/1/flavors/0/resources/1/nominalQuota", "value": "16Gi"}]
    ready = condition(plan, "c", "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "LendingLimitAbove")
    assert ready["message"] == ("ClusterQueue prod flavor a100: the claims give memory 4Gi but its lendingLimit is"
                                " 16Gi, and Kueue refuses a nominalQuota below it; nominalQuota stays at 16Gi")
    above = evaluate([claim("c", absolute("prod", {"memory": "20Gi"}))], queues(q), {KEY: cap(memory=TI)})
    assert above.quota["prod"] == {("a100", "memory"): 20 * GI}
    assert condition(above, "c", "Ready")["status"] == "True"


def test_the_lending_rule_never_raises_a_quota_already_below_the_limit() -> None:
    q = cq("prod", {"a100": {"cpu": {"nominalQuota": "10", "lendingLimit": "32"}}})  # only without Kueue's webhook
    plan = evaluate([claim("c", absolute("prod", {"cpu": "16"}))], queues(q), {KEY: cap(cpu=100 * G)})
    assert plan.quota["prod"] == {("a100", "cpu"): 16 * G}
    plan = evaluate([claim("c", absolute("prod", {"cpu": "4"}))], queues(q), {KEY: cap(cpu=100 * G)})
    assert plan.quota["prod"] == {("a100", "cpu"): 10 * G} and plan.patch(q) == []


# -- settling --------------------------------------------------------------------------------------


def settle_run(settler: Settler, observations: list[tuple[float, dict[str, int] | None]]) -> list[dict | None]:
    state, out = SettleState(), []
    for now, live in observations:
        state = settler.observe(state, live, now)
        out.append(None if state.effective is None else dict(state.effective))
    return out


def test_the_first_capacity_takes_effect_at_once() -> None:
    assert settle_run(Settler(120), [(0, None), (5, {"cpu": G})]) == [None, {"cpu": G}]


def test_zeros_kept_in_a_status_are_no_change_of_capacity() -> None:
    """settledResources lists 0 for the resources a claim names: read back, it is the capacity
    without them, and nothing is pending."""
    settler = Settler(10)
    kept = SettleState({"cpu": 8 * G, GPU: 0}, None)
    assert settler.observe(kept, {"cpu": 8 * G}, 100.0) == SettleState({"cpu": 8 * G})
    assert settler.due(kept, {"cpu": 8 * G}) is None
    assert settler.observe(SettleState({"cpu": 0}), {}, 100.0) == SettleState({})


def test_a_flap_shorter_than_settle_changes_nothing() -> None:
    a, b = {"cpu": 8 * G}, {"cpu": 4 * G}
    run = settle_run(Settler(120), [(0, a), (10, b), (100, b), (110, a), (120, b), (200, b), (239, b)])
    assert run == [a] * 7  # 10..110 and 120..239: each shorter than 120 s


def test_a_change_longer_than_settle_takes_effect_with_the_value_of_that_moment() -> None:
    a, b, c = {"cpu": 8 * G}, {"cpu": 4 * G}, {"cpu": 2 * G, "memory": 0}
    run = settle_run(Settler(120), [(0, a), (10, b), (60, c), (129, c), (130, c), (500, c)])
    assert run == [a, a, a, a, {"cpu": 2 * G}, {"cpu": 2 * G}]


def test_a_decrease_may_wait_less_and_unknown_breaks_the_wait() -> None:
    a, more, less = {"cpu": 8 * G}, {"cpu": 16 * G}, {"cpu": 4 * G}
    settler = Settler(120, decrease_settle=30)
    assert settle_run(settler, [(0, a), (10, less), (40, less)]) == [a, a, less]
    assert settle_run(settler, [(0, a), (10, more), (40, more), (130, more)]) == [a, a, a, more]
    assert settle_run(settler, [(0, a), (10, less), (20, None), (41, less), (71, less)]) == [a, a, a, a, less]
    state = settler.observe(settler.observe(SettleState(), a, 0), less, 10)
    assert settler.due(state, less) == 40 and settler.due(state, a) is None
    assert settle_run(Settler(120), [(0, a), (10, less), (129, less), (130, less)]) == [a, a, a, less]


# -- properties ------------------------------------------------------------------------------------

RESOURCES = ("cpu", "memory", GPU)


def quantity(resource: str) -> st.SearchStrategy[int]:
    """Capacities and amounts as Kueue sees them, and odd ones (fractional cpu, bytes, 1500m GPU)."""
    unit = st.integers(0, 64).map(lambda n: n * G)
    odd = st.integers(0, 64_000).map(lambda n: n * MILLI) if resource != "memory" else st.integers(0, 2**36).map(
        lambda n: n * G)
    return unit | odd


@st.composite
def specs(draw: st.DrawFn, queue_names: tuple[str, ...] = ("q0", "q1", "q2", "q3")) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(queue_names), unique=True, max_size=4))
    budget = dict.fromkeys(RESOURCES, 1000)
    assignments = []
    for name in names:
        resources = draw(st.lists(st.sampled_from(RESOURCES), unique=True, min_size=1))
        if draw(st.booleans()):
            assignments.append(absolute(name, {r: format_quantity(r, draw(quantity(r))) for r in resources}))
        else:
            values = {}
            for r in resources:
                permille = draw(st.integers(0, budget[r]))
                budget[r] -= permille
                values[r] = f"{permille // 10}.{permille % 10}%"
            assignments.append(shares(name, values))
    return {"flavor": "a100", "overAllocation": draw(st.sampled_from(["Scale", "Hold"])),
            "resourceAssignments": assignments}


capacities = st.fixed_dictionaries({}, optional={r: quantity(r) for r in RESOURCES})


def claims_of(spec: dict[str, Any], name: str = "c", cluster: str = "local") -> ResourceClaim:
    parsed = parse_claim({"metadata": {"name": name, "creationTimestamp": "2024-01-01T00:00:00Z"},
                          "spec": {**spec, "clusterName": cluster}})
    assert parsed.problems == ()
    return parsed


@settings(max_examples=300, deadline=None)
@given(specs(), capacities)
def test_scale_never_gives_more_than_the_settled_capacity(spec: dict[str, Any], capacity: dict[str, int]) -> None:
    spec["overAllocation"] = "Scale"
    contribution = evaluate([claims_of(spec)], {}, {KEY: capacity}).claims["c"].contribution
    for resource in RESOURCES:
        assert sum(q.get(resource, 0) for q in contribution.queues.values()) <= capacity.get(resource, 0)


@settings(max_examples=300, deadline=None)
@given(specs(), capacities)
def test_shares_never_give_part_of_a_unit_kueue_would_round_up(spec: dict[str, Any], capacity: dict[str, int]) -> None:
    c = claims_of(spec)
    plan = evaluate([c], {}, {KEY: capacity})
    by_share = {a.queue for a in c.spec.assignments if a.shares}
    for queue in by_share:
        for resource, value in plan.claims["c"].contribution.queues.get(queue, {}).items():
            assert value % (MILLI if resource == "cpu" else G) == 0, (queue, resource, value)


def random_queue(rnd: random.Random, name: str, flavors: tuple[str, ...] = ("a100", "h100")) -> dict[str, Any]:
    out: dict[str, dict[str, Any]] = {}
    for flavor in flavors:
        if rnd.random() < 0.8:
            resources = [r for r in RESOURCES if rnd.random() < 0.8] or ["cpu"]
            out[flavor] = {r: {"nominalQuota": str(rnd.randint(0, 40)),
                               **({"lendingLimit": str(rnd.randint(0, 20))} if rnd.random() < 0.3 else {}),
                               **({"borrowingLimit": str(rnd.randint(0, 9))} if rnd.random() < 0.3 else {})}
                           for r in resources}
    return cq(name, out, rv=str(rnd.randint(1, 100)))


@settings(max_examples=200, deadline=None)
@given(st.lists(specs(), min_size=1, max_size=3), capacities, st.randoms(use_true_random=False))
def test_queue_sums_equal_claim_contributions_and_a_second_pass_patches_nothing(
        specs_: list[dict[str, Any]], capacity: dict[str, int], rnd: random.Random) -> None:
    clusters = ["local", "m1", "m2"]
    claims = [claims_of(s, f"c{i}", clusters[i]) for i, s in enumerate(specs_)]
    qs = queues(*(random_queue(rnd, f"q{i}") for i in range(3)))  # q3 does not exist
    settled = {(c, "a100"): capacity for c in clusters}
    plan = evaluate(claims, qs, settled)
    for queue, per_queue in qs.items():
        existing = {(f["name"], r["name"]) for g in per_queue["spec"]["resourceGroups"] for f in g["flavors"]
                    for r in f["resources"]}
        for key in existing:
            given_ = [r.contribution.queues.get(queue, {}).get(key[1]) for r in plan.claims.values()
                      if r.contribution.flavor == key[0]]
            named = [v for v in given_ if v is not None]
            assert plan.desired.get(queue, {}).get(key) == (sum(named) if named else None)
    applied = {name: apply_patch(q, ops) if (ops := plan.patch(q)) else q for name, q in qs.items()}
    again = evaluate(claims, applied, settled)
    assert all(again.patch(q) == [] for q in applied.values())
    assert again.quota == plan.quota


# -- a randomized run against a from-scratch model -------------------------------------------------

SETTLE = 60.0
CLUSTERS = ("local", "m1")
FLAVORS = ("a100", "h100")
QUEUES = ("q0", "q1", "q2", "q3")  # q3 is never created


@dataclass
class ModelClaim:
    """A claim as the model knows it: plain values, no parsing."""

    name: str
    created: int
    cluster: str
    flavor: str
    policy: str
    absolute: dict[str, dict[str, int]]  # queue -> resource -> nano
    shares: dict[str, dict[str, int]]  # queue -> resource -> tenths of a percent
    valid: bool = True

    def object(self) -> dict[str, Any]:
        assignments = [absolute(q, formatted(rs)) for q, rs in self.absolute.items()]
        assignments += [shares(q, {r: f"{p // 10}.{p % 10}%" for r, p in rs.items()}) for q, rs in self.shares.items()]
        if not self.valid:  # a queue with both kinds, which the CRD would have refused
            assignments.append({"clusterQueueName": "q0", "resources": {"cpu": "1"}, "shares": {"cpu": "1%"}})
        created = f"2024-01-01T00:{self.created // 60:02d}:{self.created % 60:02d}Z"
        return {"metadata": {"name": self.name, "creationTimestamp": created},
                "spec": {"clusterName": self.cluster, "flavor": self.flavor, "overAllocation": self.policy,
                         "resourceAssignments": assignments}}


@dataclass
class World:
    now: float = 0.0
    claims: dict[str, ModelClaim] = field(default_factory=dict)
    live: dict[tuple[str, str], dict[str, int] | None] = field(default_factory=dict)
    history: dict[tuple[str, str], list[tuple[float, dict[str, int] | None]]] = field(default_factory=dict)
    # queue -> (flavor, resource) -> {"nominalQuota": nano, "lendingLimit": nano | None}
    queues: dict[str, dict[tuple[str, str], dict[str, int | None]]] = field(default_factory=dict)
    applied: dict[str, tuple[str, dict[str, dict[str, int]]]] = field(default_factory=dict)


def floor_unit(resource: str, value: Fraction | int) -> int:
    unit = 10**6 if resource == "cpu" else 10**9
    return math.floor(Fraction(value) / unit) * unit


def model_settled(history: list[tuple[float, dict[str, int] | None]]) -> dict[str, int] | None:
    """In effect after the last observation: the first value, then each value that had differed
    from the one in effect at every observation of an unbroken run lasting at least SETTLE."""
    effective = None
    for i, (t, live) in enumerate(history):
        if live is None:
            continue
        if effective is None:
            effective = live
            continue
        start = i
        while start > 0 and history[start - 1][1] is not None and history[start - 1][1] != effective:
            start -= 1
        if live != effective and t - history[start][0] >= SETTLE:
            effective = live
    return effective


def model_asked(c: ModelClaim, capacity: dict[str, int]) -> dict[str, dict[str, int]]:
    out = {q: dict(rs) for q, rs in c.absolute.items()}
    for q, rs in c.shares.items():
        out[q] = {r: floor_unit(r, Fraction(capacity.get(r, 0) * p, 1000)) for r, p in rs.items()}
    return out


def model_scaled(c: ModelClaim, capacity: dict[str, int]) -> dict[str, dict[str, int]]:
    asked = model_asked(c, capacity)
    out: dict[str, dict[str, int]] = {q: {} for q in asked}
    for r in {r for rs in asked.values() for r in rs}:
        abs_total = sum(rs.get(r, 0) for q, rs in asked.items() if q in c.absolute)
        share_total = sum(rs.get(r, 0) for q, rs in asked.items() if q in c.shares)
        room = capacity.get(r, 0)
        for q, rs in asked.items():
            if r not in rs:
                continue
            if abs_total + share_total <= room:  # fits: as asked
                out[q][r] = rs[r]
            elif q in c.shares:  # the shares split what the absolutes leave, if anything
                out[q][r] = floor_unit(r, rs[r] * Fraction(room - abs_total, share_total)) if abs_total <= room else 0
            elif abs_total <= room:
                out[q][r] = rs[r]
            else:
                out[q][r] = floor_unit(r, rs[r] * Fraction(room, abs_total))
    return out


@dataclass
class ModelResult:
    duplicate: bool
    over: str  # "True" / "False" / "Unknown"
    missing: str  # "True" / "False"
    assigned: dict[str, int] | None
    gives: tuple[str, dict[str, dict[str, int]]]  # flavor, queue -> resource -> nano


def model_claims(world: World) -> dict[str, ModelResult]:
    out: dict[str, ModelResult] = {}
    taken: set[tuple[str, str]] = set()
    for c in sorted(world.claims.values(), key=lambda c: (c.created, c.name)):
        capacity = model_settled(world.history.get((c.cluster, c.flavor), []))
        duplicate = (c.cluster, c.flavor) in taken
        taken.add((c.cluster, c.flavor))
        last = world.applied.get(c.name, (c.flavor, {}))
        assigned: dict[str, int] | None = None
        over = "Unknown"
        if capacity is not None:
            assigned = {}
            for rs in model_asked(c, capacity).values():
                for r, v in rs.items():
                    assigned[r] = assigned.get(r, 0) + v
            over = str(any(v > capacity.get(r, 0) for r, v in assigned.items()))
        if duplicate:
            gives: tuple[str, dict[str, dict[str, int]]] = (c.flavor, {})
        elif not c.valid or capacity is None:
            gives = last
        elif over == "False":
            gives = (c.flavor, model_asked(c, capacity))
        elif c.policy == "Hold":
            gives = last if last[0] == c.flavor else (c.flavor, {})
        else:
            gives = (c.flavor, model_scaled(c, capacity))
        named = {(q, c.flavor, r) for q, rs in (*c.absolute.items(), *c.shares.items()) for r in rs}
        named |= {(q, gives[0], r) for q, rs in gives[1].items() for r in rs}
        missing = not duplicate and any((f, r) not in world.queues.get(q, {}) for q, f, r in named)
        out[c.name] = ModelResult(duplicate, over, str(missing), assigned, gives)
    return out


def model_step(world: World) -> dict[str, ModelResult]:
    """The claims' results, and the queues' nominalQuota as they should be written."""
    results = model_claims(world)
    sums: dict[tuple[str, str, str], int] = {}
    for result in results.values():
        flavor, given_ = result.gives
        for q, rs in given_.items():
            for r, v in rs.items():
                if (flavor, r) in world.queues.get(q, {}):
                    sums[q, flavor, r] = sums.get((q, flavor, r), 0) + v
    for (q, flavor, r), total in sums.items():
        slot = world.queues[q][flavor, r]
        lending, current = slot["lendingLimit"], slot["nominalQuota"]
        assert current is not None
        if lending is not None and total < lending:
            total = max(total, min(lending, current))
        slot["nominalQuota"] = total
    world.applied = {name: (r.gives[0], copy.deepcopy(r.gives[1])) for name, r in results.items()}
    return results


def queue_object(name: str, slots: dict[tuple[str, str], dict[str, int | None]], rv: int) -> dict[str, Any]:
    flavors: dict[str, dict[str, Any]] = {}
    for (flavor, r), slot in slots.items():
        entry = {"nominalQuota": format_quantity(r, slot["nominalQuota"] or 0)}
        if slot["lendingLimit"] is not None:
            entry["lendingLimit"] = format_quantity(r, slot["lendingLimit"])
        flavors.setdefault(flavor, {})[r] = entry
    return cq(name, flavors, rv=str(rv))


def read_back(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, int | None]]:
    return {(f["name"], r["name"]): {"nominalQuota": parse_nano(r["nominalQuota"]),
                                     "lendingLimit": parse_nano(r["lendingLimit"]) if "lendingLimit" in r else None}
            for g in obj["spec"]["resourceGroups"] for f in g["flavors"] for r in f["resources"]}


class Scenario:
    """Claims, capacity changes, queue edits and time, in random order, to the code and the model."""

    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd
        self.world = World()
        self.objects: dict[str, dict[str, Any]] = {}  # the ClusterQueues as the code sees them
        self.settler = Settler(SETTLE)
        self.states: dict[tuple[str, str], SettleState] = {}
        self.held: dict[str, Contribution] = {}
        for name in QUEUES[:3]:
            self.new_queue(name)

    def new_queue(self, name: str) -> None:
        rnd = self.rnd
        slots = {(f, r): {"nominalQuota": rnd.randint(0, 40) * G,
                          "lendingLimit": rnd.randint(0, 20) * G if rnd.random() < 0.25 else None}
                 for f in FLAVORS if rnd.random() < 0.8 for r in RESOURCES if rnd.random() < 0.7}
        self.world.queues[name] = slots
        self.objects[name] = queue_object(name, slots, rnd.randint(1, 1000))

    def amount(self, r: str) -> int:
        return self.rnd.choice([0, 1, 2, 5, 10, 20, 40]) * G + self.rnd.choice([0, 0, 0, 500 * MILLI])

    def random_claim(self, name: str, created: int) -> ModelClaim:
        rnd = self.rnd
        absolute_: dict[str, dict[str, int]] = {}
        shares_: dict[str, dict[str, int]] = {}
        budget = dict.fromkeys(RESOURCES, 1000)
        for q in rnd.sample(QUEUES, rnd.randint(0, 3)):
            resources = rnd.sample(RESOURCES, rnd.randint(1, 3))
            if rnd.random() < 0.5:
                absolute_[q] = {r: self.amount(r) for r in resources}
            else:
                shares_[q] = {}
                for r in resources:
                    shares_[q][r] = p = rnd.randint(0, budget[r])
                    budget[r] -= p
        return ModelClaim(name, created, rnd.choice(CLUSTERS), rnd.choice(FLAVORS), rnd.choice(["Scale", "Hold"]),
                          absolute_, shares_, valid=rnd.random() > 0.1)

    def capacity(self) -> dict[str, int] | None:
        rnd = self.rnd
        if rnd.random() < 0.1:
            return None
        return {r: rnd.choice([0, 1, 3, 8, 16, 64]) * G + rnd.choice([0, 0, 250 * MILLI]) * (r == "cpu")
                for r in RESOURCES if rnd.random() < 0.9}

    def event(self) -> None:
        rnd, world = self.rnd, self.world
        action = rnd.choice(["claim", "claim", "delete", "capacity", "capacity", "capacity", "time", "time",
                             "lending", "admin", "queue"])
        if action == "claim":  # a new claim, or an edit of one (its creationTimestamp kept)
            name = f"c{rnd.randint(0, 5)}"
            old = world.claims.get(name)
            world.claims[name] = self.random_claim(name, old.created if old else rnd.randint(0, 3000))
        elif action == "delete" and world.claims:
            name = rnd.choice(sorted(world.claims))
            del world.claims[name]
            self.held.pop(name, None)
        elif action == "capacity":
            world.live[rnd.choice(CLUSTERS), rnd.choice(FLAVORS)] = self.capacity()
        elif action == "time":
            world.now += rnd.choice([1, 10, 30, 59, 60, 61, 200])
        elif action in ("lending", "admin") and world.queues:  # another manager's lendingLimit, an admin's quota
            name = rnd.choice(sorted(world.queues))
            if world.queues[name]:
                slot = world.queues[name][rnd.choice(sorted(world.queues[name]))]
                if action == "lending":
                    slot["lendingLimit"] = rnd.choice([None, 0, 4 * G, 16 * G])
                else:
                    slot["nominalQuota"] = rnd.randint(0, 40) * G
                rv = int(self.objects[name]["metadata"]["resourceVersion"]) + 1
                self.objects[name] = queue_object(name, world.queues[name], rv)
        elif action == "queue":  # a ClusterQueue deleted, or (re)created with other flavors
            name = rnd.choice(QUEUES[:3])
            if name in world.queues and rnd.random() < 0.5:
                del world.queues[name], self.objects[name]
            else:
                self.new_queue(name)

    def step(self) -> tuple[Plan, dict[str, ModelResult]]:
        world = self.world
        for key in [(c, f) for c in CLUSTERS for f in FLAVORS]:  # every key observed at every step
            live = world.live.get(key)
            world.history.setdefault(key, []).append((world.now, None if live is None else
                                                      {r: v for r, v in live.items() if v}))
            self.states[key] = self.settler.observe(self.states.get(key, SettleState()), live, world.now)
        claims = [parse_claim(c.object()) for c in world.claims.values()]
        settled = {key: s.effective for key, s in self.states.items()}
        plan = evaluate(claims, self.objects, settled, dict(world.live), held=self.held)
        for name, obj in list(self.objects.items()):
            if ops := plan.patch(obj):
                self.objects[name] = apply_patch(obj, ops)
        self.held = {name: result.contribution for name, result in plan.claims.items()}
        return plan, model_step(world)


def formatted(values: dict[str, int]) -> dict[str, str]:
    return {r: format_quantity(r, v) for r, v in sorted(values.items())}


def check(plan: Plan, results: dict[str, ModelResult], scenario: Scenario, where: str) -> None:
    world = scenario.world
    assert {name: read_back(obj) for name, obj in scenario.objects.items()} == world.queues, where
    assert set(plan.claims) == set(results), where
    for name, expected in results.items():
        got = plan.claims[name]
        conditions = {c["type"]: c["status"] for c in got.status["conditions"]}
        assert conditions["Duplicate"] == str(expected.duplicate), (where, name)
        assert conditions["OverAllocated"] == expected.over, (where, name)
        assert conditions["QueueMissing"] == expected.missing, (where, name)
        assert (got.contribution.flavor, got.contribution.queues) == expected.gives, (where, name)
        if expected.assigned is not None:
            assert got.status.get("assigned", {}) == formatted(expected.assigned), (where, name)
        valid_and_unique = world.claims[name].valid and not expected.duplicate
        assert (conditions["Ready"] == "True") <= valid_and_unique, (where, name)


@pytest.mark.parametrize("seed", range(30))
def test_random_claims_capacity_and_edits_match_the_model(seed: int) -> None:
    scenario = Scenario(random.Random(seed))
    for step in range(300):
        scenario.event()
        plan, results = scenario.step()
        check(plan, results, scenario, f"seed {seed}, step {step}")
