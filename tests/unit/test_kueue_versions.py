"""Which Kueue version the service reads and writes. Here, what needs no cluster; the scenarios
against one: tests/cluster/test_kueue_versions.py."""

from __future__ import annotations

import asyncio
import base64
import json
import logging

import msgspec
import pytest

from kubeindex.client.api import ApiClient
from kubeindex.model.objects import KUEUE_GROUP, KUEUE_VERSIONS, MultiKueueCluster
from kubeindex.model.resources import Resource
from kubeindex.watch.discovery import KindDiscovery, choose
from kubeindex.watch.fleet import Fleet
from tests.clock import FakeClock, settle


def resource(version: str, kind: str = "ResourceFlavor") -> Resource:
    return Resource(KUEUE_GROUP, version, kind, f"{kind.lower()}s", False)


def test_the_servers_preferred_version_among_those_known_is_chosen() -> None:
    known = KUEUE_VERSIONS
    assert choose([resource("v1beta2"), resource("v1beta1")], known).version == "v1beta2"  # type: ignore[union-attr]
    assert choose([resource("v1beta1"), resource("v1beta2")], known).version == "v1beta1"  # type: ignore[union-attr]
    assert choose([resource("v1"), resource("v1beta2")], known).version == "v1beta2"  # type: ignore[union-attr]
    assert choose([resource("v1")], known) is None and choose([], known) is None


class ServedAt:
    """An API server's discovery: each kind served at ``versions``, the preferred first."""

    def __init__(self, versions: tuple[str, ...]) -> None:
        self.versions = versions

    async def served_resources(self, group: str, kind: str) -> list[Resource]:
        return [resource(v, kind) for v in self.versions]

    async def preferred_resource(self, group: str, kind: str, version: str | None = None) -> Resource | None:
        return resource(version or self.versions[0], kind)


def test_a_kind_served_only_at_unknown_versions_is_said_once_and_forgotten_when_fixed(
        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        found_: list[Resource] = []
        api = ServedAt(("v1", "v2"))
        tasks: set[asyncio.Task] = set()
        finder = KindDiscovery(api, lambda c: _keep(tasks, asyncio.ensure_future(c)),  # type: ignore[arg-type]
                               lambda need, r: found_.append(r), (), {KUEUE_GROUP: KUEUE_VERSIONS})
        need = (KUEUE_GROUP, "ClusterQueue", None)
        for _ in range(3):  # looked up again and again (retry_unserved): said once
            finder.look_up(need)
            await asyncio.gather(*tasks)
        assert finder.not_served(need) and finder.unknown == {need: ("v1", "v2")} and found_ == []
        api.versions = ("v1", "v1beta2")  # a known version served again
        finder.look_up(need)
        await asyncio.gather(*tasks)
        assert finder.unknown == {} and [r.version for r in found_] == ["v1beta2"]

    with caplog.at_level(logging.INFO, logger="kubeindex.watch.discovery"):
        asyncio.run(scenario())
    said = [r for r in caplog.records if "served only at" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert said[0].getMessage() == (
        "ClusterQueue (kueue.x-k8s.io) is served only at v1, v2, which this version of node-workload-summary does "
        "not read (it reads v1beta2, v1beta1): what needs it is off until a version it reads is served")
    assert not [r for r in caplog.records if "is not served by the API server" in r.getMessage()]


def _keep(tasks: set[asyncio.Task], task: asyncio.Task) -> asyncio.Task:
    tasks.add(task)
    return task


def test_both_multikueuecluster_shapes_project_alike() -> None:
    where = {"locationType": "Secret", "location": "member-a"}
    v1beta1 = {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "MultiKueueCluster", "metadata": {"name": "a"},
               "spec": {"kubeConfig": where}}
    v1beta2 = {**v1beta1, "apiVersion": "kueue.x-k8s.io/v1beta2", "spec": {"clusterSource": {"kubeConfig": where}}}
    profile = {**v1beta2, "spec": {"clusterSource": {"clusterProfileRef": {"name": "east"}}}}
    old, new, named = (msgspec.json.decode(json.dumps(o), type=MultiKueueCluster) for o in (v1beta1, v1beta2, profile))
    where_ = new.spec.kubeconfig()
    assert where_ is not None and old.spec.kubeconfig() == where_
    assert (where_.location, where_.locationType) == ("member-a", "Secret")
    assert old.spec.profile() == new.spec.profile() == ""
    assert named.spec.kubeconfig() is None and named.spec.profile() == "east"


class NoSecrets:
    async def get(self, path: str, params: dict[str, str] | None = None, accept: str = "",
                  timeout: float = 0) -> bytes:
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "m",
                  "clusters": [{"name": "m", "cluster": {"server": "https://127.0.0.1:9"}}],
                  "users": [{"name": "u", "user": {"token": "t"}}],
                  "contexts": [{"name": "m", "context": {"cluster": "m", "user": "u"}}]}
        return json.dumps({"data": {"kubeconfig": base64.b64encode(json.dumps(config).encode()).decode()}}).encode()


def test_a_member_the_hub_cannot_read_is_said_in_its_claims_ready(caplog: pytest.LogCaptureFixture) -> None:
    """By clusterProfileRef (its credentials come from an exec plugin); or a member whose Kueue serves
    ResourceFlavors only at a version not known: MemberUnsupported, saying what to do, and logged."""
    async def scenario() -> None:
        async def future_kueue(api: ApiClient) -> list[Resource]:
            return [resource("v1")]

        clock = FakeClock()
        fleet = Fleet(NoSecrets(), lambda r: None, lambda name: None, clock=clock, discover=future_kueue)
        fleet.upsert(msgspec.convert({"metadata": {"name": "east"}, "spec": {"clusterSource": {
            "clusterProfileRef": {"name": "east-profile"}}}}, MultiKueueCluster))
        fleet.upsert(msgspec.convert({"metadata": {"name": "west"}, "spec": {"clusterSource": {
            "kubeConfig": {"location": "member-west"}}}}, MultiKueueCluster))
        await settle()
        east, west = fleet.problem("east"), fleet.problem("west")
        assert east is not None and east.reason == "MemberUnsupported"
        assert east.message == (
            "member east: MultiKueueCluster east names its cluster by clusterProfileRef (ClusterProfile "
            "east-profile), whose credentials come from an exec plugin, which this service does not run; set "
            "spec.clusterSource.kubeConfig instead (locationType Secret: a Secret in kueue-system with key "
            "'kubeconfig'; or Path)")
        assert west is not None and west.reason == "MemberUnsupported"
        assert west.message == ("member west: member west serves ResourceFlavors only at kueue.x-k8s.io/v1, which "
                                "this version of node-workload-summary does not read (it reads v1beta2, v1beta1)")
        assert fleet.capacity("east", "a100") is None and fleet.members == {}  # held, not gone
        await fleet.stop()

    with caplog.at_level(logging.WARNING, logger="kubeindex.watch.fleet"):
        asyncio.run(scenario())
    assert sum("clusterProfileRef" in r.getMessage() for r in caplog.records) == 1
