"""`understudy replay` prints each option's mask and checks the logged bits against a recomputation.

Requests are logged by the scorer's own write path (`score_requests`, the
per-request bits of its one feasibility pass, `DecisionLogSink`) into a real
migrated PostgreSQL database; the command runs in-process as a user runs it.
A bit flipped in the log makes it fail; a row without bits (logged before
migration 0010) says "not logged" and still shows the recomputed mask.
"""

from __future__ import annotations

import dataclasses

from sqlalchemy import text
from typer.testing import CliRunner

from service.cli.main import app
from service.contract import DEFAULT_FEATURES, MirrorRequest, check_feasibility
from service.pipeline.feasibility_log import logged_feasibility
from service.pipeline.scorer_types import LoggedRequest, ScoredBatch
from service.pipeline.scoring import score_requests
from service.policies.baselines import FirstFit
from service.server.decision_log import DecisionLogSink
from service.storage import DecisionLogWriter, ensure_partitions, make_engine
from service.storage.log.partitions import day_of
from tests.storage.storage_helpers import payload_of


def _log(db_url: str, requests: list[MirrorRequest], *, with_bits: bool = True) -> None:
    engine = make_engine(db_url)
    try:
        for r in requests:
            ensure_partitions(engine, day_of(r.request_time), day_of(r.request_time))
        policies = [FirstFit()]
        scored, decisions, _ = score_requests(requests, policies, DEFAULT_FEATURES)
        logged = [
            LoggedRequest(i + 1, r, payload_of(r), r.request_time) for i, r in enumerate(requests)
        ]
        feasibility = logged_feasibility([x.seq for x in logged], requests, scored)
        batch = ScoredBatch(
            requests=logged,
            outcomes=[],
            decisions=decisions,
            policies=policies,  # type: ignore[arg-type]
            feature_version=DEFAULT_FEATURES.version,
            feature_hash=DEFAULT_FEATURES.definition_hash,
            last_seq=len(logged),
            feasibility=feasibility if with_bits else None,
        )
        DecisionLogSink(DecisionLogWriter(engine)).write(batch)
    finally:
        engine.dispose()


def _replay(db_url: str, request_id: str) -> tuple[int, str]:
    env = {"UNDERSTUDY_DATABASE_URL": db_url, "COLUMNS": "80"}
    result = CliRunner().invoke(
        app, ["replay", "--request-id", request_id, "--policy", "first-fit"], env=env
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _masked(r: MirrorRequest) -> list[tuple[int, tuple[str, ...]]]:
    f = check_feasibility(r.state, r.workload, r.options, r.quota_remaining)
    return [(i, tuple(s.value for s in f.failed(i))) for i in range(r.options.n_options)]


def test_replay_prints_each_options_mask_and_verifies_it(
    db_url: str, requests_sample: list[MirrorRequest]
) -> None:
    request = requests_sample[0]
    _log(db_url, [request])

    code, out = _replay(db_url, request.request_id)

    assert code == 0, out
    assert "logged mask equals the recomputation" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    flat = " ".join(out.split())
    masked = [(i, s) for i, s in _masked(request) if s]
    assert masked
    for _, signals in masked:
        assert signals[0] in flat  # each signal named (cells may wrap)
    assert flat.count("feasible") >= sum(1 for _, s in _masked(request) if not s)


def test_a_flipped_bit_in_the_log_fails_the_replay(
    db_url: str, requests_sample: list[MirrorRequest]
) -> None:
    request = requests_sample[1]
    _log(db_url, [request])
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:  # option 0's bit 6 toggled
            conn.execute(
                text(
                    "UPDATE requests SET feasibility_bits = set_byte(feasibility_bits, 0, "
                    "get_byte(feasibility_bits, 0) # 64) WHERE request_id = :r"
                ),
                {"r": request.request_id},
            )
    finally:
        engine.dispose()

    code, out = _replay(db_url, request.request_id)

    assert code == 1, out
    assert "logged mask DIFFERS from the recomputation" in out


def test_a_request_logged_before_0010_says_not_logged_and_still_recomputes(
    db_url: str, requests_sample: list[MirrorRequest]
) -> None:
    request = dataclasses.replace(requests_sample[2], request_id="old-row")
    _log(db_url, [request], with_bits=False)

    code, out = _replay(db_url, request.request_id)

    assert code == 0, out
    assert "mask not logged (before migration 0010)" in out
    flat = " ".join(out.split())
    assert "not logged" in flat
    assert any(s and s[0] in flat for _, s in _masked(request))
