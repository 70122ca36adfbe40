"""Parameter checks and the cursor codec, without a database."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.contract.errors import InvalidInput
from service.storage.reviewer.query import (
    DecisionFilter,
    DecisionKey,
    decode_cursor,
    encode_cursor,
    microseconds,
    parse_decision_query,
    parse_time,
)

ids = st.text(min_size=1, max_size=80).filter(
    lambda s: "\x00" not in s and not any(0xD800 <= ord(c) <= 0xDFFF for c in s)
)


@given(
    us=st.integers(min_value=0, max_value=253_402_300_799_000_000),
    request_id=ids,
    policy=ids,
    version=ids,
    order=st.sampled_from(["asc", "desc"]),
)
def test_a_cursor_decodes_to_the_key_it_encodes(
    us: int, request_id: str, policy: str, version: str, order: str
) -> None:
    key = DecisionKey(us, request_id, policy, version)
    digest = DecisionFilter(policy=policy).digest(order)
    assert decode_cursor(encode_cursor(key, order, digest), order, digest) == key
    assert microseconds(key.request_time) == us


def _forged(body: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(body).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "",
        "!!!",
        "a" * 3000,
        _forged([1, 2]),
        _forged({"v": 2}),
        _forged({"v": 1, "o": "asc", "f": "x", "k": [1.5, "r", "p", "v"]}),
        _forged({"v": 1, "o": "asc", "f": "x", "k": [1, "r", "p"]}),
        _forged({"v": 1, "o": "asc", "f": "x", "k": [1, "r\u0000", "p", "v"]}),
        _forged({"v": 1, "o": "asc", "f": "x", "k": [True, "r", "p", "v"]}),
        _forged({"v": 1, "o": "asc", "f": "x", "k": [1, "", "p", "v"]}),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)
def test_a_cursor_we_did_not_issue_is_refused_naming_cursor(cursor: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        decode_cursor(cursor, "asc", "x")
    assert caught.value.field == "cursor"


def test_a_cursor_for_other_filters_is_refused() -> None:
    key = DecisionKey(1, "r", "p", "v")
    mine = DecisionFilter(policy="a").digest("asc")
    theirs = DecisionFilter(policy="b").digest("asc")
    with pytest.raises(InvalidInput, match="other filters"):
        decode_cursor(encode_cursor(key, "asc", mine), "asc", theirs)
    with pytest.raises(InvalidInput, match="other filters"):
        decode_cursor(encode_cursor(key, "asc", mine), "desc", mine)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1700000000", datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
        ("1700000000.25", datetime(2023, 11, 14, 22, 13, 20, 250000, tzinfo=UTC)),
        ("2023-11-14T22:13:20Z", datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
        ("2023-11-15T00:13:20+02:00", datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
    ],
)
def test_times_are_unix_seconds_or_iso_with_an_offset(value: str, expected: datetime) -> None:
    assert parse_time("since", value) == expected


def test_every_parameter_is_typed_and_defaults_hold() -> None:
    query = parse_decision_query(
        {
            "policy": "gavel-scorer",
            "experiment": "x",
            "experiment_version": "2",
            "workload_kind": "infer",
            "disagreement": "yes",
            "status": "timeout",
            "order": "desc",
            "limit": "1000",
        }
    )
    assert query.filter == DecisionFilter(
        policy="gavel-scorer",
        experiment="x",
        experiment_version=2,
        workload_kind="infer",
        disagreement=True,
        status="timeout",
    )
    assert (query.order, query.limit, query.after) == ("desc", 1000, None)
    assert parse_decision_query({}).limit == 100
    with pytest.raises(InvalidInput) as caught:
        parse_decision_query({"experiment_version": "1"})
    assert caught.value.field == "experiment_version"
