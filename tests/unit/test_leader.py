"""Leader election on a fake clock, against a Lease kept in memory with the API server's
resourceVersion rule (an update with a stale resourceVersion is a 409). Two electors with the
real client are tested against a real API server in test_reconciler.py and test_neighbours.py."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import socket
import threading

from kubernetes import client

from kubeindex.client.api import ApiClient, Conflict, Connection, NotFound, Transient
from kubeindex.model.resources import LEASES
from reconciler.leader import LeaderElector, LeaseSettings
from tests.clock import FakeClock

PATH = LEASES.path("default")


class LeaseStore:
    """One namespace's Leases, as the API server keeps them (create, get, update with a
    resourceVersion precondition); ``down`` makes every request fail as a dead connection would."""

    def __init__(self) -> None:
        self.leases: dict[str, dict] = {}
        self.version = 0
        self.down = False
        self.requests: list[str] = []  # each request's method

    async def request(self, method: str, path: str, body: object = None, timeout: float = 30) -> bytes:
        self.requests.append(method)
        if self.down:
            raise Transient(0, "ClientConnectorError", "connection refused")
        name = path.removeprefix(PATH).strip("/")
        if method == "GET":
            if name not in self.leases:
                raise NotFound(404, "NotFound", f'leases "{name}" not found')
            return json.dumps(self.leases[name]).encode()
        lease = copy.deepcopy(body)
        assert isinstance(lease, dict)
        name = lease["metadata"]["name"]
        if method == "POST" and name in self.leases:
            raise Conflict(409, "AlreadyExists", f'leases "{name}" already exists')
        current = self.leases.get(name, {}).get("metadata", {}).get("resourceVersion")
        if method == "PUT" and lease["metadata"].get("resourceVersion") != current:
            raise Conflict(409, "Conflict", "the object has been modified")
        self.version += 1
        lease["metadata"]["resourceVersion"] = str(self.version)
        self.leases[name] = lease
        return json.dumps(lease).encode()

    def holder(self) -> str | None:
        return self.leases["node-workload-summary"]["spec"].get("holderIdentity")


def elector(store: LeaseStore, clock: FakeClock, identity: str, changes: list[bool] | None = None) -> LeaderElector:
    settings = LeaseSettings("default", identity=identity, lease_duration=15, renew_deadline=10, retry_period=2)
    e = LeaderElector(store, settings, clock=clock)
    if changes is not None:
        e.on_change(changes.append)
    return e


def test_the_first_candidate_takes_a_free_lease_and_renews_it() -> None:
    async def main() -> None:
        store, clock = LeaseStore(), FakeClock()
        changes: list[bool] = []
        a = elector(store, clock, "a", changes)
        await a.step()
        assert a.is_leader and store.holder() == "a" and changes == [True]
        transitions = store.leases["node-workload-summary"]["spec"]["leaseTransitions"]
        await clock.advance(2)
        await a.step()
        assert a.is_leader and changes == [True]  # renewed: no new transition
        assert store.leases["node-workload-summary"]["spec"]["leaseTransitions"] == transitions

    asyncio.run(main())


def test_the_leader_renews_with_one_request_and_reads_the_lease_when_someone_else_wrote_it() -> None:
    """client-go's fast path: the leader renews the record its last write left (a PUT alone). A
    write by someone else since (an edit with kubectl) makes that PUT a 409: the leader reads the
    lease and renews what it read, in the same step."""
    async def main() -> None:
        store, clock = LeaseStore(), FakeClock()
        a = elector(store, clock, "a")
        await a.step()
        assert store.requests == ["GET", "POST"]
        for _ in range(3):
            store.requests.clear()
            await clock.advance(2)
            await a.step()
            assert store.requests == ["PUT"] and a.is_leader
        lease = store.leases["node-workload-summary"]
        renewed = lease["spec"]["renewTime"]
        assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseTransitions"] == 0
        edited = copy.deepcopy(lease)
        edited["metadata"]["labels"] = {"edited": "yes"}
        await store.request("PUT", f"{PATH}/node-workload-summary", edited)
        store.requests.clear()
        await clock.advance(2)
        await a.step()
        assert store.requests == ["PUT", "GET", "PUT"] and a.is_leader
        lease = store.leases["node-workload-summary"]
        assert lease["metadata"]["labels"] == {"edited": "yes"} and lease["spec"]["renewTime"] > renewed
        assert lease["spec"]["leaseTransitions"] == 0
        store.requests.clear()
        await clock.advance(2)
        await a.step()
        assert store.requests == ["PUT"]

    asyncio.run(main())


def test_a_leader_that_cannot_renew_stops_leading_at_the_renew_deadline() -> None:
    async def main() -> list[tuple[float, bool]]:
        store, clock = LeaseStore(), FakeClock()
        changes: list[bool] = []
        a = elector(store, clock, "a", changes)
        await a.step()
        store.down = True
        seen = []
        for _ in range(6):
            await clock.advance(2)
            await a.step()
            seen.append((clock.now - 1000, a.is_leader))
        assert "connection refused" in a.last_error
        assert changes == [True, False]
        return seen

    assert asyncio.run(main()) == [(2, True), (4, True), (6, True), (8, True), (10, False), (12, False)]


def test_a_held_lease_is_taken_only_after_its_record_stood_still_for_the_lease_duration_on_our_clock() -> None:
    async def main() -> None:
        store, clock = LeaseStore(), FakeClock()
        a, b = elector(store, clock, "a"), elector(store, clock, "b")
        await a.step()
        await b.step()  # b sees a's record for the first time: its timer starts now
        assert not b.is_leader
        for _ in range(3):  # a renews every 2 s: the record keeps changing
            await clock.advance(6)
            await a.step()
            await b.step()
            assert not b.is_leader and a.is_leader
        await clock.advance(15)  # a is gone: its record has stood still for 15 s on b's clock, not more
        await b.step()
        assert not b.is_leader
        await clock.advance(0.5)  # more than leaseDurationSeconds since b first saw this record
        await b.step()
        assert b.is_leader and store.holder() == "b"
        assert store.leases["node-workload-summary"]["spec"]["leaseTransitions"] == 1

    asyncio.run(main())


def test_a_leader_that_sees_another_holder_in_the_record_steps_down_at_once() -> None:
    async def main() -> None:
        store, clock = LeaseStore(), FakeClock()
        changes: list[bool] = []
        a = elector(store, clock, "a", changes)
        await a.step()
        store.leases["node-workload-summary"]["spec"]["holderIdentity"] = "b"  # b took it (a was paused)
        store.leases["node-workload-summary"]["metadata"]["resourceVersion"] = "99"
        await clock.advance(2)
        await a.step()
        assert not a.is_leader and changes == [True, False]  # at once, not at the renew deadline

    asyncio.run(main())


def test_two_candidates_never_both_win() -> None:
    async def main() -> None:
        store, clock = LeaseStore(), FakeClock()
        a, b = elector(store, clock, "a"), elector(store, clock, "b")
        await asyncio.gather(a.step(), b.step())
        assert [a.is_leader, b.is_leader].count(True) == 1

    asyncio.run(main())


def test_a_replica_out_of_sync_gives_the_lease_up_for_another_to_take_at_once() -> None:
    async def main() -> None:
        store, clock = LeaseStore(), FakeClock()
        changes: list[bool] = []
        a = elector(store, clock, "a", changes)
        await a.step()
        a.may_lead = lambda: ["pods: no contact with the API server for 61s"]
        await clock.advance(2)
        await a.step()
        assert not a.is_leader and changes == [True, False]
        assert store.holder() is None
        assert store.leases["node-workload-summary"]["spec"]["leaseDurationSeconds"] == 1
        b = elector(store, clock, "b")
        await b.step()  # no holder: taken at once, without waiting out the lease
        assert b.is_leader

    asyncio.run(main())


def test_elector_survives_dropped_connections() -> None:
    """A load balancer that closes connections mid-request (no answer) used to escape the
    elector and end the process."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def accept_and_drop() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):  # the accept timeout, or the socket closed at the end
                conn, _ = server.accept()
                conn.recv(65536)
                conn.close()  # mid-request, no answer

    threading.Thread(target=accept_and_drop, daemon=True).start()

    async def main() -> str:
        api = ApiClient(Connection(f"http://127.0.0.1:{port}", False, client.Configuration()))
        async with api:
            elector = LeaderElector(api, LeaseSettings("default", identity="x", retry_period=0.1))
            for _ in range(3):
                await elector.step()
            assert not elector.is_leader
            return elector.last_error

    try:
        assert asyncio.run(main()) == "GET lease: unanswered: the server closed the connection without answering"
    finally:
        stop.set()
        server.close()
