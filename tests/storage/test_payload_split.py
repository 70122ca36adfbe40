"""Cutting the cluster state out of a raw payload and putting it back, byte for byte."""

from __future__ import annotations

import pytest

from service.contract import MirrorRequest
from service.storage.log.payload import (
    compress,
    decompress,
    join_state,
    snapshot_hash,
    split_state,
)
from service.wire.convert import mirror_request_to_pb, state_to_pb
from service.wire.understudy.v1 import contract_pb2 as pb


def test_split_then_join_gives_back_the_exact_bytes(requests_sample: list[MirrorRequest]) -> None:
    for request in requests_sample[:5]:
        payload = mirror_request_to_pb(request).SerializeToString()
        split = split_state(payload)
        assert split.state == state_to_pb(request.state).SerializeToString()
        assert len(split.rest) < len(payload) - len(split.state)
        assert join_state(split.rest, split.state, split.offset) == payload
        # The rest alone is a valid MirrorRequest without a state.
        assert not pb.MirrorRequest.FromString(split.rest).HasField("state")


def test_state_in_an_unusual_position_is_still_exact(requests_sample: list[MirrorRequest]) -> None:
    msg = mirror_request_to_pb(requests_sample[0])
    state = msg.state.SerializeToString()
    msg.ClearField("state")
    rest = msg.SerializeToString()
    payload = rest + b"\x22" + bytes([0x80 | (len(state) & 0x7F)]) + _tail_varint(len(state))
    payload += state
    split = split_state(payload)
    assert split.state == state and split.offset == len(rest)
    assert join_state(split.rest, split.state, split.offset) == payload


def _tail_varint(n: int) -> bytes:
    n >>= 7
    out = bytearray()
    while True:
        if n >> 7:
            out.append(0x80 | (n & 0x7F))
            n >>= 7
        else:
            out.append(n)
            return bytes(out)


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"", "empty"),
        (b"\x12\x03abc", "no state field"),
        (b"\x22\x00\x22\x00", "two state fields (protobuf would merge them)"),
        (b"\x22\x80\x00", "non-minimal length prefix"),
        (b"\x22\x05ab", "truncated"),
        (b"\x23", "group wire type"),
        (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", "overlong varint"),
    ],
)
def test_unusual_payloads_are_kept_whole(payload: bytes, why: str) -> None:
    split = split_state(payload)
    assert (split.rest, split.state, split.offset) == (payload, None, None), why
    assert join_state(split.rest, split.state, split.offset) == payload


def test_compression_round_trips_and_hash_is_sha256() -> None:
    data = bytes(range(256)) * 40
    assert decompress(compress(data)) == data
    assert len(compress(data)) < len(data) // 10
    assert snapshot_hash(b"") == bytes.fromhex(
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
