"""The decision-status vocabulary is one list everywhere, and the log holds all of it.

`DecisionStatus` (policies/base.py) is the vocabulary; the log's CHECK
(tables.py, migration 0013), the reviewer API's filter and the usable-status
sets of OPE, export and the evaluator must say the same. Against a real
PostgreSQL: production-mirror's ``infeasible_choice`` (production chose an
option the mask refuses) is written, read back and summarised, and migration
0013's downgrade refuses while such rows exist.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
from sqlalchemy import text

from service.contract import MirrorRequest, ProductionDecision
from service.policies.base import DecisionStatus
from service.policies.baselines import ProductionMirror
from service.policies.batching import make_batch
from service.reports.ope import arrays
from service.server import evaluator_wiring
from service.server.decision_log import decision_row
from service.storage import (
    DecisionLogWriter,
    decisions_for,
    downgrade,
    make_engine,
    policy_summaries,
    upgrade,
)
from service.storage.export import dsjson
from service.storage.log import tables
from service.storage.reviewer.query import DECISION_STATUSES
from tests.storage.storage_helpers import request_batch, scalar, scored_of

VOCABULARY = {s.value for s in DecisionStatus}


def test_every_layer_speaks_the_one_vocabulary() -> None:
    assert "infeasible_choice" in VOCABULARY
    assert set(DECISION_STATUSES) == VOCABULARY
    for usable in (
        arrays.USABLE_STATUSES,
        dsjson.USABLE_STATUSES,
        evaluator_wiring.USABLE_STATUSES,
    ):
        assert usable == VOCABULARY - {"error"}  # every status but error carries a distribution
    (check,) = [
        c for c in tables.decisions.constraints if getattr(c, "name", "") == "decisions_status"
    ]
    allowed = str(check.sqltext)  # type: ignore[attr-defined]
    assert all(f"'{s}'" in allowed for s in VOCABULARY), allowed


def _masked_choices(requests: list[MirrorRequest]) -> list[MirrorRequest]:
    """Each request whose mask refuses some option, with production choosing the first such."""
    batch = make_batch(requests)
    out = []
    for r, request in enumerate(requests):
        mask = batch.mask[batch.offsets[r] : batch.offsets[r + 1]]
        if not mask.all():
            option = int(np.flatnonzero(~mask)[0])
            out.append(dataclasses.replace(request, production=ProductionDecision(option, 1.0)))
    assert out, "no sample request has a masked option"
    return out


def _status_of(constraint_sql: object) -> set[str]:
    return {s for s in VOCABULARY if f"'{s}'" in str(constraint_sql)}


def test_an_infeasible_production_choice_is_logged_as_such_and_blocks_the_downgrade(
    fresh_db: Callable[[bool], str], requests_sample: list[MirrorRequest]
) -> None:
    url = fresh_db(True)
    engine = make_engine(url)
    try:
        requests = _masked_choices(requests_sample[:12])
        batch = make_batch(requests)
        mirror = ProductionMirror()
        decisions = mirror.decide(batch, np.random.default_rng(0))
        assert set(decisions.status) == {DecisionStatus.INFEASIBLE_CHOICE}
        scored = scored_of(requests, decisions, mirror.name, mirror.version, 40.0)
        rows = [decision_row(d, 1_700_000_100.0) for d in scored]
        DecisionLogWriter(engine).write(
            dataclasses.replace(request_batch(requests), decisions=rows)
        )

        for request in requests:
            [logged] = decisions_for(engine, request.request_id)
            assert logged.status == "infeasible_choice"
            assert request.production is not None
            assert logged.chosen_option == request.production.option
            assert logged.chosen_probability == 1.0 and logged.defer_probability == 0.0
        [summary] = policy_summaries(engine)
        assert summary.infeasible_choices == len(requests) == summary.decisions
        assert summary.all_infeasible == 0

        definition = "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = :n"
        assert _status_of(scalar(engine, definition, n="decisions_status")) == VOCABULARY
        engine.dispose()
        with pytest.raises(Exception, match="infeasible_choice"):
            downgrade(url, "0012")
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM decisions WHERE status = 'infeasible_choice'"))
        engine.dispose()
        downgrade(url, "0012")
        narrowed = _status_of(scalar(engine, definition, n="decisions_status"))
        assert narrowed == VOCABULARY - {"infeasible_choice"}
        engine.dispose()
        upgrade(url)
        assert _status_of(scalar(engine, definition, n="decisions_status")) == VOCABULARY
    finally:
        engine.dispose()
