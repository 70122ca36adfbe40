"""Online-bounded numbers: read from the evaluator's stored evaluations on real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from service.protocols import ActorRole, Identity, PolicyRef, ProtocolDesk
from service.protocols.criteria import Evaluation, Role, Status
from service.reports.ope import build_ope_package, run_ope
from service.reports.ope.online_section import build_online_section, read_online_bounds
from service.storage import ProtocolStore, make_engine
from service.storage.stores.evaluation import EvaluationStore, FencedProtocolRecords
from tests.evaluator.conftest import protocol_doc
from tests.reports.package_check import check_package, check_sections
from tests.reports.synthetic import bandit_log

ADMIN = Identity("alice", ActorRole.ADMIN)
SAFETY = Identity("dave", ActorRole.SAFETY)


@pytest.fixture()
def engine(db_url: str) -> Iterator[Engine]:
    e = make_engine(db_url)
    yield e
    e.dispose()


def _evaluation(name: str, value: float) -> Evaluation:
    return Evaluation(name, Role.PRIMARY, "reward", Status.PENDING, value, value - 0.1, 0.0,
                      value - 0.2, value + 0.2, 400, 0.05, "asymptotic-cs")  # fmt: skip


def _online_and_shadow(engine: Engine) -> None:
    desk = ProtocolDesk(
        FencedProtocolRecords(ProtocolStore(engine)),
        policies=lambda: {
            "candidate": PolicyRef("candidate", "1"),
            "online-candidate": PolicyRef("online-candidate", "1", "a" * 64),
        },
        logging=lambda: None,
    )
    desk.start("shadow", 1, ADMIN, "go", document=protocol_doc(id="shadow"))
    doc = protocol_doc(
        id="online",
        mode="online-bounded",
        candidate={"policy": "online-candidate", "version": "1", "sha256": "a" * 64},
        rollback=[{"name": "rollback-harm", "metric": "reward", "worse_than_baseline_by": 0.1}],
        authority={
            "traffic_fraction": 0.1,
            "pools": ["V100"],
            "workload_kinds": ["train"],
            "max_concurrent_placements": 2,
            "max_duration": "1d",
        },
    )
    record = desk.submit(doc, ADMIN, "review please")
    desk.approve("online", 1, record.content_sha256, SAFETY, "bounds are fine")
    desk.start("online", 1, ADMIN, "approved, go")
    store = EvaluationStore(engine)
    grant = store.acquire("evaluator", "a", 5.0)
    assert grant is not None
    store.record_evaluations("shadow", 1, [_evaluation("s", 0.1)], "a", grant.generation)
    store.record_evaluations("online", 1, [_evaluation("reward-now", 0.2)], "a", grant.generation)
    store.record_evaluations("online", 1, [_evaluation("reward-now", 0.4)], "a", grant.generation)


def test_only_online_protocols_are_read_newest_first_and_tagged(
    engine: Engine, tmp_path: Path
) -> None:
    assert build_online_section(read_online_bounds(engine)) is None
    _online_and_shadow(engine)
    bounds = read_online_bounds(engine)
    assert [(b.protocol_id, b.evaluation.value) for b in bounds] == [("online", 0.4)]
    assert bounds[0].candidate == "online-candidate@1"
    section = build_online_section(bounds)
    assert section is not None
    report = run_ope(bandit_log(300, seed=6))
    build_ope_package(report, source="x", sections=[section]).write(tmp_path)
    results = check_package(tmp_path, sections=["Online-bounded evidence"])
    check_sections(results, ["online_bounded"])
    [bound] = results["sections"]["online_bounded"]["bounds"]
    assert (bound["value"], bound["lower"], bound["provenance"]) == (0.4, 0.2, "online-bounded")
    assert not any("no online-bounded evidence" in f for f in results["limitations"])
    assert "online-bounded" in (tmp_path / "index.html").read_text()
