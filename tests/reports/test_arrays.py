"""From logged rounds to estimator arrays: DEFER, no feasible option, what is left out."""

from __future__ import annotations

import numpy as np

from service.reports.ope.arrays import Reward, policy_rounds, production_columns
from service.storage.reads.ope import UNKNOWN_OPTION
from tests.reports.synthetic import opelog, policy_log


def test_defer_is_the_last_column_and_a_request_with_no_feasible_option_has_weight_one() -> None:
    log = opelog(
        n_options=[2, 3, 0],
        production_option=[1, -1, -1],
        production_propensity=[0.5, 0.2, 1.0],
        slo_met=[1.0, 0.0, 0.0],
        policies={
            ("p", "1"): policy_log(
                [np.array([0.25, 0.75]), np.array([0.0, 0.0, 0.6]), np.zeros(0)],
                [0.0, 0.4, 1.0],
                ["ok", "ok", "all_infeasible"],
            )
        },
    )
    action, pscore = production_columns(log)
    assert action.tolist() == [1, 3, 3] and pscore.tolist() == [0.5, 0.2, 1.0]
    rounds = policy_rounds(log, Reward.SLO_MET, ("p", "1"))
    assert rounds.data is not None and rounds.dropped.total == 0
    np.testing.assert_allclose(
        rounds.data.action_dist,
        [[0.25, 0.75, 0.0, 0.0], [0.0, 0.0, 0.6, 0.4], [0.0, 0.0, 0.0, 1.0]],
    )
    np.testing.assert_allclose(rounds.data.weight, [1.5, 2.0, 1.0])


def test_rounds_without_reward_propensity_or_distribution_are_left_out_and_counted() -> None:
    probs = [np.array([1.0, 0.0])] * 5
    log = opelog(
        n_options=[2] * 5,
        production_option=[0, 0, UNKNOWN_OPTION, 0, 0],
        production_propensity=[0.5, float("nan"), float("nan"), 0.5, 0.5],
        slo_met=[1.0, 1.0, 1.0, float("nan"), 0.0],
        policies={
            ("p", "1"): policy_log([*probs[:4], None], [0.0] * 5, ["ok", "ok", "ok", "ok", "error"])
        },
    )
    rounds = policy_rounds(log, Reward.SLO_MET, ("p", "1"))
    assert rounds.rows.tolist() == [0]
    assert (rounds.dropped.no_reward, rounds.dropped.no_production, rounds.dropped.no_target) == (
        1,
        2,
        1,
    )
    assert rounds.data is not None and rounds.data.unusable_pscore == 2


def test_a_row_that_does_not_sum_to_one_is_not_used() -> None:
    log = opelog(
        n_options=[2],
        production_option=[0],
        production_propensity=[0.5],
        slo_met=[1.0],
        policies={("p", "1"): policy_log([np.array([0.5, 0.2])], [0.0])},
    )
    rounds = policy_rounds(log, Reward.SLO_MET, ("p", "1"))
    assert rounds.data is None and rounds.dropped.no_target == 1


def test_completion_time_reward_is_negative_hours() -> None:
    log = opelog(
        n_options=[1],
        production_option=[0],
        production_propensity=[1.0],
        slo_met=[1.0],
        policies={("p", "1"): policy_log([np.array([1.0])], [0.0])},
    )
    rounds = policy_rounds(log, Reward.NEG_COMPLETION_HOURS, ("p", "1"))
    assert rounds.data is not None and rounds.data.reward.tolist() == [-1.0]
