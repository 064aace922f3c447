"""Karpenter's NodeClaims are an optional kind: without Karpenter the service is quiet about them;
the kind served later (its CRD alone here; the real Karpenter: tests/cluster/test_karpenter_summaries.py)
is picked up, and a NodeClaim's conditions move its node's rollout state in the node group."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest

import kubeindex.watch.discovery as discovery
from demo.workloads import create, node_summarizer
from kubeindex.client.api import ApiClient, load_connection
from kubeindex.model.index import ClusterIndex
from kubeindex.model.resources import NODECLAIMS
from kubeindex.watch.reflector import WatchSettings
from kubeindex.watch.sources import Sources
from localkube.cluster import LocalCluster, Options
from tests.kube import create_node, delete, nodeclaim_crd
from tests.paths import CRDS

POOL = "karpenter.sh/nodepool"


def _status(kube: LocalCluster, name: str, node: str, drifted: str) -> None:
    kube.request(NODECLAIMS.path(name=name, subresource="status"), "PATCH",
                 {"status": {"nodeName": node, "conditions": [{"type": "Drifted", "status": drifted}]}},
                 content_type="application/merge-patch+json")


def test_nodeclaims_absent_are_quiet_and_served_later_are_picked_up(
        binaries: dict[str, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(discovery, "DISCOVERY_RETRY_SECONDS", 0.3)
    with LocalCluster(Options(), binaries) as kube:
        kube.install_crds(CRDS)
        node_summarizer(kube, "karpenter", POOL)
        create_node(kube, "n1", {POOL: "web"})

        async def run() -> None:
            async with ApiClient(load_connection(str(kube.kubeconfig))) as api:
                index = ClusterIndex()
                sources = Sources(api, index, WatchSettings(timeout_min=5, timeout_max=5))
                await sources.start()
                try:
                    await asyncio.wait_for(sources.ready.wait(), 30)
                    await asyncio.sleep(1)  # a few retry periods: still quiet, and ready
                    assert sources.sync_problems() == [] and sources.optional_problems() == []
                    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
                    assert NODECLAIMS.name not in sources.reflectors

                    await asyncio.to_thread(nodeclaim_crd, kube)
                    await asyncio.to_thread(create, kube, NODECLAIMS.path(), {
                        "apiVersion": NODECLAIMS.api_version, "kind": NODECLAIMS.kind,
                        "metadata": {"name": "web-abc12", "labels": {POOL: "web"}},
                        "spec": {"expireAfter": "720h"}})
                    await asyncio.to_thread(_status, kube, "web-abc12", "n1", "True")
                    group = ("karpenter", "web")
                    started = time.monotonic()
                    while index.node_groups[group].rollout != {"Drifted": 1}:
                        assert time.monotonic() - started < 10, ("NodeClaims not picked up", caplog.text)
                        await asyncio.sleep(0.05)
                    await asyncio.to_thread(_status, kube, "web-abc12", "n1", "False")
                    while index.node_groups[group].rollout != {"UpToDate": 1}:
                        assert time.monotonic() - started < 20, index.node_groups[group].rollout
                        await asyncio.sleep(0.05)
                    await asyncio.to_thread(delete, kube, NODECLAIMS.path(name="web-abc12"))
                    while index.node_groups[group].rollout:
                        assert time.monotonic() - started < 30, index.node_groups[group].rollout
                        await asyncio.sleep(0.05)
                    assert sources.sync_problems() == [] and sources.optional_problems() == []
                finally:
                    await sources.stop()

        with caplog.at_level(logging.INFO, logger="kubeindex"):
            asyncio.run(run())
        said = f"{discovery.describe((*NODECLAIMS.group_kind, NODECLAIMS.version))} is not served"
        assert [r.levelname for r in caplog.records if said in r.getMessage()] == ["INFO"], caplog.text
