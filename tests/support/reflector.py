"""What both halves of test_reflector (tests/unit and tests/cluster) use."""

from __future__ import annotations

from typing import Any

from kubeindex.client.api import ApiClient
from kubeindex.model.objects import PartialObject, Pod, object_key
from kubeindex.model.resources import PODS
from kubeindex.watch.reflector import Handler, InitialList, Reflector, WatchSettings


def settings(mode: InitialList, timeout: int = 3) -> WatchSettings:
    return WatchSettings(page_size=2, timeout_min=timeout, timeout_max=timeout, read_timeout=5, initial_list=mode)


class Recorder:
    """A handler keeping what it was given, noting whether the reflector was synced at each upsert;
    ``flaky``: names whose next upsert raises."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        self.deleted: list[str] = []
        self.synced_at_upsert: list[bool] = []
        self.flaky: set[str] = set()
        self.reflector: Reflector | None = None

    def upsert(self, obj: Any) -> None:
        assert self.reflector is not None
        self.synced_at_upsert.append(self.reflector.synced.is_set())
        if obj.metadata.name in self.flaky:
            self.flaky.discard(obj.metadata.name)
            raise RuntimeError(f"injected failure for {obj.metadata.name}")
        self.objects[object_key(obj.metadata)] = obj

    def delete(self, key: str) -> None:
        self.deleted.append(key)
        self.objects.pop(key, None)


def reflector(api: ApiClient, namespace: str, mode: InitialList, recorder: Recorder, metadata_only: bool = False,
              timeout: int = 3) -> Reflector:
    item = PartialObject if metadata_only else Pod
    r = Reflector(api, "pods", PODS.path(namespace), item,
                  Handler(recorder.upsert, recorder.delete), metadata_only=metadata_only,
                  settings=settings(mode, timeout))
    recorder.reflector = r
    return r


def obj(name: str, rv: str) -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": rv}}
