"""A watch's wire without a cluster (the real server's bytes are compared with JSON in
test_protobuf.py; a real server's watches in test_reflector.py and test_faults.py): chunked
transfer coding and frames cut anywhere come out whole, an answer cut inside an event or a chunk
is a transport error, and an error answer in protobuf is as typed as one in JSON."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kubeindex.client import protobuf
from kubeindex.client.api import Gone, error_from_body
from kubeindex.client.watchstream import (
    ChunkedBody,
    Endpoint,
    Framing,
    JsonLines,
    LengthPrefixed,
    PlainBody,
    StreamError,
    parse_head,
)
from kubeindex.model.objects import ListMeta, OwnerReference, Pod, Resources
from kubeindex.model.resources import PODS


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` in pieces of any size, as reads give it."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def read(framing: Framing, data: bytes, cuts: list[int]) -> list[bytes]:
    frames = [f for piece in pieces(data, cuts) for f in framing.feed(piece)]
    return frames + framing.end()


@given(st.lists(st.binary(max_size=300), max_size=8), st.lists(st.integers(min_value=0), max_size=12))
def test_length_prefixed_frames_come_out_whole_however_the_stream_is_cut(frames: list[bytes], cuts: list[int]) -> None:
    body = b"".join(len(f).to_bytes(4, "big") + f for f in frames)
    assert read(LengthPrefixed(), body, cuts) == frames


@given(st.lists(st.binary(min_size=1, max_size=200).filter(lambda b: b"\n" not in b and b.strip()), max_size=8),
       st.lists(st.integers(min_value=0), max_size=12), st.booleans())
def test_json_lines_come_out_whole_however_the_stream_is_cut(lines: list[bytes], cuts: list[int],
                                                            last_ended: bool) -> None:
    body = b"\n".join(lines) + (b"\n" if last_ended else b"")
    assert read(JsonLines(), body, cuts) == lines


def test_a_stream_cut_inside_a_protobuf_event_is_a_transport_error() -> None:
    body = (10).to_bytes(4, "big") + b"0123456789" + (10).to_bytes(4, "big") + b"01234"
    with pytest.raises(StreamError, match="ended inside an event") as err:
        read(LengthPrefixed(), body, [7])
    assert err.value.reason == "truncated"


def test_a_length_no_object_has_is_a_broken_stream_not_a_gigabyte_buffer() -> None:
    with pytest.raises(StreamError, match="not a protobuf watch stream"):
        LengthPrefixed().feed(b"{\"ty")  # JSON where protobuf was announced: 2 GB "long"


def chunked(payload: bytes, sizes: list[int], extension: bool) -> bytes:
    """``payload`` in chunks of these sizes (the last one takes the rest), then the last chunk and
    a trailer."""
    out, rest = [], payload
    for size in [*sizes, len(payload)]:
        part, rest = rest[:size], rest[size:]
        if part:
            out.append(b"%x%s\r\n%s\r\n" % (len(part), b";ext=1" if extension else b"", part))
    return b"".join(out) + b"0\r\nX-Trailer: 1\r\n\r\n"


@given(st.binary(max_size=2000), st.lists(st.integers(min_value=1, max_value=700), max_size=6),
       st.lists(st.integers(min_value=0), max_size=12), st.booleans())
def test_chunked_bodies_come_out_whole_however_they_are_chunked_and_cut(
        payload: bytes, sizes: list[int], cuts: list[int], extension: bool) -> None:
    body = ChunkedBody()
    out = b"".join(bytes(body.feed(piece)) for piece in pieces(chunked(payload, sizes, extension), cuts))
    assert out == payload and body.done


def test_chunked_body_ends_at_its_last_chunk_and_not_before() -> None:
    body = ChunkedBody()
    assert body.feed(b"5\r\nhello\r\n") == b"hello" and not body.done
    assert body.feed(b"0\r\n") == b"" and body.done
    assert body.feed(b"5\r\nafter\r\n") == b""  # nothing after the last chunk is payload


@pytest.mark.parametrize("wire, problem", [
    (b"zz\r\n", "not a chunk size"),
    (b"-5\r\nhello\r\n", "not a chunk size"),
    (b"0x5\r\nhello\r\n", "not a chunk size"),
    (b"5\r\nhelloXX", "not followed by CRLF"),
    (b"5\r\nhello\r\n5\r\nworldXX\r\n0\r\n\r\n", "not followed by CRLF"),  # inside gathered reads
    (b"5" * 5000, "longer than 4 KiB"),
])
def test_bytes_that_are_not_chunks_are_a_broken_stream(wire: bytes, problem: str) -> None:
    with pytest.raises(StreamError, match=problem):
        ChunkedBody().feed(wire)


def test_a_plain_body_ends_at_its_length_or_with_the_connection() -> None:
    sized = PlainBody(5)
    assert sized.feed(b"hel") == b"hel" and not sized.done
    assert sized.feed(b"lo, more") == b"lo" and sized.done and not sized.until_close
    endless = PlainBody(None)
    assert endless.feed(b"abc") == b"abc" and not endless.done and endless.until_close


def test_an_answers_head_is_read_as_http_says() -> None:
    head = parse_head(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\n"
                      b"Warning: 299 - \"a\"\r\nwarning: 299 - \"b\"\r\nTransfer-Encoding:  chunked ")
    assert (head.status, head.reason) == (403, "Forbidden")
    assert head.headers == {"content-type": "application/json", "warning": '299 - "a", 299 - "b"',
                            "transfer-encoding": "chunked"}
    with pytest.raises(StreamError, match=r"not an HTTP/1\.1 status line"):
        parse_head(b"SSH-2.0-OpenSSH_9.2")


@pytest.mark.parametrize("url, target", [
    ("https://10.0.0.1", ("10.0.0.1", 443, "10.0.0.1", "GET /api/v1/pods?watch=1&labelSelector=a+in+%28b%2Cc%29")),
    ("https://[::1]:6443/", ("::1", 6443, "[::1]:6443", "GET /api/v1/pods?watch=1&labelSelector=a+in+%28b%2Cc%29")),
    ("http://proxy:8001/k8s/clusters/c-1/",
     ("proxy", 8001, "proxy:8001", "GET /k8s/clusters/c-1/api/v1/pods?watch=1&labelSelector=a+in+%28b%2Cc%29")),
])
def test_a_watch_goes_where_the_server_url_says(url: str, target: tuple[str, int, str, str]) -> None:
    endpoint = Endpoint(url, False)
    request = endpoint.request(PODS.path(), {"watch": "1", "labelSelector": "a in (b,c)"}, {"Accept": "x"})
    line, host, *_ = request.decode().split("\r\n")
    assert (endpoint.host, endpoint.port, host.removeprefix("Host: "), line.removesuffix(" HTTP/1.1")) == target
    assert (endpoint.tls is None) == url.startswith("http:") and request.endswith(b"Accept: x\r\n\r\n")


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


def past_tag_and_size(field: bytes) -> bytes:
    """A length-delimited field's value: past its 1-byte tag and its varint size."""
    i = 1
    while field[i] & 0x80:
        i += 1
    return field[i + 1:]


def pod_message(name: str, ref: bytes, requirements: bytes, labels: dict[str, str]) -> bytes:
    c = protobuf.CLASSES
    entries = [past_tag_and_size(c["Labels"](labels={k: v}).SerializeToString()) for k, v in labels.items()]
    meta = c["PodMeta"](name=name, namespace="ns", uid=f"u-{name}", ownerReferences=[ref], labels=entries)
    spec = c["PodSpec"](nodeName="n", containers=[c["Container"](resources=requirements), c["Container"]()])
    return c["Pod"](metadata=meta, spec=spec).SerializeToString()


def test_pods_that_repeat_owner_references_requests_or_labels_share_one_projection_of_each() -> None:
    c = protobuf.CLASSES
    ref = c["OwnerReference"](apiVersion="apps/v1", kind="ReplicaSet", name="web-1", uid="u-rs", controller=True)
    requirements = c["ResourceRequirements"]()
    requirements.requests["cpu"].string = "500m"
    labels = {"app": "web", "example.com/" + "long" * 40: "v" * 63}  # an entry over 127 bytes: a 2-byte size
    codec = protobuf.CODECS[Pod]
    a, b = (codec.object(pod_message(name, ref.SerializeToString(), requirements.SerializeToString(), labels))
            for name in ("a", "b"))
    assert (a.metadata.name, b.metadata.name) == ("a", "b")
    assert a.metadata.labels == labels and a.metadata.labels is b.metadata.labels
    assert codec.object(pod_message("c", b"", b"", {})).metadata.labels == {}
    assert a.metadata.ownerReferences == [OwnerReference("apps/v1", "ReplicaSet", "web-1", "u-rs", True)]
    assert a.metadata.ownerReferences[0] is b.metadata.ownerReferences[0]
    assert a.spec.containers[0].resources == Resources({"cpu": "500m"})
    assert a.spec.containers[0].resources is b.spec.containers[0].resources
    assert a.spec.containers[1].resources == Resources() and a.spec.resources == Resources()  # none set


def test_a_memo_of_projections_holds_at_most_its_limit() -> None:
    decoded: list[bytes] = []

    def decode(raw: bytes) -> str:
        decoded.append(raw)
        return raw.decode()

    once = protobuf.Once(decode, limit=2)
    assert [once(raw) for raw in (b"a", b"b", b"a", b"c", b"a")] == ["a", "b", "a", "c", "a"]
    assert decoded == [b"a", b"b", b"c", b"a"]  # full at "c": it started over


def list_answer(items: list[bytes], version: str = "7", cont: str = "", meta_last: bool = False) -> bytes:
    """A PodList in the server's envelope, its Unknown with the fields around raw that the server
    writes (typeMeta before, contentEncoding and contentType after)."""
    c = protobuf.CLASSES
    meta = c["ListMeta"](resourceVersion=version, **{"continue": cont}).SerializeToString()
    listed = b"".join(b"\x12" + varint(len(i)) + i for i in items)
    metadata = b"\x0a" + varint(len(meta)) + meta
    raw = listed + metadata if meta_last else metadata + listed
    type_meta = b"\x0a\x0d" + b"\x0a\x02v1\x12\x07PodList"
    return protobuf.MAGIC + type_meta + b"\x12" + varint(len(raw)) + raw + b"\x1a\x00\x22\x00"


def varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


item_bytes = st.sampled_from([b"", b"\x0a\x00", b"x" * 127, b"y" * 128, b"z" * 20000]) | st.binary(max_size=300)


@given(st.lists(item_bytes, max_size=6), st.lists(st.integers(min_value=0), max_size=12), st.booleans())
def test_a_list_answer_comes_out_item_by_item_however_it_is_cut(items: list[bytes], cuts: list[int],
                                                                 meta_last: bool) -> None:
    cut = protobuf.ListItems()
    assert read(cut, list_answer(items, "42", "next", meta_last), cuts) == items
    assert protobuf.list_meta(cut.metadata) == ListMeta("42", "next")


def test_a_list_answer_hands_each_item_over_before_the_answer_ends() -> None:
    pods = [pod_message(name, b"", b"", {"app": "web"}) for name in ("a", "b", "c")]
    answer = list_answer(pods)
    cut = protobuf.ListItems()
    second_ends = answer.index(pods[1]) + len(pods[1])
    assert cut.feed(answer[:second_ends - 1]) == pods[:1]  # the second not whole yet
    assert cut.feed(answer[second_ends - 1:second_ends + 3]) == pods[1:2]
    assert len(cut._buf) <= 3 + 2  # only the item under way is held
    assert cut.feed(answer[second_ends + 3:]) == pods[2:] and cut.end() == []
    assert [protobuf.CODECS[Pod].object(p).metadata.name for p in pods] == ["a", "b", "c"]


@pytest.mark.parametrize("answer, problem", [
    (b'{"kind":"PodList"}', "no protobuf envelope"),
    (list_answer([b"abc"])[:-8], "ended inside a field"),  # cut inside the item
    (protobuf.MAGIC + b"\x0a\x00", "ended before its list"),  # an Unknown without raw
    (protobuf.MAGIC + b"\x12\x05\x12\x10abc", "runs past the list's end"),  # an item longer than its list
    (protobuf.MAGIC + b"\x12\x02\x0b\x00", "wire type 3"),  # a group: not in any Kubernetes message
    (protobuf.MAGIC + b"\x12\x0b" + b"\xff" * 11, "longer than 10 bytes"),
    (protobuf.MAGIC + b"\x12\x06\x12\xff\xff\xff\xff\x0f", "not a LIST answer"),  # a 4 GiB item
    (b"", "ended inside a field"),
])
def test_bytes_that_are_not_a_list_answer_are_a_protobuf_error(answer: bytes, problem: str) -> None:
    with pytest.raises(protobuf.ProtobufError, match=problem):
        read(protobuf.ListItems(), answer, [])
