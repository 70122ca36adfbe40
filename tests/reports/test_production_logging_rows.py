"""Production's logged distribution as the estimator's logging rows (``arrays.logging_rows``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from service.reports.ope.arrays import Reward, logging_rows, policy_rounds, production_columns
from service.storage.reads.ope import OpeLog
from tests.reports.synthetic import opelog, policy_log


def _log() -> OpeLog:
    return opelog(
        n_options=[2, 3, 1, 2, 2],
        production_option=[1, -1, 0, 0, 1],
        production_propensity=[0.5, 0.2, 1.0, 0.5, 0.5],
        slo_met=[1.0, 0.0, 1.0, 1.0, 0.0],
        policies={
            ("p", "1"): policy_log(
                [np.array([0.5, 0.5]), np.array([0.2, 0.3, 0.5]), np.array([1.0])]
                + [np.array([0.5, 0.5])] * 2,
                [0.0] * 5,
                ["ok"] * 5,
            )
        },
    )


def test_rows_land_in_option_columns_with_defer_last_and_bad_ones_are_unknown() -> None:
    log = replace(
        _log(),
        production_distribution=[
            np.array([0.5, 0.5, 0.0]),  # fine
            np.array([0.3, 0.3, 0.2, 0.2]),  # fine: DEFER (chosen) 0.2, last column
            None,  # not sent
            np.array([0.5, 0.5]),  # wrong length (no defer entry): unknown
            np.array([0.9, 0.1, 0.0]),  # disagrees with the logged propensity 0.5: unknown
        ],
    )
    action, pscore = production_columns(log)
    rows = logging_rows(log, action, pscore, 4)
    assert rows is not None
    np.testing.assert_array_equal(rows[0], [0.5, 0.5, 0.0, 0.0])
    np.testing.assert_array_equal(rows[1], [0.3, 0.3, 0.2, 0.2])
    assert np.isnan(rows[2:]).all()
    data = policy_rounds(log, Reward.SLO_MET, ("p", "1")).data
    assert data is not None and data.logging_known.tolist() == [True, True, False, False, False]


def test_a_log_without_any_distribution_gives_none() -> None:
    log = _log()
    action, pscore = production_columns(log)
    assert logging_rows(log, action, pscore, 4) is None
    data = policy_rounds(log, Reward.SLO_MET, ("p", "1")).data
    assert data is not None and data.logging_dist is None
