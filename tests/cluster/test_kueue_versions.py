"""Which Kueue version the service reads and writes, and what it says when it reads none.

Without a cluster: the choice among the versions served (the API server's preference, among those
known); both MultiKueueCluster shapes projected alike; a fleet member named by clusterProfileRef, or
serving ResourceFlavors only at an unknown version, said in the claims' Ready (MemberUnsupported).

With a real API server serving Kueue's kinds only at a version the service does not know (Kueue
v0.19.0's CRDs with v1beta2 renamed v1, as a future Kueue might serve them): said once in the log,
in nws_kind_version_unknown, in /readyz (ready all the same) and in the claim's Ready; no flavor
series, no quota written.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import kubeindex.watch.discovery as discovery
from demo.kueue import V014, V019
from kubeindex.client.api import ApiClient, load_connection
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import API_VERSION, KUEUE_GROUP
from kubeindex.model.resources import CLAIMS, CLUSTER_QUEUES
from kubeindex.watch.reflector import WatchSettings
from kubeindex.watch.sources import Sources
from localkube.build import ensure_binaries
from localkube.cluster import LocalCluster, Options
from localkube.controllers import unserve
from localkube.service import Service, select, value, wait_for
from tests.kube import create_node, found, get_object, until
from tests.paths import CRDS


def future_kueue_crds() -> str:
    """Kueue v0.19.0's CRDs of the kinds the service reads, served only as v1 (its v1beta2 renamed)."""
    text = ensure_binaries((V019.crds,))["kueue-crds.yaml"].read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        (v1,) = [v for v in doc["spec"]["versions"] if v["name"] == "v1beta2"]
        doc["spec"]["versions"] = [{**v1, "name": "v1", "served": True, "storage": True}]
    return yaml.safe_dump_all(docs)


@pytest.fixture(scope="module")
def future(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """A control plane of its own (its Kueue CRDs are no real Kueue's): pool a100, its flavor and a
    queue at kueue.x-k8s.io/v1, a claim on them."""
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        crds = c.workdir / "future-kueue-crds.yaml"
        crds.write_text(future_kueue_crds())
        c.install_crds(crds)
        create_node(c, "a100-1", {"pool": "a100"}, allocatable={"cpu": "8", "nvidia.com/gpu": "4"})
        apply = ("apply", "--server-side", "--field-manager=admin", "-f", "-")
        c.kubectl(*apply, input=json.dumps({"apiVersion": "kueue.x-k8s.io/v1", "kind": "ResourceFlavor",
                                            "metadata": {"name": "a100"}, "spec": {"nodeLabels": {"pool": "a100"}}}))
        c.kubectl(*apply, input=json.dumps({"apiVersion": "kueue.x-k8s.io/v1", "kind": "ClusterQueue",
                                            "metadata": {"name": "research"}, "spec": {"resourceGroups": [{
                                                "coveredResources": ["nvidia.com/gpu"], "flavors": [{
                                                    "name": "a100", "resources": [
                                                        {"name": "nvidia.com/gpu", "nominalQuota": "0"}]}]}]}}))
        assignment = {"clusterQueueName": "research", "shares": {"nvidia.com/gpu": "50%"}}
        c.kubectl(*apply, input=json.dumps({"apiVersion": API_VERSION, "kind": "ClusterResourceClaim",
                                            "metadata": {"name": "a100"},
                                            "spec": {"flavor": "a100", "resourceAssignments": [assignment]}}))
        yield c


def test_kueue_at_an_unknown_version_is_said_in_the_log_the_metrics_readyz_and_the_claim(
        future: LocalCluster) -> None:
    kube = future
    svc = Service(kube, ("--identity=a", "--quota-settle=1", "--quota-actuation=on")).start()
    try:
        def ready() -> dict[str, Any]:
            status = found(get_object(kube, CLAIMS.path(name="a100"))).get("status", {})
            return next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})

        wait_for(lambda: ready().get("reason") == "KueueVersionUnknown", timeout=30)
        message = ready()["message"]
        for kind in ("ClusterQueue", "ResourceFlavor"):
            assert (f"{kind} (kueue.x-k8s.io): served only at kueue.x-k8s.io/v1, which this version of "
                    "node-workload-summary does not read (it reads v1beta2, v1beta1)") in message, message
        samples = svc.scrape()
        assert {dict(k)["kind"]: v for k, v in select(samples, "nws_kind_version_unknown", served="v1").items()} == {
            "ClusterQueue": 1, "ResourceFlavor": 1}
        assert not [k for k in samples if k[0].startswith("nws_flavor_")]
        assert value(samples, "nws_quota_writes_total", cluster_queue="research", result="applied") is None
        code, text = svc.get("/readyz")
        assert code == 200 and text.splitlines()[0] == "ok", text
        assert ("ClusterQueue (kueue.x-k8s.io): served only at kueue.x-k8s.io/v1, which this version of "
                "node-workload-summary does not read (it reads v1beta2, v1beta1) (optional kind: not counted "
                "against readiness)") in text.splitlines(), text
        warned = [line for line in svc.log_text().splitlines() if "is served only at v1" in line]
        assert len(warned) == 2 and all(" WARNING " in line for line in warned), warned  # one per kind
        queue = found(get_object(kube, CLUSTER_QUEUES.at("v1").path(name="research")))
        assert queue["metadata"]["generation"] == 1  # untouched
    finally:
        svc.stop()


def test_an_in_process_sources_says_it_once_however_often_it_looks_again(
        future: LocalCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(discovery, "DISCOVERY_RETRY_SECONDS", 0.2)

    async def scenario() -> None:
        async with ApiClient(load_connection(str(future.kubeconfig))) as api:
            sources = Sources(api, ClusterIndex(), WatchSettings(timeout_min=5, timeout_max=5))
            await sources.start()
            try:
                await asyncio.wait_for(sources.ready.wait(), 30)
                await asyncio.sleep(1.5)  # about 7 lookups of each
                assert sources.unknown_versions == {(KUEUE_GROUP, "ClusterQueue"): ("v1",),
                                                    (KUEUE_GROUP, "ResourceFlavor"): ("v1",)}
                assert sources.sync_problems() == []
            finally:
                await sources.stop()

    with caplog.at_level(logging.INFO, logger="kubeindex"):
        asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records if "served only at" in r.getMessage()]
    assert sorted(said) == sorted(f"{kind} (kueue.x-k8s.io) is served only at v1, which this version of "
                                  "node-workload-summary does not read (it reads v1beta2, v1beta1): what needs it "
                                  "is off until a version it reads is served" for kind in ("ClusterQueue",
                                                                                            "ResourceFlavor"))


def test_a_kueue_upgraded_under_a_running_service_is_watched_at_its_new_version(
        binaries: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Kueue v0.14.0 (v1beta1) upgraded in place to v0.19.0 serving v1beta2 only, as an upgrade to
    v0.20+ does: the v1beta1 watches' 404 stops them, and the kinds are watched again at v1beta2,
    the objects of before kept, those made after seen."""
    monkeypatch.setattr(discovery, "DISCOVERY_RETRY_SECONDS", 0.3)
    with LocalCluster(Options(), binaries) as kube:
        kube.install_crds(CRDS)
        kube.install_crds(ensure_binaries((V014.crds,))["kueue-crds.yaml"])
        apply = ("apply", "--server-side", "--field-manager=admin", "-f", "-")

        def queue(api: str, name: str, gpus: str) -> None:
            flavor = {"name": "a100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}
            kube.kubectl(*apply, input=json.dumps({
                "apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": name},
                "spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [flavor]}]}}))

        queue("kueue.x-k8s.io/v1beta1", "before", "3")

        async def scenario() -> None:
            async with ApiClient(load_connection(str(kube.kubeconfig))) as api:
                index = ClusterIndex()
                sources = Sources(api, index, WatchSettings(timeout_min=5, timeout_max=5))
                await sources.start()
                try:
                    await asyncio.wait_for(sources.ready.wait(), 30)
                    await until(lambda: "before" in index.kueue.queue_objects)
                    assert sources.reflectors["clusterqueues.kueue.x-k8s.io"].path.startswith(
                        "/apis/kueue.x-k8s.io/v1beta1/")
                    crds = kube.workdir / "upgraded.yaml"
                    crds.write_text(unserve(ensure_binaries((V019.crds,))["kueue-crds.yaml"].read_text(), ("v1beta1",)))
                    await asyncio.to_thread(kube.install_crds, crds)
                    await asyncio.to_thread(queue, "kueue.x-k8s.io/v1beta2", "after", "5")
                    await until(lambda: "after" in index.kueue.queue_objects, timeout=30)
                    assert sources.reflectors["clusterqueues.kueue.x-k8s.io"].path == \
                        CLUSTER_QUEUES.path()
                    assert index.kueue.queue_objects["after"].apiVersion == "kueue.x-k8s.io/v1beta2"
                    assert index.kueue.flavors["a100"].quota == {"nvidia.com/gpu": 8 * 10**9}  # before's 3, after's 5
                    assert sources.sync_problems() == [] and sources.optional_problems() == []
                finally:
                    await sources.stop()

        with caplog.at_level(logging.INFO, logger="kubeindex"):
            asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records if "is no longer served" in r.getMessage()]
    assert any(m.startswith("/apis/kueue.x-k8s.io/v1beta1/clusterqueues is no longer served") for m in said), said
