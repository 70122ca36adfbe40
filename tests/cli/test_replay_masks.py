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
from service.contract import MirrorRequest, check_feasibility
from service.storage import make_engine
from tests.storage.scored_log import log_scored


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
    log_scored(db_url, [request])

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
    log_scored(db_url, [request])
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
    log_scored(db_url, [request], with_bits=False)

    code, out = _replay(db_url, request.request_id)

    assert code == 0, out
    assert "mask not logged (before migration 0010)" in out
    flat = " ".join(out.split())
    assert "not logged" in flat
    assert any(s and s[0] in flat for _, s in _masked(request))
