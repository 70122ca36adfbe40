"""Production's whole distribution through the real PostgreSQL log, the exports and OPE's read.

Requests are the sampled ones, each given production's distribution over its
feasible options (uniform, some mass on defer) built from the project's own
feasibility mask and validated as ingest validates it; a third of them carry
none (Runtime may send it for some requests only), one carries no propensity
(derived from the distribution). Asserted on the stored column, on
``read_ope_log``, on the Parquet slice and its DSJSON lines, and on the
diagnostics built from the read log.
"""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pyarrow.dataset as ds
import pytest
from sqlalchemy import Engine, text

from service.contract import DEFER, MirrorRequest, ProductionDecision
from service.contract.feasibility import check_feasibility
from service.contract.validation import validate_request
from service.ope import diagnostics
from service.reports.ope.arrays import Reward, policy_rounds
from service.storage import DecisionLogWriter, LogBatch, conflicts, outcome_row
from service.storage.export.dsjson import write_dsjson
from service.storage.export.parquet import export_parquet, iter_slice
from service.storage.log.convert import unpack_probabilities
from service.storage.reads.ope import OpeFilter, read_ope_log
from tests.storage.storage_helpers import decisions_of, outcome_for, request_batch, scalar

DEFER_MASS = 0.1


def _with_distribution(request: MirrorRequest, propensity: bool = True) -> MirrorRequest:
    mask = check_feasibility(
        request.state, request.workload, request.options, request.quota_remaining
    ).mask
    if not mask.any():
        probs = tuple(0.0 for _ in mask)
        return replace(request, production=ProductionDecision(DEFER, 1.0, probs, 1.0))
    p = np.where(mask, (1.0 - DEFER_MASS) / mask.sum(), 0.0)
    chosen = int(np.flatnonzero(mask)[-1])
    production = ProductionDecision(
        chosen, float(p[chosen]) if propensity else None, tuple(map(float, p)), DEFER_MASS
    )
    return replace(request, production=production)


@pytest.fixture()
def logged(engine: Engine, requests_sample: list[MirrorRequest]) -> list[MirrorRequest]:
    """Twelve requests logged with decisions and outcomes; every third without a distribution."""
    requests = []
    for i, r in enumerate(requests_sample[:12]):
        if i % 3 == 2:
            requests.append(r)
        else:
            requests.append(_with_distribution(r, propensity=i != 1))
    for r in requests:
        validate_request(r)
    batch = request_batch(requests)
    outcomes = [outcome_row(outcome_for(r.request_id), r.request_time + 60.0) for r in requests]
    writer = DecisionLogWriter(engine)
    writer.write(replace(batch, decisions=decisions_of(requests, "p1")))
    writer.write(LogBatch(outcomes=outcomes))
    return requests


def _expected(request: MirrorRequest) -> list[float] | None:
    p = request.production
    if p is None or p.probabilities is None:
        return None
    return [*p.probabilities, p.defer_probability or 0.0]


def test_the_log_keeps_the_distribution_and_derives_a_missing_propensity(
    engine: Engine, logged: list[MirrorRequest]
) -> None:
    with engine.connect() as conn:
        query = text(
            "SELECT request_id, production_probabilities_f64, production_propensity FROM requests"
        )
        rows = {rid: (blob, p) for rid, blob, p in conn.execute(query).all()}
    for r in logged:
        blob, propensity = rows[r.request_id][0], rows[r.request_id][1]
        assert r.production is not None
        expected = _expected(r)
        if expected is None:
            assert blob is None
        else:
            assert unpack_probabilities(bytes(blob)).tolist() == expected
            k = r.production.option
            assert propensity == (expected[-1] if k == DEFER else expected[k])
    derived = logged[1]
    assert derived.production is not None and derived.production.propensity is None
    assert rows[derived.request_id][1] is not None


def test_ope_read_parquet_and_dsjson_carry_it(
    engine: Engine, logged: list[MirrorRequest], tmp_path: Path
) -> None:
    log = read_ope_log(engine, OpeFilter())
    by_id = {r.request_id: r for r in logged}
    assert log.n == len(logged)
    for i, rid in enumerate(log.request_id):
        got = log.production_distribution[i]
        expected = _expected(by_id[str(rid)])
        assert (got is None) if expected is None else got.tolist() == expected

    export_parquet(engine, OpeFilter(), tmp_path / "slice")
    table = ds.dataset(tmp_path / "slice", format="parquet", partitioning="hive").to_table()
    column = dict(
        zip(
            table.column("request_id").to_pylist(),
            table.column("production_probabilities").to_pylist(),
            strict=True,
        )
    )
    assert column == {r.request_id: _expected(r) for r in logged}

    out = io.BytesIO()
    summary = write_dsjson(iter_slice(engine, OpeFilter()), out, lambda row: 1.0)
    assert summary.lines == len(logged)
    for line in out.getvalue().splitlines():
        event = orjson.loads(line)
        r = by_id[event["EventId"]]
        expected = _expected(r)
        if expected is None:
            assert event["p"] == [event["_label_probability"]]
        else:
            # DSJSON p: probabilities of the actions of `a` (1-based, DEFER last), in a's order
            assert event["p"] == [expected[a - 1] for a in event["a"]]
            assert event["p"][0] == event["_label_probability"]
            assert len(event["p"]) == len(event["a"])


def test_the_diagnostics_on_the_read_log_check_support_where_it_is_known(
    engine: Engine, logged: list[MirrorRequest]
) -> None:
    log = read_ope_log(engine, OpeFilter())
    rounds = policy_rounds(log, Reward.NEG_QUEUE_HOURS, ("p1", "1"))
    assert rounds.data is not None
    known = np.array([log.production_distribution[i] is not None for i in rounds.rows])
    assert known.any() and not known.all()
    assert (rounds.data.logging_known == known).all()
    d = diagnostics(rounds.data)
    assert d.support_rounds == int(known.sum()) and not d.support_known
    # exact where known: the policy's mass on options production never takes
    mu = rounds.data.logging_dist
    assert mu is not None
    pi = rounds.data.action_dist
    exact = (pi[known] * (mu[known] <= 0)).sum(axis=1)
    assert d.expected_mean_weight == pytest.approx(1.0 - exact.mean(), abs=1e-12)


def test_an_outcome_carried_distribution_fills_the_propensity_or_conflicts(
    engine: Engine, requests_sample: list[MirrorRequest]
) -> None:
    before = replace(requests_sample[0], production=None)  # mirrored before deciding
    mirrored = _with_distribution(requests_sample[1])
    writer = DecisionLogWriter(engine)
    writer.write(request_batch([before, mirrored]))
    assert mirrored.production is not None and mirrored.production.probabilities is not None
    probs = (0.25, 0.75) + (0.0,) * (before.options.n_options - 2)
    carried = ProductionDecision(1, None, probs, None)
    other = replace(
        mirrored.production, propensity=None, probabilities=None, defer_probability=None
    )
    wrong = ProductionDecision(
        other.option,
        None,
        tuple(0.0 if i != other.option else 1.0 for i in range(mirrored.options.n_options)),
        None,
    )
    result = writer.write(
        LogBatch(
            outcomes=[
                outcome_row(outcome_for(before.request_id, production=carried), 1.0),
                outcome_row(outcome_for(mirrored.request_id, production=wrong), 1.0),
            ]
        )
    )
    assert result.outcomes.production_filled == 1
    assert result.outcomes.production_conflicts == 1
    assert (
        scalar(
            engine,
            "SELECT production_propensity FROM requests WHERE request_id = :r",
            r=before.request_id,
        )
        == 0.75
    )
    recorded = conflicts(engine, request_id=mirrored.request_id)
    assert [c.kind for c in recorded] == ["production_decision"]
    assert recorded[0].incoming["propensity"] == 1.0
