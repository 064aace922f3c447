"""Watch framing and protobuf envelopes without a cluster (the real server's bytes are compared
with JSON in test_protobuf.py): frames split anywhere come out whole, a stream cut inside an event
is a transport error, and an error answer in protobuf is as typed as one in JSON."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubeindex import protobuf
from kubeindex.api import Gone, Transient, error_from_body, json_lines, length_prefixed


class Chunks:
    """What aiohttp's StreamReader.iter_any gives: the body in pieces of any size."""

    def __init__(self, body: bytes, cuts: list[int]) -> None:
        points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
        self.pieces = [body[a:b] for a, b in itertools.pairwise(points)]

    async def iter_any(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece


def read(frames: object, content: Chunks) -> list[bytes]:
    async def collect() -> list[bytes]:
        return [f async for f in frames(content)]  # type: ignore[operator]
    return asyncio.run(collect())


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(min_value=0), max_size=12))
def test_length_prefixed_frames_come_out_whole_however_the_stream_is_cut(frames: list[bytes], cuts: list[int]) -> None:
    body = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
    assert read(length_prefixed, Chunks(body, cuts)) == frames


@given(st.lists(st.binary(min_size=1, max_size=200).filter(lambda b: b"\n" not in b and b.strip()), max_size=8),
       st.lists(st.integers(min_value=0), max_size=12))
def test_json_lines_come_out_whole_however_the_stream_is_cut(lines: list[bytes], cuts: list[int]) -> None:
    body = b"".join(line + b"\n" for line in lines)
    assert read(json_lines, Chunks(body, cuts)) == lines


def test_a_stream_cut_inside_a_protobuf_event_is_a_transport_error() -> None:
    body = (10).to_bytes(4, "big") + b"0123456789" + (10).to_bytes(4, "big") + b"01234"
    with pytest.raises(Transient, match="ended inside an event"):
        read(length_prefixed, Chunks(body, [7]))


def envelope(raw: bytes) -> bytes:
    unknown = protobuf.CLASSES["Unknown"](raw=raw)
    return protobuf.MAGIC + unknown.SerializeToString()


def test_an_error_answer_in_protobuf_is_typed_like_one_in_json() -> None:
    status = protobuf.CLASSES["Status"](code=410, reason="Expired", message="too old resource version: 1 (5)")
    err = error_from_body(410, envelope(status.SerializeToString()))
    assert isinstance(err, Gone) and err.reason == "Expired" and err.message == "too old resource version: 1 (5)"
    garbled = error_from_body(500, protobuf.MAGIC + b"\xff\xff\xff")  # not a Status: its bytes, readable
    assert garbled.status == 500 and garbled.message.startswith("k8s")


def test_bytes_that_are_not_the_message_are_a_protobuf_error() -> None:
    with pytest.raises(protobuf.ProtobufError, match="no protobuf envelope"):
        protobuf.unwrap(b'{"kind": "PodList"}')
    with pytest.raises(protobuf.ProtobufError, match="not a valid WatchEvent"):
        protobuf.event(b"\x0a\xff")
