"""The writer: one transaction per batch, idempotent, snapshots once per content."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sqlalchemy import Engine

from service.contract import DEFER, Conflict, MirrorRequest, NotFound
from service.storage import (
    Counts,
    DecisionLogWriter,
    LogBatch,
    PolicyRow,
    count_decisions,
    count_requests,
    decisions_for,
    load_raw_request,
    logged_request,
)
from service.storage.log.payload import decompress
from service.wire.convert import state_to_pb
from tests.storage.storage_helpers import (
    decisions_of,
    fake_decisions,
    payload_of,
    request_batch,
    scalar,
)


def _policy(name: str, sha: str = "a" * 64) -> PolicyRow:
    return PolicyRow(name, "1", "policy", sha, "features-v1", "f" * 64, 1_700_000_000.0)


def _full_batch(requests: list[MirrorRequest]) -> LogBatch:
    base = request_batch(requests)
    return dataclasses.replace(
        base,
        decisions=decisions_of(requests, "p1") + decisions_of(requests, "p2", seed=1),
        policies=[_policy("p1"), _policy("p2")],
    )


def test_a_batch_lands_once_and_a_replay_changes_nothing(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    requests = requests_sample[:10]
    batch = _full_batch(requests)
    writer = DecisionLogWriter(engine)

    first = writer.write(batch)
    assert first.requests == Counts(inserted=10, duplicates=0)
    assert first.decisions == Counts(inserted=20, duplicates=0)
    assert first.policies == Counts(inserted=2, duplicates=0)
    assert first.snapshots.inserted == len({s.snapshot_hash for s in batch.snapshots})

    again = writer.write(batch)
    assert again.requests == Counts(inserted=0, duplicates=10)
    assert again.decisions == Counts(inserted=0, duplicates=20)
    assert again.policies == Counts(inserted=0, duplicates=2)
    assert again.snapshots == Counts(inserted=0, duplicates=len(batch.snapshots))

    # Overlapping replay: half old, half new.
    more = _full_batch(requests_sample[5:15])
    third = writer.write(more)
    assert third.requests == Counts(inserted=5, duplicates=5)
    assert third.decisions == Counts(inserted=10, duplicates=10)

    assert count_requests(engine) == 15
    assert count_decisions(engine) == 30
    assert count_decisions(engine, "p1") == 15
    assert count_decisions(engine, "p2", status="ok") == 15
    assert scalar(engine, "SELECT count(*) FROM policies") == 2


def test_snapshots_are_stored_once_per_content(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    a, b = requests_sample[0], requests_sample[1]
    same_state = [dataclasses.replace(a, request_id=f"same-{i}") for i in range(4)]
    batch = request_batch([*same_state, b])
    result = DecisionLogWriter(engine).write(batch)
    assert result.snapshots == Counts(inserted=2, duplicates=3)
    assert scalar(engine, "SELECT count(*) FROM cluster_snapshots") == 2
    assert scalar(engine, "SELECT count(DISTINCT snapshot_hash) FROM requests") == 2
    stored = scalar(
        engine,
        "SELECT s.state_zstd FROM cluster_snapshots s JOIN requests r USING (snapshot_hash) "
        "WHERE r.request_id = 'same-2'",
    )
    assert isinstance(stored, bytes)
    assert decompress(stored) == state_to_pb(a.state).SerializeToString()
    # Stored compressed: the request row holds less than the raw payload.
    raw = len(payload_of(a))
    kept = scalar(engine, "SELECT octet_length(payload_zstd) FROM requests LIMIT 1")
    assert isinstance(kept, int) and kept < raw // 4


def test_the_raw_request_comes_back_byte_for_byte(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    requests = requests_sample[:3]
    DecisionLogWriter(engine).write(request_batch(requests))
    for i, request in enumerate(requests):
        assert load_raw_request(engine, request.request_id) == payload_of(request)
        logged = logged_request(engine, request.request_id)
        assert (logged.journal_seq, logged.feature_version) == (i + 1, "features-v1")
        assert logged.request_time == pytest.approx(request.request_time, abs=1e-6)
        assert request.production is not None
        assert (logged.production_option, logged.production_source) == (
            request.production.option,
            "mirror",
        )
    with pytest.raises(NotFound, match="`request_id` 'nope'"):
        load_raw_request(engine, "nope")
    with pytest.raises(NotFound):
        logged_request(engine, "nope")


def test_decisions_read_back_as_written(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    requests = requests_sample[:6]
    policy = fake_decisions(requests, seed=0)
    DecisionLogWriter(engine).write(
        dataclasses.replace(request_batch(requests), decisions=decisions_of(requests, "p1"))
    )
    start = 0
    for i, request in enumerate(requests):
        n = request.options.n_options
        [logged] = decisions_for(engine, request.request_id)
        assert (logged.policy_name, logged.policy_version, logged.status) == ("p1", "1", "ok")
        assert logged.request_time == pytest.approx(request.request_time, abs=1e-6)
        np.testing.assert_array_equal(logged.scores, policy.scores[start : start + n])
        np.testing.assert_array_equal(logged.probabilities, policy.probabilities[start : start + n])
        chosen = int(policy.chosen[i])
        assert logged.chosen_option == chosen
        production = request.production
        assert production is not None
        if chosen == DEFER:
            assert logged.chosen_probability == pytest.approx(0.1)
            assert logged.predicted is None
        else:
            assert logged.chosen_probability == policy.probabilities[start + chosen]
            assert logged.predicted == {
                "throughput_q50": float(policy.predictions["throughput_q50"][start + chosen])  # type: ignore[index]
            }
        assert logged.agrees_with_production == (chosen == production.option)
        expected = (
            0.1 if production.option == DEFER else policy.probabilities[start + production.option]
        )
        assert logged.production_probability == pytest.approx(expected)
        assert logged.raw_favourite_infeasible == (i % 3 == 0)
        assert logged.latency_us == 250
        start += n
    disagreements = scalar(
        engine, "SELECT count(*) FROM decisions WHERE agrees_with_production = false"
    )
    assert disagreements == sum(
        int(policy.chosen[i]) != requests[i].production.option  # type: ignore[union-attr]
        for i in range(len(requests))
    )


def test_a_changed_policy_artifact_under_the_same_version_is_refused(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    writer = DecisionLogWriter(engine)
    assert writer.register_policies([_policy("p1")]) == Counts(1, 0)
    assert writer.register_policies([_policy("p1")]) == Counts(0, 1)
    batch = dataclasses.replace(
        request_batch(requests_sample[:2]), policies=[_policy("p1", sha="b" * 64)]
    )
    with pytest.raises(Conflict, match="policy `p1` version `1`"):
        writer.write(batch)
    assert count_requests(engine) == 0  # the whole batch was rolled back
    assert writer.write(request_batch(requests_sample[:2])).requests == Counts(2, 0)


def test_an_empty_batch_is_a_no_op(engine: Engine) -> None:
    assert DecisionLogWriter(engine).write(LogBatch()).requests == Counts()
