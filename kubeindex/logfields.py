"""The structured fields of a log line: what it is about (``resource``, ``namespace``, ``name``)
and what went wrong (``error``), passed as ``log.warning(..., extra=fields(...))``.

They ride in one LogRecord attribute (``FIELDS``), so that ``name`` (the LogRecord's logger name)
and the like cannot collide. The text format leaves them out (the message says the same); the
JSON format (node_workload_summary/logs.py) writes each as a key of its own, as
controller-runtime's zap encoder does with a logger's key-value pairs."""

from __future__ import annotations

from .api import ApiError, path_parts
from .objects import split_key

FIELDS = "fields"  # the LogRecord attribute that holds them
Extra = dict[str, dict[str, str]]


def describe(error: BaseException | str) -> str:
    """An error as the ``error`` field shows it: an API error as its text (status, reason and the
    server's message), any other exception with its type."""
    if isinstance(error, str):
        return error
    return str(error) if isinstance(error, ApiError) else repr(error)


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
    namespace, name = split_key(key)
    return fields(resource, namespace, name, error)


def path_fields(path: str, error: BaseException | str | None = None) -> Extra:
    """The fields of the object (or collection) an API path names."""
    resource, namespace, name = path_parts(path)
    return fields(resource, namespace, name, error)
