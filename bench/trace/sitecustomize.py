"""Where a node event's time goes inside the service: loaded into the service process by
`bench.latency_floor` (this directory first on PYTHONPATH, NWS_TRACE=<file>), never by the service
itself. Appends JSON lines with time.monotonic() stamps (system-wide on Linux, so comparable with
the bench's):

- ``node``: a watch event of a node handled (decode + index update), with the node's name and
  Ready status;
- ``render``: a /metrics render; ``refresh``: a reconciler pass over the aggregates (when > 1 ms);
- ``gc``: a garbage collection (generation, duration, objects collected);
- ``lag``: the event loop late by more than 10 ms for a 5 ms sleep (something held it).

``d`` is wall time; ``cpu`` the thread's CPU time over the same span (time.thread_time()): on a
shared machine a ``d`` far above ``cpu`` is the process waiting for a core, not work of its own.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import json
import os
import re
import time
from collections.abc import Callable
from typing import Any

PATH = os.environ.get("NWS_TRACE")
LAG = 0.010
TICK = 0.005
_NAME = re.compile(rb'"name":"([^"]+)"')
_READY = re.compile(rb'"type":"Ready","status":"(\w+)"')


def first_module(*names: str) -> Any:
    """The first of ``names`` that imports: the checkout under test may be an older one."""
    for name in names[:-1]:
        try:
            return importlib.import_module(name)
        except ImportError:
            pass
    return importlib.import_module(names[-1])


def _install(path: str) -> None:
    out = open(path, "a", buffering=1 << 16)  # noqa: SIM115 - open for the life of the process
    now = time.monotonic
    cpu = time.thread_time

    def rec(kind: str, **fields: object) -> None:
        out.write(json.dumps({"k": kind, **fields}) + "\n")

    started: list[float] = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = now()
        else:
            rec("gc", t=started[0], d=now() - started[0], gen=info["generation"], collected=info["collected"])

    gc.callbacks.append(on_gc)

    async def monitor() -> None:
        last_flush = now()
        while True:
            t, c = now(), cpu()
            await asyncio.sleep(TICK)
            late = now() - t - TICK
            if late > LAG:
                rec("lag", t=t, d=late, cpu=cpu() - c)
            if now() - last_flush > 0.5:
                out.flush()
                last_flush = now()

    running: list[asyncio.Task] = []

    # The checkout under test may predate kubeindex's layers (kubeindex/reflector.py, ...).
    reflector = first_module("kubeindex.watch.reflector", "kubeindex.reflector")

    def node_in_json(line: bytes) -> tuple[str, str]:
        name, ready = _NAME.search(line), _READY.search(line)
        return name.group(1).decode() if name else "", ready.group(1).decode() if ready else ""

    def node_in_protobuf(frame: bytes) -> tuple[str, str]:
        # here: a checkout from before protobuf has no such module
        protobuf = first_module("kubeindex.client.protobuf", "kubeindex.protobuf")
        Node = first_module("kubeindex.model.objects", "kubeindex.objects").Node

        event_type, raw = protobuf.event(frame)
        if event_type in ("BOOKMARK", "ERROR"):
            return "", ""
        node = protobuf.CODECS[Node].object(raw)
        return node.metadata.name, next((c.status for c in node.status.conditions if c.type == "Ready"), "")

    def traced(handle: Any, node_of: Callable[[bytes], tuple[str, str]]) -> Any:
        def traced_handle(self: Any, event: bytes) -> None:
            t, c = now(), cpu()
            handle(self, event)
            if self.name == "nodes":
                d, used = now() - t, cpu() - c  # before reading the name back out (not the service's work)
                name, ready = node_of(event)
                rec("node", t=t, d=d, cpu=used, name=name, ready=ready, bytes=len(event))
            if not running:
                running.append(asyncio.get_running_loop().create_task(monitor()))
        return traced_handle

    # Each encoding's event handler, wrapped.
    reflector.Reflector._handle = traced(reflector.Reflector._handle, node_in_json)
    if hasattr(reflector.Reflector, "_handle_protobuf"):  # a checkout from before protobuf has none
        reflector.Reflector._handle_protobuf = traced(
            reflector.Reflector._handle_protobuf, node_in_protobuf)

    import exporter.metrics as metrics

    render = metrics.Renderer.render

    def traced_render(self: metrics.Renderer, openmetrics_format: bool = False) -> bytes:
        t, c = now(), cpu()
        body = render(self, openmetrics_format)
        rec("render", t=t, d=now() - t, cpu=cpu() - c, bytes=len(body))
        return body

    metrics.Renderer.render = traced_render  # type: ignore[method-assign]  # wrapped; types still checked

    import reconciler.manager as manager

    queue_changes = manager.Manager.queue_changes

    def traced_refresh(self: manager.Manager) -> None:
        t, c = now(), cpu()
        queue_changes(self)
        if now() - t > 0.001:
            rec("refresh", t=t, d=now() - t, cpu=cpu() - c)

    manager.Manager.queue_changes = traced_refresh  # type: ignore[method-assign]  # wrapped; types still checked


if PATH:
    _install(PATH)
