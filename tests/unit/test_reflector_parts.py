"""A reflector's parts as plain objects, without a cluster or an event loop: the store
(kubeindex/watch/store.py: a pass's diff, redelivery, handler failures retried), the decoder
(kubeindex/watch/decode.py: watch events and LIST pages in JSON and protobuf), the contact
(kubeindex/watch/contact.py: connected, lost since, the problem readiness reports) and the LIST's
resourceVersion (kubeindex/watch/pager.py). The reflector that runs them: tests/test_reflector.py."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from kubeindex.client import protobuf
from kubeindex.client.api import JSON, PARTIAL, PARTIAL_LIST, Forbidden, Gone, NotFound, transport_error
from kubeindex.client.watchstream import Whole
from kubeindex.model.objects import Bookmark, ObjectMeta, PartialObject, Pod
from kubeindex.model.resources import PODS
from kubeindex.watch.contact import Contact
from kubeindex.watch.decode import EventDecoder
from kubeindex.watch.pager import list_version
from kubeindex.watch.store import Handler, SourceStats, SyncStore
from tests.clock import EPOCH, FakeClock

# -- the store ------------------------------------------------------------------------------------


def obj(name: str, rv: str) -> PartialObject:
    return PartialObject(ObjectMeta(name=name, namespace="ns", resourceVersion=rv))


class Index:
    """The handler's side: what it holds, each call, and the names whose next call raises."""

    def __init__(self) -> None:
        self.objects: dict[str, str] = {}  # key -> version held
        self.calls: list[str] = []
        self.failing: set[str] = set()

    def upsert(self, o: PartialObject) -> None:
        self.calls.append(f"{o.metadata.name}@{o.metadata.resourceVersion}")
        if o.metadata.name in self.failing:
            raise RuntimeError(f"injected failure for {o.metadata.name}")
        self.objects[f"ns/{o.metadata.name}"] = o.metadata.resourceVersion

    def delete(self, key: str) -> None:
        self.calls.append(f"-{key}")
        if key.removeprefix("ns/") in self.failing:
            raise RuntimeError(f"injected failure for {key}")
        self.objects.pop(key, None)


def store_of(index: Index) -> SyncStore[PartialObject]:
    return SyncStore("replicasets.apps", Handler(index.upsert, index.delete), SourceStats(), lambda: EPOCH)


def list_pass(store: SyncStore[PartialObject], *objects: PartialObject) -> None:
    """A complete pass (a LIST, or a WatchList's state) that saw ``objects``."""
    store.begin()
    for o in objects:
        store.listed(o)
    store.complete()


def test_a_pass_hands_over_what_changed_and_deletes_what_vanished() -> None:
    index = Index()
    store = store_of(index)
    list_pass(store, obj("a", "1"), obj("b", "2"), obj("c", "3"))
    index.calls.clear()
    list_pass(store, obj("a", "1"), obj("b", "5"))  # a unchanged, b changed, c gone
    assert index.calls == ["b@5", "-ns/c"]
    assert store.versions == index.objects == {"ns/a": "1", "ns/b": "5"}
    assert store.stats.objects == 2 and store.stats.relists == 2
    assert store.stats.events == {"DELETED": 1} and store.stats.last_event == EPOCH  # the injected wall time


def test_a_pass_that_breaks_off_deletes_nothing_and_keeps_what_it_applied() -> None:
    index = Index()
    store = store_of(index)
    list_pass(store, obj("a", "1"), obj("b", "2"))
    index.calls.clear()
    store.begin()
    store.listed(obj("a", "7"))
    store.abandon()  # the connection is lost before b's page
    assert index.calls == ["a@7"] and store.seen is None
    assert store.versions == {"ns/a": "7", "ns/b": "2"}  # b not deleted: the pass was not complete
    list_pass(store, obj("a", "7"))  # the next complete pass: a not again, b deleted
    assert index.calls == ["a@7", "-ns/b"] and store.versions == {"ns/a": "7"}


def test_a_pass_started_again_diffs_against_the_fresh_snapshot_only() -> None:
    """A continue token expired: what the first attempt saw no longer counts as seen (b, gone at
    the newer snapshot, is deleted), and what it applied is not handed over twice."""
    index = Index()
    store = store_of(index)
    list_pass(store, obj("b", "1"))
    index.calls.clear()
    store.begin()
    store.listed(obj("a", "2"))
    store.listed(obj("b", "1"))
    store.again()
    store.listed(obj("a", "2"))
    store.listed(obj("c", "3"))
    store.complete()
    assert index.calls == ["a@2", "c@3", "-ns/b"]
    assert store.versions == {"ns/a": "2", "ns/c": "3"}


def test_a_failed_handler_call_is_counted_and_retried_by_the_next_pass(caplog: pytest.LogCaptureFixture) -> None:
    index = Index()
    store = store_of(index)
    list_pass(store, obj("a", "1"), obj("b", "1"))
    index.failing = {"a", "n"}
    caplog.set_level(logging.ERROR, logger="kubeindex.watch.reflector")
    list_pass(store, obj("a", "2"), obj("b", "1"), obj("n", "3"))  # a's update and new n raise
    assert store.failed == {"ns/a", "ns/n"} and store.stats.handler_errors == 2
    assert store.versions == {"ns/a": "1", "ns/b": "1"}  # a at the version the handler accepted; n not at all
    assert "replicasets.apps: handler failed for ns/a" in caplog.text
    index.failing = set()
    index.calls.clear()
    list_pass(store, obj("a", "2"), obj("b", "1"), obj("n", "3"))  # the same versions: still handed over
    assert index.calls == ["a@2", "n@3"] and not store.failed
    assert store.versions == index.objects == {"ns/a": "2", "ns/b": "1", "ns/n": "3"}


def test_a_failed_object_that_vanished_is_no_longer_due() -> None:
    index = Index()
    store = store_of(index)
    index.failing = {"n"}
    list_pass(store, obj("a", "1"), obj("n", "1"))
    assert store.failed == {"ns/n"}
    list_pass(store, obj("a", "1"))  # n deleted on the server meanwhile: nothing left to retry
    assert not store.failed and store.versions == {"ns/a": "1"}


def test_a_failed_delete_is_kept_and_deleted_by_the_next_pass() -> None:
    index = Index()
    store = store_of(index)
    list_pass(store, obj("a", "1"), obj("b", "1"))
    index.failing = {"b"}
    list_pass(store, obj("a", "1"))
    assert store.versions == {"ns/a": "1", "ns/b": "1"} and store.failed == {"ns/b"}
    index.failing = set()
    index.calls.clear()
    list_pass(store, obj("a", "1"))
    assert index.calls == ["-ns/b"] and store.versions == {"ns/a": "1"} and not store.failed


def test_redeliver_hands_every_object_over_once_on_the_next_pass() -> None:
    index = Index()
    store = store_of(index)
    list_pass(store, obj("a", "1"), obj("b", "2"))
    store.begin()
    store.redeliver()  # during a pass: it may have passed objects already, so the next pass serves
    store.listed(obj("a", "1"))
    store.complete()
    index.calls.clear()
    list_pass(store, obj("a", "1"), obj("b", "2"))
    assert index.calls == ["a@1", "b@2"]
    index.calls.clear()
    list_pass(store, obj("a", "1"), obj("b", "2"))  # served: unchanged objects are skipped again
    assert index.calls == []


def test_watch_events_record_what_the_handler_accepted() -> None:
    index = Index()
    store = store_of(index)
    store.watched("ADDED", obj("a", "1"))
    index.failing = {"a"}
    store.watched("MODIFIED", obj("a", "2"))
    assert store.versions == {"ns/a": "1"} and store.failed == {"ns/a"}  # a relist is due
    index.failing = set()
    store.watched("MODIFIED", obj("a", "3"))  # a later event retries it sooner
    assert store.versions == {"ns/a": "3"} and not store.failed
    store.watched("DELETED", obj("a", "4"))
    assert store.versions == {} and store.stats.objects == 0 and index.objects == {}


def test_a_delete_during_a_watchlists_state_is_never_resurrected_by_its_end() -> None:
    index = Index()
    store = store_of(index)
    list_pass(store, obj("old", "1"))
    store.begin()  # a WatchList: its state comes as events
    store.listed(obj("a", "2"))
    store.listed(obj("b", "3"))
    store.watched("DELETED", obj("b", "4"))
    store.complete()  # the initial-events-end bookmark
    assert store.versions == {"ns/a": "2"} and index.objects == {"ns/a": "2"}
    assert index.calls[-3:] == ["b@3", "-ns/b", "-ns/old"]


# -- the decoder ------------------------------------------------------------------------------------

GONE = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}


def line(event_type: str, body: dict[str, Any]) -> bytes:
    return json.dumps({"type": event_type, "object": body}).encode()


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv}, "spec": {"nodeName": "n-1"},
            "status": {"phase": "Running"}}


def test_what_a_decoder_asks_for() -> None:
    pods = EventDecoder(Pod)
    assert (pods.list_accept, pods.watch_accept) == (protobuf.ACCEPT, protobuf.ACCEPT_WATCH)
    assert pods.answers_protobuf(protobuf.MEDIA_TYPE) and not pods.answers_protobuf(JSON)
    assert (EventDecoder(Pod, encoding="json").list_accept, EventDecoder(Pod, encoding="json").watch_accept) == \
        (JSON, JSON)
    owners = EventDecoder(PartialObject, metadata_only=True)
    assert (owners.list_accept, owners.watch_accept) == (PARTIAL_LIST, PARTIAL)
    assert not owners.answers_protobuf(protobuf.MEDIA_TYPE)  # a kind without a codec reads JSON whatever comes


def test_json_events_decode_to_the_projection_a_bookmark_or_the_error_they_carry() -> None:
    decoder = EventDecoder(Pod)
    event = decoder.json_event(line("MODIFIED", pod("a", "7")))
    obj = event.object
    assert event.type == "MODIFIED" and isinstance(obj, Pod)
    assert (obj.metadata.name, obj.metadata.resourceVersion, obj.spec.nodeName, obj.status.phase) == \
        ("a", "7", "n-1", "Running")
    event = decoder.json_event(line("BOOKMARK", {"metadata": {
        "resourceVersion": "9", "annotations": {"k8s.io/initial-events-end": "true"}}}))
    mark = event.object
    assert event.type == "BOOKMARK" and isinstance(mark, Bookmark)
    assert mark.metadata.resourceVersion == "9" and mark.metadata.annotations == {"k8s.io/initial-events-end": "true"}
    with pytest.raises(Gone, match="too old"):
        decoder.json_event(json.dumps(GONE).encode())


def enveloped(message: Any) -> bytes:
    return protobuf.MAGIC + protobuf.CLASSES["Unknown"](raw=message.SerializeToString()).SerializeToString()


def pb_pod(name: str, rv: str) -> Any:
    return protobuf.CLASSES["Pod"](metadata=protobuf.CLASSES["PodMeta"](name=name, namespace="ns", resourceVersion=rv))


def pb_frame(event_type: str, message: Any) -> bytes:
    raw = protobuf.CLASSES["RawExtension"](raw=enveloped(message))
    return protobuf.CLASSES["WatchEvent"](type=event_type, object=raw).SerializeToString()


def test_protobuf_events_decode_as_json_ones_do() -> None:
    decoder = EventDecoder(Pod)
    event_type, raw = protobuf.event(pb_frame("ADDED", pb_pod("a", "3")))
    obj = decoder.protobuf_object(event_type, raw)
    assert event_type == "ADDED" and isinstance(obj, Pod)
    assert (obj.metadata.name, obj.metadata.resourceVersion) == ("a", "3")
    marker = protobuf.CLASSES["BookmarkObject"](metadata=protobuf.CLASSES["BookmarkMeta"](resourceVersion="15"))
    mark = decoder.protobuf_object(*protobuf.event(pb_frame("BOOKMARK", marker)))
    assert isinstance(mark, Bookmark) and mark.metadata.resourceVersion == "15"
    gone = protobuf.CLASSES["Status"](code=410, reason="Expired", message="too old resource version")
    with pytest.raises(Gone, match="too old resource version"):
        decoder.protobuf_object(*protobuf.event(pb_frame("ERROR", gone)))


def test_a_json_page_is_read_whole_and_a_protobuf_page_object_by_object() -> None:
    decoder = EventDecoder(Pod)
    handed: list[str] = []

    def take(p: Pod) -> None:
        handed.append(p.metadata.name)

    page = decoder.page(take)
    body = json.dumps({"metadata": {"resourceVersion": "5", "continue": "t1"}, "items": [pod("a", "1")]}).encode()
    assert isinstance(page.framing(JSON), Whole)
    page.on_frame(body)
    meta, items = page.end()
    assert (meta.resourceVersion, meta.continue_) == ("5", "t1") and [p.metadata.name for p in items] == ["a"]
    assert handed == []  # JSON: the caller applies the items

    page = decoder.page(take)
    whole = enveloped(protobuf.CLASSES["PodList"](metadata=protobuf.CLASSES["ListMeta"](resourceVersion="8"),
                                                  items=[pb_pod("b", "2"), pb_pod("c", "3")]))
    framing = page.framing(protobuf.MEDIA_TYPE)
    for at in range(0, len(whole), 5):  # in pieces, as a network cuts it
        for frame in framing.feed(whole[at:at + 5]):
            page.on_frame(frame)
    for frame in framing.end():
        page.on_frame(frame)
    assert handed == ["b", "c"]  # as they came
    meta, items = page.end()
    assert meta.resourceVersion == "8" and items == []


# -- the contact ------------------------------------------------------------------------------------

def test_contact_lost_and_made_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="kubeindex.watch.reflector")
    clock = FakeClock()
    contact = Contact("pods", PODS.path(), clock)
    assert contact.problem(60, synced=False) == "initial sync in progress"
    contact.made()
    assert contact.problem(60, synced=True) is None
    contact.lost(transport_error(TimeoutError()), "WATCH")
    lost_at = clock.now
    clock.now += 30
    contact.lost(transport_error(TimeoutError()), "WATCH")  # still lost: since the first
    assert not contact.connected and contact.lost_at == lost_at and contact.last_error_status == 0
    assert contact.problem(60, synced=True) is None  # within the grace
    clock.now += 31
    assert contact.problem(60, synced=True) == ("no contact with the API server for 61s (last error: no data "
                                                "within the read timeout (connection presumed dead))")
    assert caplog.text.count("pods: WATCH /api/v1/pods:") == 1  # the same reason again: not logged
    contact.made()
    assert contact.connected and contact.failure is None and contact.last_error == ""
    assert "pods: API server reachable again after 61s" in caplog.text


def test_forbidden_and_not_found_are_permanent_and_say_what_to_do() -> None:
    contact = Contact("jobs.batch", "/apis/batch/v1/jobs", FakeClock())
    contact.lost(Forbidden(403, "Forbidden", "jobs is forbidden "), "LIST")
    assert contact.forbidden and contact.permanent and contact.last_error_status == 403
    assert contact.problem(60, synced=True) == "forbidden (jobs is forbidden)"
    contact.lost(NotFound(404, "NotFound", "the server could not find the requested resource"), "LIST")
    assert contact.not_served and contact.permanent and not contact.forbidden
    assert str(contact.problem(60, synced=False)).startswith("not installed (the server could not find")
    contact.made()
    assert not contact.permanent and contact.last_error_status == 0


def test_a_bug_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    contact = Contact("pods", PODS.path(), FakeClock())
    try:
        raise KeyError("x")
    except KeyError as err:
        contact.lost(err, "LIST")
    record = next(r for r in caplog.records if r.name == "kubeindex.watch.reflector")
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert record.getMessage() == "pods: unexpected error in LIST /api/v1/pods; relisting after backoff"
    assert contact.last_error == "KeyError: 'x'"


# -- the LIST's resourceVersion ---------------------------------------------------------------------

def test_only_cache_mode_lists_at_a_resource_version() -> None:
    assert list_version("list", "42") == {} and list_version("auto", "") == {}  # a consistent read
    assert list_version("cache", "") == {"resourceVersion": "0"}  # never synced: any age
    assert list_version("cache", "42") == {"resourceVersion": "42", "resourceVersionMatch": "NotOlderThan"}
