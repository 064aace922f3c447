"""The Event recorder (reconciler/events.py) without a cluster, on a fake clock: the events.k8s.io/v1
body, the spam filter's token bucket per object, identical Events counted on one series, an Event
gone created again, and a failed write dropped without raising."""

from __future__ import annotations

import asyncio
from typing import Any

from kubeindex.client.api import Forbidden, NotFound
from kubeindex.model.resources import EVENTS
from reconciler.events import Event, EventRecorder, Ref
from reconciler.writer import Writer

CLAIM = Ref("ux.sean.example.com/v1alpha1", "ClusterResourceClaim", "gpu", "uid-1")
QUEUE = Ref("kueue.x-k8s.io/v1beta1", "ClusterQueue", "prod", "uid-2")


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.25

    def __call__(self) -> float:
        return self.now


class Server:
    """The API server as the writer meets it, for Events: each create stored, a patch of one that
    is not there answered 404; ``fail`` is its answer while set."""

    def __init__(self) -> None:
        self.events: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []  # (method, content type)
        self.fail: Exception | None = None

    async def request(self, method: str, path: str, body: Any = None, *, params: dict[str, str] | None = None,
                      content_type: str = "", timeout: float = 30) -> bytes:
        self.calls.append((method, content_type))
        if self.fail is not None:
            raise self.fail
        if method == "POST":
            assert path == EVENTS.path(body['metadata']['namespace'])
            assert body["metadata"]["name"] not in self.events and content_type == "application/json"
            self.events[body["metadata"]["name"]] = body
            return b"{}"
        assert method == "PATCH" and content_type == "application/merge-patch+json", method
        name = path.rsplit("/", 1)[1]
        if name not in self.events:
            raise NotFound(404, "NotFound", f'events.events.k8s.io "{name}" not found')
        self.events[name] = {**self.events[name], **body}
        return b"{}"


def record(recorder: EventRecorder, server: Server, note: str = "prod cpu 64 -> 32",
           regarding: Ref = CLAIM) -> str:
    event = Event(regarding, "QuotaWritten", "WriteQuota", note, related=QUEUE)
    return asyncio.run(recorder.record(event, Writer(server)))


def test_an_event_is_an_events_k8s_io_v1_event_in_default_for_a_cluster_scoped_object() -> None:
    clock, server = Clock(), Server()
    recorder = EventRecorder("node-workload-summary", "replica-a", clock)
    assert record(recorder, server) == "created"
    [(name, body)] = server.events.items()
    assert name == f"gpu.{int(clock.now * 1e9):x}"
    assert body == {
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name, "namespace": "default"},
        "eventTime": "2027-01-15T08:00:00.250000Z", "reportingController": "node-workload-summary",
        "reportingInstance": "replica-a", "action": "WriteQuota", "reason": "QuotaWritten",
        "regarding": {"apiVersion": "ux.sean.example.com/v1alpha1", "kind": "ClusterResourceClaim", "name": "gpu",
                      "uid": "uid-1"},
        "related": {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "name": "prod", "uid": "uid-2"},
        "note": "prod cpu 64 -> 32", "type": "Normal"}
    # Another at the same instant: another name. A namespaced object's Event is in its namespace.
    assert record(recorder, server, "prod cpu 32 -> 16") == "created"
    assert record(recorder, server, regarding=Ref("v1", "Pod", "p", namespace="ml")) == "created"
    assert len(server.events) == 3
    assert {b["metadata"]["namespace"] for b in server.events.values()} == {"default", "ml"}


def test_a_note_and_a_name_are_cut_to_what_the_api_server_takes() -> None:
    server = Server()
    record(EventRecorder("c", "i", Clock()), server, "é" * 700)
    [body] = server.events.values()
    assert len(body["note"].encode()) <= 1024 and body["note"] == "é" * 512
    long = Ref("v", "K", "a" * 235 + "-" + "b" * 17)  # a 253-character claim name
    record(EventRecorder("c", "i", Clock()), server, regarding=long)
    name = next(n for n in server.events if n.startswith("a"))
    assert len(name) == 253 - 1 and name.startswith("a" * 235 + ".")  # no "-." in a DNS name


def test_identical_events_are_one_event_whose_series_counts_them() -> None:
    clock, server = Clock(), Server()
    recorder = EventRecorder("c", "i", clock)
    assert record(recorder, server) == "created"
    clock.now += 10
    assert record(recorder, server) == "patched"
    clock.now += 10
    assert record(recorder, server) == "patched"
    [body] = server.events.values()
    assert body["series"] == {"count": 3, "lastObservedTime": "2027-01-15T08:00:20.250000Z"}
    assert record(recorder, server, "prod cpu 32 -> 64") == "created"  # another note: another Event
    assert len(server.events) == 2


def test_the_spam_filter_lets_25_through_then_one_every_5_minutes_per_object() -> None:
    clock, server = Clock(), Server()
    recorder = EventRecorder("c", "i", clock)
    results = [record(recorder, server, f"prod cpu {n} -> {n + 1}") for n in range(40)]
    assert results == ["created"] * 25 + ["throttled"] * 15
    assert record(recorder, server, regarding=Ref("v", "K", "other")) == "created"  # a bucket per object
    clock.now += 299
    assert record(recorder, server, "late") == "throttled"
    clock.now += 2
    assert record(recorder, server, "late") == "created"
    assert record(recorder, server, "later") == "throttled"
    assert recorder.counts == {"created": 27, "throttled": 17}


def test_repeats_dropped_by_the_filter_are_counted_on_the_next_patch() -> None:
    clock, server = Clock(), Server()
    recorder = EventRecorder("c", "i", clock, burst=2)
    assert [record(recorder, server) for _ in range(5)] == ["created", "patched", "throttled", "throttled",
                                                            "throttled"]
    clock.now += 300
    assert record(recorder, server) == "patched"
    [body] = server.events.values()
    assert body["series"]["count"] == 6


def test_an_event_gone_is_created_again_and_a_failure_is_dropped() -> None:
    clock, server = Clock(), Server()
    recorder = EventRecorder("c", "i", clock)
    record(recorder, server)
    server.events.clear()  # expired: the API server's --event-ttl
    clock.now += 1
    assert record(recorder, server) == "created"
    assert len(server.events) == 1 and "series" not in next(iter(server.events.values()))
    server.fail = Forbidden(403, "Forbidden", 'events.events.k8s.io is forbidden: cannot create')
    assert record(recorder, server, "another") == "failed"  # no exception: the write it reports stands
    server.fail = None
    assert record(recorder, server, "another") == "created"  # not cached as recorded
    assert [c[0] for c in server.calls] == ["POST", "PATCH", "POST", "POST", "POST"]


def test_an_identical_event_after_a_failed_patch_is_created_afresh() -> None:
    """A patch refused (not a 404) forgets the Event: the next identical one is a new Event, not a
    patch of one the server may never count again."""
    clock, server = Clock(), Server()
    recorder = EventRecorder("c", "i", clock)
    assert record(recorder, server) == "created"
    server.fail = Forbidden(403, "Forbidden", "events is forbidden")
    assert record(recorder, server) == "failed"
    server.fail = None
    clock.now += 1
    assert record(recorder, server) == "created"
    assert [method for method, _ in server.calls] == ["POST", "PATCH", "POST"]
