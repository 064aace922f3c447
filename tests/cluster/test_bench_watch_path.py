"""bench/watch_path.py on the session's control plane: the watch events it captures are the
server's protobuf frames of the pods and their phase flips, and replaying them moves the index as
a live watch would."""

from __future__ import annotations

import asyncio
from collections import Counter

from bench.watch_path import capture, nowhere, per_event, replayer
from kubeindex.client import protobuf
from localkube.cluster import LocalCluster


def test_captured_events_replay_through_the_index(cluster: LocalCluster) -> None:
    frames = asyncio.run(capture(cluster, pods=4, flips=1, namespace="watch-path"))
    assert Counter(protobuf.event(f)[0] for f in frames) == {"ADDED": 4, "MODIFIED": 4}

    async def replay() -> None:
        async with nowhere() as api:
            on_frame, modified, sources = replayer(api, frames, namespace="watch-path")
            index = sources.index
            assert len(modified) == 4 and {e.phase for e in index.pods.values()} == {"Pending"}
            assert per_event(on_frame, modified, None) > 0
            assert {e.phase for e in index.pods.values()} == {"Running"}  # the flips, replayed
            assert index.workloads["5d8f0000-0000-4000-8000-000000000001"].pods == {"Running": 4}
            assert per_event(on_frame, modified, bytearray(1 << 16)) > 0
            await sources.stop()

    asyncio.run(replay())
