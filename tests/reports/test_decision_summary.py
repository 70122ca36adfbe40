"""The evidence page opens with what a reviewer decides on (issue 19, issue 27 item 3).

The first section is the decision summary, one row per policy; the header
shows the data's real time range; an estimate outside the reward's range is
marked where it is shown (greyed, in parentheses, with its reason), on a log
built so that DR must leave [0, 1].
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from service.ope import Estimate, Estimator, Interval, IntervalMethod
from service.reports.ope import build_ope_package, run_ope
from service.reports.ope.decision import split_verdict, time_range
from service.reports.ope.limitations import limitations
from service.reports.ope.marks import MarkKind, range_of
from service.reports.ope.summary import difference_mark
from service.storage.reads.ope import OpeLog
from tests.reports.package_check import check_decision_summary, check_package, parse_page
from tests.reports.synthetic import bandit_log, opelog, policy_log


def _overshooting_log() -> OpeLog:
    """8 rounds, 3 options; production uniform over the 4 columns. `best@1` always takes
    option 2, which production took (and met the SLO) on rounds 0-3: weight 4 there, 0
    elsewhere. The constant DR model is 0.5 on both folds, so DR is
    ``(4 * (0.5 + 4 * 0.5) + 4 * 0.5) / 8 = 1.5`` for a reward in [0, 1], at ESS 4."""
    n = 8
    return opelog(
        n_options=[3] * n,
        production_option=[2, 2, 2, 2, 0, 0, 0, 0],
        production_propensity=[0.25] * n,
        slo_met=[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0],
        policies={("best", "1"): policy_log([np.array([0.0, 0.0, 1.0])] * n, [0.0] * n)},
    )


def test_the_page_opens_with_one_row_per_policy_and_the_datas_time_range(
    tmp_path: Path,
) -> None:
    log = bandit_log(300, seed=11)
    rng = np.random.default_rng(12)
    received = 1_764_000_000.0 + rng.permutation(np.linspace(0.0, 7_380.0, log.n))
    log = replace(log, received_at=received)
    report = run_ope(log)
    package = build_ope_package(
        report, source="in-memory log", created_at=0.0, span=time_range(log.received_at)
    )
    package.write(tmp_path)
    results = check_package(tmp_path)
    table = check_decision_summary(tmp_path, results)
    assert [row[0][0] for row in table.rows] == ["best@1", "mixed@1"]
    said, basis = table.head.index("verdict"), table.head.index("verdict rests on")
    verdicts = {
        row[0][0]: f"{row[said][0]} ({row[basis][0]})" if row[basis][0] else row[said][0]
        for row in table.rows
    }
    assert verdicts == {p.label: p.verdict for p in report.policies}
    page = parse_page(tmp_path / "index.html")
    data = next(item for item in page.items[""] if item.startswith("data:"))
    first = datetime.fromtimestamp(float(received.min()), UTC).strftime("%Y-%m-%d %H:%M:%S")
    last = datetime.fromtimestamp(float(received.max()), UTC).strftime("%Y-%m-%d %H:%M:%S")
    assert data == f"data: requests received {first} UTC to {last} UTC (2 h 3 min)"
    assert results["time_range"] == {"first": received.min(), "last": received.max()}


def test_an_estimate_outside_the_rewards_range_is_marked_where_it_is_shown(
    tmp_path: Path,
) -> None:
    report = run_ope(_overshooting_log())
    dr = report.policies[0].results[Estimator.DR]
    assert isinstance(dr, Estimate) and dr.value > 1.0  # the setup, not the claim
    package = build_ope_package(report, source="in-memory log", created_at=0.0)
    package.write(tmp_path)
    results = check_package(tmp_path)
    table = check_decision_summary(tmp_path, results)
    row, head = table.rows[0], table.head
    value, value_class = row[head.index("dr value")]
    interval, interval_class = row[head.index("dr interval")]
    marks = row[head.index("marks")][0]
    assert value == f"({dr.value:.4g})" and "marked" in value_class.split()
    assert "marked" in interval_class.split() and interval.endswith(", 1]")
    assert "outside reward range [0, 1]" in marks and "too thin: ESS 4 < 30" in marks
    assert "bound clipped: upper" in marks
    full = [t for t in parse_page(tmp_path / "index.html").tables if t.section == "Full tables"]
    dr_row = next(r for r in full[0].rows if r[0][0] == "best@1" and r[1][0] == "dr")
    assert dr_row[full[0].head.index("value")] == (f"({dr.value:.4g})", "marked")
    estimate = json.loads((tmp_path / "results.json").read_text())["policies"][0]
    kinds = {m["kind"] for m in estimate["estimates"]["dr"]["marks"]}
    assert kinds == {"outside reward range", "bound clipped", "too thin"}
    assert estimate["estimates"]["dr"]["shown_interval"]["upper"] == 1.0
    assert f"({dr.value:.4g})" in (tmp_path / "report.md").read_text()
    items = parse_page(tmp_path / "index.html").items["Decision summary"]
    assert any(i.startswith("its dr estimate is marked: ") and "outside" in i for i in items)
    own = [f.removeprefix("`best@1`: ") for f in limitations(report) if f.startswith("`best@1`")]
    assert own and set(own) <= set(items)  # every finding about the policy binds its verdict


@pytest.mark.parametrize(
    ("verdict", "split"),
    [
        (
            "worse than production (dr, 95% normal interval)",
            ("worse than production", "dr, 95% normal interval"),
        ),
        (
            "no detectable difference from production (ips, 95% off-policy betting interval "
            "(weight tail: Pareto k-hat 2.94))",
            (
                "no detectable difference from production",
                "ips, 95% off-policy betting interval (weight tail: Pareto k-hat 2.94)",
            ),
        ),
        ("not identifiable: no overlap (production deterministic)", None),
        ("no usable rounds", None),
    ],
)
def test_a_verdict_splits_into_the_decision_and_what_it_rests_on(
    verdict: str, split: tuple[str, str] | None
) -> None:
    assert split_verdict(verdict) == (split or (verdict, ""))


@pytest.mark.parametrize(
    ("method", "kinds"),
    [
        (IntervalMethod.NORMAL, {MarkKind.TOO_THIN, MarkKind.BOUND_CLIPPED}),
        (IntervalMethod.OFF_POLICY_BETTING_CS, {MarkKind.BOUND_CLIPPED}),
    ],
)
def test_the_verdicts_interval_is_thin_only_when_it_is_a_normal_one(
    method: IntervalMethod, kinds: set[MarkKind]
) -> None:
    """At ESS 4 a normal interval is too thin; a betting interval's coverage does not rest
    on the ESS. Either is clipped to the difference's range [-1, 1]."""
    report = run_ope(_overshooting_log())
    policy = replace(report.policies[0], vs_production=Interval(-0.2, 1.4, 0.95, method, 8))
    got = difference_mark(policy, range_of(report.reward))
    assert got is not None and got.kinds == kinds, got
    assert (got.lower, got.upper) == (-0.2, 1.0)
