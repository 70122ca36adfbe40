"""The failure-mode section on an in-memory log whose failure modes are known by construction.

Options: 0 is a K80 (predicted 0.5/1/2 per s), 1 and 2 are V100s (predicted
1.5/2/2.5 per s). Every placed job runs at 1 per s, so V100 choices fall
short of their predicted median by half and K80 choices do not fall short.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from service.contract import MirrorRequest
from service.reports.ope import build_ope_package, run_ope
from service.reports.ope.decoded import DecodedLog, option_classes
from service.reports.ope.failure_section import build_failure_section
from service.storage.reads.ope import OpeLog
from tests.reports.package_check import check_package, check_sections
from tests.reports.synthetic import bandit_log

QUANTILES = np.array([[0.5, 1.0, 2.0], [1.5, 2.0, 2.5], [1.5, 2.0, 2.5]])


def _log_and_decoded(n: int, seed: int) -> tuple[OpeLog, DecodedLog]:
    log = bandit_log(n, seed=seed)
    placed = log.production_option >= 0
    log = dataclasses.replace(log, throughput=np.where(placed, 1.0, np.nan))
    decoded = DecodedLog(
        option_hardware=[("K80", "V100", "V100")] * n,
        chosen={
            ("best", "1"): np.full(n, 2, dtype=np.int64),
            ("mixed", "1"): np.where(np.arange(n) % 2 == 0, 1, -1).astype(np.int64),
        },
        quantiles=[QUANTILES] * n,
        predictor="test-predictor@1",
    )
    return log, decoded


def test_the_section_finds_the_failure_modes_built_into_the_log(tmp_path: Path) -> None:
    log, decoded = _log_and_decoded(1200, seed=11)
    report = run_ope(log)
    section = build_failure_section(log, report, decoded, k=5)
    results = section.results

    # disagreements: only against production's K80 choices is the predicted impact non-zero
    rows = results["disagreements"]
    best = [r for r in rows if r["policy"] == "best@1"]
    assert len(best) == 5
    assert all(r["production_hardware"] == "K80" for r in best)
    assert all(math.isclose(r["predicted_log_impact"], math.log(2.0)) for r in best)

    # uncertain failures: production's top cases are all V100 (2 of its 3 options)
    chooser = {u["chooser"]: u for u in results["uncertain_failures"]}
    production = chooser["production (observed)"]
    assert {t["hardware"] for t in production["top"]} == {"V100"}
    [rate] = [r for r in production["hardware_rates"] if r["hardware"] == "V100"]
    assert rate["top_share"] == 1.0 and 0.6 < rate["base_share"] < 0.73, rate
    # `best` is judged only where production also took option 2
    assert chooser["best@1"]["rounds_judged"] == int((log.production_option == 2).sum())

    # losing slices: `mixed` (truth 0.35) loses to production (0.475); `best` (0.9) never does
    losing = {s["slice"].split(" | ")[0] for s in results["losing_slices"] if s["loses"]}
    assert "mixed@1" in losing and "best@1" not in losing

    package = build_ope_package(report, source="in-memory log", sections=[section])
    package.write(tmp_path)
    checked = check_package(tmp_path, sections=["Failure modes"])
    check_sections(checked, ["failure_modes"])
    assert any(f.startswith("Failure modes: predicted impact") for f in checked["limitations"])


def test_without_a_predictor_the_section_says_so_and_keeps_what_needs_none(
    tmp_path: Path,
) -> None:
    log, decoded = _log_and_decoded(300, seed=12)
    decoded = dataclasses.replace(decoded, predictor=None, quantiles=[None] * log.n)
    report = run_ope(log)
    section = build_failure_section(log, report, decoded)
    assert "disagreements" not in section.results
    assert "losing_slices" in section.results
    assert any("no outcome predictor loaded" in x for x in section.limitations)
    assert "failure-uncertainty.png" not in section.figures


def test_decoded_rounds_map_options_to_hardware_and_quantiles(
    requests_sample: list[MirrorRequest],
) -> None:
    request = requests_sample[0]
    classes = option_classes(request)
    assert len(classes) == request.options.n_options
    for o, name in enumerate(classes):
        nodes = request.options.nodes_of(o)
        assert name == "+".join(sorted({request.state.hardware_of(int(n)).name for n in nodes}))
    decoded = DecodedLog(
        option_hardware=[classes] * 4,
        chosen={},
        quantiles=[QUANTILES[: len(classes)]] * 3 + [None],
        predictor="p@1",
    )
    option = np.array([0, -1, 99, 0], dtype=np.int64)
    assert decoded.hardware(option).tolist() == [classes[0], "DEFER", "unknown", classes[0]]
    q = decoded.quantiles_of(option)
    assert q[0].tolist() == QUANTILES[0].tolist()
    assert np.isnan(q[1:]).all()
