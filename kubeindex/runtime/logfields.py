"""The structured fields of a log line: what it is about (``resource``, ``namespace``, ``name``)
and what went wrong (``error``), passed as ``log.warning(..., extra=fields(...))``.

They ride in one LogRecord attribute (``FIELDS``), so that ``name`` (the LogRecord's logger name)
and the like cannot collide. The text format leaves them out (the message says the same); the
JSON format (node_workload_summary/logs.py) writes each as a key of its own, as
controller-runtime's zap encoder does with a logger's key-value pairs."""

from __future__ import annotations

FIELDS = "fields"  # the LogRecord attribute that holds them
Extra = dict[str, dict[str, str]]


class Told(Exception):
    """An error whose text tells it all (the API's errors: status, reason and the server's
    message): the ``error`` field shows its text, where other exceptions show their type too."""


def describe(error: BaseException | str) -> str:
    """An error as the ``error`` field shows it: an API error as its text (status, reason and the
    server's message), any other exception with its type."""
    if isinstance(error, str):
        return error
    return str(error) if isinstance(error, Told) else repr(error)


def fields(resource: str = "", namespace: str = "", name: str = "", error: BaseException | str | None = None,
           **more: str) -> Extra:
    """The ``extra`` of a log call; empty values are left out."""
    found = {"resource": resource, "namespace": namespace, "name": name, **more}
    out = {key: value for key, value in found.items() if value}
    if error is not None:
        out["error"] = describe(error)
    return {FIELDS: out}


def key_fields(resource: str, key: str, error: BaseException | str | None = None) -> Extra:
    """The fields of an object known by its key (``namespace/name``, or ``name``)."""
    namespace, _, name = key.rpartition("/")
    return fields(resource, namespace, name, error)
