"""The controllers' writer without a cluster: each API answer as the outcome a controller acts on,
the requests each write makes, the counts by verb and status, and ``Deposed`` once this replica
no longer leads (nothing sent)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubeindex.client.api import ApiError, Conflict, Forbidden, NotFound, Transient
from reconciler.writer import EXISTS, GONE, NOT_FOUND, TERMINATING, Deposed, Done, Failed, Outcome, Writer

TERMINATING_NS = Forbidden(403, "Forbidden", "namespace ns is being terminated",
                           {"causes": [{"reason": "NamespaceTerminating"}]})


class Api:
    """The API server: each request recorded; ``answer`` raised while it is an error."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any, dict[str, str] | None, str]] = []
        self.answer: ApiError | None = None

    async def request(self, method: str, path: str, body: object = None, *, params: dict[str, str] | None = None,
                      content_type: str = "", timeout: float = 30) -> bytes:
        self.requests.append((method, path, body, params, content_type))
        if self.answer is not None:
            raise self.answer
        return b'{"metadata": {"resourceVersion": "7"}}'


def write(writer: Writer, verb: str) -> Outcome:
    calls = {"apply": lambda: writer.apply("/x", {}), "apply_status": lambda: writer.apply_status("/x", {}),
             "create": lambda: writer.create("/x", {}), "delete": lambda: writer.delete("/x", "uid-1"),
             "patch_quota": lambda: writer.json_patch("/x", []), "create_event": lambda: writer.create_event("/x", {}),
             "patch_event": lambda: writer.patch_event("/x", {})}
    return asyncio.run(calls[verb]())


def test_each_write_is_the_request_it_names_and_is_counted_by_verb() -> None:
    api = Api()
    writer = Writer(api)
    for verb in ("apply", "apply_status", "create", "delete", "patch_quota", "create_event", "patch_event"):
        assert write(writer, verb) == Done(b'{"metadata": {"resourceVersion": "7"}}')
    forced = {"fieldManager": "node-workload-summary", "force": "true"}
    owned = {"fieldManager": "node-workload-summary"}
    assert [r[:2] + r[3:] for r in api.requests] == [
        ("PATCH", "/x", forced, "application/apply-patch+yaml"),
        ("PATCH", "/x/status", forced, "application/apply-patch+yaml"),
        ("POST", "/x", owned, "application/json"),
        ("DELETE", "/x", None, "application/json"),
        ("PATCH", "/x", owned, "application/json-patch+json"),
        ("POST", "/x", None, "application/json"),
        ("PATCH", "/x", None, "application/merge-patch+json")]
    assert api.requests[3][2] == {"preconditions": {"uid": "uid-1"}, "propagationPolicy": "Background"}
    assert writer.stats.writes == dict.fromkeys(("apply", "apply_status", "create", "delete", "patch_quota",
                                                 "create_event", "patch_event"), 1)


@pytest.mark.parametrize(("verb", "error", "outcome"), [
    ("delete", NotFound(404, "NotFound", "gone"), GONE),
    ("delete", Conflict(409, "Conflict", "uid precondition failed"), GONE),
    ("create", Conflict(409, "AlreadyExists", "exists"), EXISTS),
    ("apply_status", NotFound(404, "NotFound", "gone"), NOT_FOUND),
    ("patch_event", NotFound(404, "NotFound", "expired"), NOT_FOUND),
    ("apply", TERMINATING_NS, TERMINATING),
    ("create_event", TERMINATING_NS, TERMINATING),
])
def test_an_answer_that_leaves_nothing_to_do_is_skipped_and_no_error(verb: str, error: ApiError,
                                                                     outcome: Outcome) -> None:
    api = Api()
    api.answer = error
    writer = Writer(api)
    assert write(writer, verb) == outcome
    assert writer.stats.errors == {} and writer.stats.writes == {}


@pytest.mark.parametrize(("verb", "error", "code"), [
    ("apply", NotFound(404, "NotFound", "no such namespace"), "404"),
    ("patch_quota", Conflict(409, "Conflict", "the object has been modified"), "409"),
    ("create_event", Conflict(409, "AlreadyExists", "exists"), "409"),
    ("apply_status", Forbidden(403, "Forbidden", "forbidden"), "403"),
    ("delete", Transient(0, "ConnectionResetError", "no answer"), "ConnectionResetError"),
])
def test_any_other_refusal_fails_with_its_error_and_is_counted_by_status(verb: str, error: ApiError,
                                                                         code: str) -> None:
    api = Api()
    api.answer = error
    writer = Writer(api)
    assert write(writer, verb) == Failed(error)
    assert writer.stats.errors == {code: 1} and writer.stats.writes == {}


def test_a_replica_that_no_longer_leads_sends_nothing() -> None:
    api, leading = Api(), [True]
    writer = Writer(api, leading=lambda: leading[0])
    write(writer, "apply")
    leading[0] = False
    with pytest.raises(Deposed):
        write(writer, "apply")
    assert len(api.requests) == 1
