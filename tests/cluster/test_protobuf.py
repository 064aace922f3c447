"""Pods and nodes in protobuf (kubeindex/client/protobuf.py): the same projections as from JSON, from the
real API server, in LIST pages, WatchLists and watch events; and errors in protobuf read as in JSON.
A `compat` module: the encoding is the server's, so make compat checks it on every minor."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect
import pytest

from kubeindex.client import protobuf
from kubeindex.client.api import JSON, ApiClient, NotFound, load_connection
from kubeindex.model.objects import (
    ListMeta,
    Node,
    Pod,
)
from kubeindex.model.resources import NODES, PODS
from kubeindex.watch.reflector import Encoding, Handler, InitialList, Reflector, WatchSettings
from localkube.build import core, go_env
from localkube.cluster import LocalCluster
from tests.kube import RecordingApi, create_node, delete, ok, serves_watch_list, set_pod_phase, until

pytestmark = pytest.mark.compat


NS = "protobuf"


OWNER = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "6f0d5b8e-1111-4d1e-9a0e-000000000001",
         "controller": True}


def full_pod(name: str, node: str) -> dict[str, Any]:
    """A pod with every field the projection reads, and many it does not."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "x", "example.com/tier": "a-b.c_d"},
                     "annotations": {"note": "not projected " * 20},
                     "ownerReferences": [OWNER, {**OWNER, "kind": "ConfigMap", "name": "cm", "controller": False,
                                                 "uid": "6f0d5b8e-1111-4d1e-9a0e-000000000002"}]},
        "spec": {
            "nodeName": node, "runtimeClassName": "with-overhead",  # admission sets spec.overhead from it
            "resources": {"requests": {"cpu": "2", "memory": "1Gi"}},  # pod-level (where the server has it)
            "initContainers": [
                {"name": "sidecar", "image": "x", "restartPolicy": "Always",
                 "resources": {"requests": {"cpu": "250m"}}},
                {"name": "init", "image": "x", "resources": {"requests": {"memory": "10Mi"}}},
            ],
            "containers": [
                {"name": "main", "image": "x", "env": [{"name": "A", "value": "1"}],
                 "resources": {"requests": {"cpu": "1.5", "example.com/gpu": "8"}, "limits": {"example.com/gpu": "8"}}},
                {"name": "bare", "image": "x"},
            ],
            "tolerations": [{"key": "k", "operator": "Exists"}],
        },
    }


# Where each message of the schema is defined (the rest are the schema's own: a bookmark's views).
PROTO_FILES = {"k8s.io/api": ("core/v1",), "k8s.io/apimachinery": ("pkg/apis/meta/v1", "pkg/runtime",
                                                                  "pkg/api/resource")}


OWN = {"BookmarkMeta": "ObjectMeta", "BookmarkObject": "Pod", "PodMeta": "ObjectMeta", "Labels": "ObjectMeta"}


def upstream_fields(module_dirs: dict[str, Path]) -> dict[str, dict[str, int]]:
    """message -> field -> number, from the generated.proto files of the modules Kubernetes is built from."""
    fields: dict[str, dict[str, int]] = {}
    for module, packages in PROTO_FILES.items():
        for package in packages:
            text = (module_dirs[module] / package / "generated.proto").read_text()
            for name, body in re.findall(r"^message (\w+) \{(.*?)^\}", text, re.S | re.M):
                fields.setdefault(name, {}).update(
                    (f, int(n)) for f, n in re.findall(r"^\s+(?:optional|repeated|map<[^>]+>)\s*\S*\s+(\w+) = (\d+);",
                                                      body, re.M))
    return fields


def test_every_field_number_is_the_one_in_kubernetes_generated_proto(pytestconfig: pytest.Config,
                                                                      binaries: dict[str, Path]) -> None:
    """The schema's numbers against k8s.io/api and k8s.io/apimachinery at the version the control
    plane was built from (each minor's under make compat): a wrong number would read another field."""
    kubernetes = core(pytestconfig.getoption("kubernetes"))[1]
    dirs = {m: Path(subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", m], cwd=kubernetes.dir, check=True,
                                   env=go_env(kubernetes),  # 1.38's toolchain, which its go.mod asks for
                                   capture_output=True, text=True).stdout.strip()) for m in PROTO_FILES}
    upstream = upstream_fields(dirs)
    checked = 0
    for message, fields in protobuf.MESSAGES.items():
        theirs = upstream[OWN.get(message, message)]
        for name, number, _ in fields:
            assert theirs.get(name) == number, (message, name, number, theirs.get(name))
            checked += 1
    assert checked >= 50


@pytest.fixture(scope="module")
def kube(cluster: LocalCluster) -> Iterator[LocalCluster]:
    ok(cluster.request("/apis/node.k8s.io/v1/runtimeclasses", "POST", {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "with-overhead"},
        "handler": "runc", "overhead": {"podFixed": {"cpu": "100m", "memory": "20Mi"}}}))
    ok(cluster.request("/api/v1/namespaces", "POST",
                       {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}))
    create_node(cluster, "pb-0", {"pool": "a", "example.com/zone": "z"}, unschedulable=True)
    create_node(cluster, "pb-1", {"pool": "b"}, ready="False", allocatable={"cpu": "64", "example.com/gpu": "8"})
    capacity = {"status": {"capacity": {"cpu": "66", "example.com/gpu": "8"}}}  # unlike its allocatable
    ok(cluster.request(NODES.path(name="pb-1", subresource="status"), "PATCH", capacity,
                       content_type="application/merge-patch+json"))
    ok(cluster.request(NODES.path(name="pb-0"), "PATCH", {"spec": {"taints": [
        {"key": "gpu", "value": "x", "effect": "NoSchedule"}, {"key": "maintenance", "effect": "NoExecute"}]}},
        content_type="application/merge-patch+json"))
    for i in range(5):
        ok(cluster.request(PODS.path(NS), "POST", full_pod(f"p-{i}", f"pb-{i % 2}")))
    set_pod_phase(cluster, NS, "p-0", "Running")
    ok(cluster.request(PODS.path(NS), "POST", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bare", "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "x"}]}}))  # no node, no requests, no labels
    yield cluster
    delete(cluster, "/apis/node.k8s.io/v1/runtimeclasses/with-overhead")


class PodPage(msgspec.Struct):
    metadata: ListMeta
    items: list[Pod]


class NodePage(msgspec.Struct):
    metadata: ListMeta
    items: list[Node]


@pytest.mark.parametrize("path, kind, page_type", [(PODS.path(), Pod, PodPage), (NODES.path(), Node, NodePage)],
                         ids=["pods", "nodes"])
def test_a_list_decodes_to_what_json_decodes_to(kube: LocalCluster, path: str, kind: type, page_type: type) -> None:
    async def both() -> tuple[bytes, bytes]:
        async with ApiClient(load_connection(str(kube.kubeconfig))) as api:
            return await api.get(path, accept=JSON), await api.get(path, accept=protobuf.ACCEPT)

    as_json, as_protobuf = asyncio.run(both())
    assert as_protobuf.startswith(protobuf.MAGIC) and len(as_protobuf) < len(as_json)
    page: PodPage | NodePage = msgspec.json.decode(as_json, type=page_type)  # as the JSON path decodes it
    for step in (len(as_protobuf), 4096, 1):  # whole, and cut anywhere: as the answer may come
        meta, items = cut_page(as_protobuf, step, protobuf.CODECS[kind])
        assert items == page.items and meta.resourceVersion == page.metadata.resourceVersion
    ours = [i for i in items if i.metadata.name.startswith(("p-", "pb-"))]
    assert len(ours) == (5 if kind is Pod else 2)
    if kind is Pod:  # the projection really carries each field (not two empty decodes alike)
        pod = next(p for p in ours if p.metadata.name == "p-0")
        assert pod.status.phase == "Running" and pod.spec.nodeName == "pb-0"
        assert pod.spec.overhead == {"cpu": "100m", "memory": "20Mi"}
        assert [c.restartPolicy for c in pod.spec.initContainers] == ["Always", None]
        assert pod.spec.containers[0].resources.requests == {"cpu": "1500m", "example.com/gpu": "8"}
        assert pod.metadata.controller_ref() is not None and len(pod.metadata.ownerReferences) == 2
    else:
        node = next(n for n in ours if n.metadata.name == "pb-0")
        assert node.spec.unschedulable and [(t.key, t.effect) for t in node.spec.taints] == [
            ("gpu", "NoSchedule"), ("maintenance", "NoExecute")]
        other = next(n for n in ours if n.metadata.name == "pb-1")
        assert other.ready() == "NotReady" and other.status.capacity["cpu"] == "66"
        assert other.status.allocatable["cpu"] == "64"


def cut_page(data: bytes, step: int, codec: protobuf.Codec) -> tuple[ListMeta, list[Any]]:
    """A protobuf LIST answer fed to ListItems ``step`` bytes at a time: its metadata and items."""
    cut, raw = protobuf.ListItems(), []
    for at in range(0, len(data), step):
        raw += cut.feed(data[at:at + step])
    raw += cut.end()
    return protobuf.list_meta(cut.metadata), [codec.object(r) for r in raw]


def test_a_large_page_comes_gzipped_and_is_read_object_by_object(kube: LocalCluster) -> None:
    """A page over the server's 128 KiB gzip threshold, read as ApiClient.get_frames reads it (the
    way the reflector lists): the same pods as the JSON page, and the server did compress it."""
    ns = "protobuf-large"
    ok(kube.request("/api/v1/namespaces", "POST", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
    for i in range(60):  # 60 x 3 KB of annotation that gzip cannot shrink to nothing
        ok(kube.request(PODS.path(ns), "POST", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"big-{i}", "namespace": ns, "annotations": {"noise": os.urandom(1536).hex()}},
            "spec": {"nodeName": "pb-0", "containers": [{"name": "c", "image": "x"}]}}))
    path = PODS.path(ns)

    async def read() -> tuple[list[bytes], ListMeta, bytes, str]:
        async with ApiClient(load_connection(str(kube.kubeconfig))) as api:
            cut, items = protobuf.ListItems(), list[bytes]()
            await api.get_frames(path, {"limit": "1000"}, protobuf.ACCEPT, lambda content_type: cut, items.append)
            headers = {"Accept": protobuf.ACCEPT, **api.connection.headers()}
            async with api.session.get(api.connection.host + path, params={"limit": "1000"}, headers=headers) as resp:
                encoding = resp.headers.get("Content-Encoding", "")
            return items, protobuf.list_meta(cut.metadata), await api.get(path, accept=JSON), encoding

    items, meta, as_json, encoding = asyncio.run(read())
    page = msgspec.json.decode(as_json, type=PodPage)
    assert encoding == "gzip" and len(as_json) > 128 << 10
    assert [protobuf.CODECS[Pod].object(i) for i in items] == page.items and len(items) == 60
    assert meta.resourceVersion and not meta.continue_


class Recorder:
    """What a reflector hands its handler, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def handler(self) -> Handler[Any]:
        return Handler(lambda o: self.calls.append(("upsert", o)), lambda key: self.calls.append(("delete", key)))

    def upserted(self, name: str) -> list[Any]:
        return [o for verb, o in self.calls if verb == "upsert" and o.metadata.name == name]


@pytest.mark.parametrize("way", ["stream", "list"])
def test_a_reflector_sees_the_same_in_both_encodings(kube: LocalCluster, way: str) -> None:
    """The initial state (a WatchList where the server has it, or LIST pages of 2), then a change
    and a delete as watch events: protobuf and JSON give the handler the same calls with the same
    objects."""
    initial_list: InitialList = "list" if way == "list" else "watchlist" if serves_watch_list(kube) else "auto"

    async def run() -> tuple[dict[Encoding, tuple[Recorder, Reflector]], list[tuple[str, str]]]:
        async with RecordingApi(load_connection(str(kube.kubeconfig))) as api:
            seen: dict[Encoding, tuple[Recorder, Reflector]] = {}
            for encoding in ("protobuf", "json"):
                recorder = Recorder()
                settings = WatchSettings(page_size=2, initial_list=initial_list, encoding=encoding)
                reflector = Reflector(api, "pods", PODS.path(NS), Pod, recorder.handler(),
                                      settings=settings)
                seen[encoding] = recorder, reflector
            tasks = [asyncio.ensure_future(r.run()) for _, r in seen.values()]
            try:
                await until(lambda: all(r.synced.is_set() for _, r in seen.values()))
                name = f"moved-{initial_list}"
                ok(kube.request(PODS.path(NS), "POST", full_pod(name, "pb-1")))
                set_pod_phase(kube, NS, name, "Succeeded")
                delete(kube, PODS.path(NS, name))
                await until(lambda: all(("delete", f"{NS}/{name}") in rec.calls for rec, _ in seen.values()))
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            return seen, api.answers

    seen, answers = asyncio.run(run())
    (pb, pb_reflector), (js, js_reflector) = seen["protobuf"], seen["json"]
    assert pb.calls == js.calls
    assert pb_reflector.watch_encoding == "protobuf" and js_reflector.watch_encoding == "json"
    pages = {(accept == protobuf.ACCEPT, answer.startswith(protobuf.MEDIA_TYPE)) for accept, answer in answers}
    assert pages <= {(True, True), (False, False)}  # a LIST in protobuf is answered in protobuf
    if initial_list == "list":
        assert pages == {(True, True), (False, False)}
    moved = pb.upserted(f"moved-{initial_list}")
    assert [p.status.phase for p in moved][-1] == "Succeeded"  # a MODIFIED event, decoded
    assert len(pb.upserted("p-1")) == 1 and pb.upserted("p-1")[0].spec.overhead  # from the initial state


def test_errors_in_protobuf_read_as_in_json(kube: LocalCluster) -> None:
    async def missing() -> None:
        async with ApiClient(load_connection(str(kube.kubeconfig))) as api:
            await api.get(PODS.path(NS, "none"), accept=protobuf.ACCEPT)

    with pytest.raises(NotFound, match=r'^404 NotFound: pods "none" not found$'):
        asyncio.run(missing())
