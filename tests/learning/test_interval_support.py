"""Intervals outside training support: never zero width, always flagged (issue 23 item 4).

The shipped ``learned-outcome`` answered ``[7.6179, 7.6179, 7.6179]`` for a
4-GPU Recommendation job on V100, a configuration its logs never held: the
quantile trees repeat a leaf of one deterministic configuration (q10 = q50 =
q90 there) and the conformal offset, negative, is clipped to zero. These tests
rebuild that situation with the real fit (`fit_outcome_predictor`) and export
(`predictor_onnx`), show the zero width without the support rule, and the
widened, flagged interval with it, in scikit-learn and in ONNX Runtime.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from service.contract import KNOWN_HARDWARE
from service.learning.build_models import export
from service.learning.build_models.gavel import gavel_features
from service.learning.build_models.predictor_fit import QuantileModels
from service.learning.build_models.support import MIN_HALF_WIDTH_LOG, fit_support
from service.learning.fit import LearningConfig, fit_outcome_predictor
from service.learning.logs import LoggedRows
from service.policies.manifest import TensorSpec, load_manifest
from service.policies.onnx_policy import SUPPORT_OUTPUT, OnnxModel, OnnxPredictor
from service.policies.outcome_features import N_OUTCOME_FEATURES
from service.policies.predictor_features import parse_job_type
from tests.policies.conftest import POLICIES_DIR

SEEN = [
    ("Recommendation (batch size 2048)", "V100", 1),
    ("LM (batch size 20)", "K80", 4),
]
"""Configurations the synthetic logs hold; Recommendation is only ever seen on one GPU."""
UNSEEN = ("Recommendation (batch size 2048)", "V100", 4)


def _rows(configs: list[tuple[str, str, int]], placement: list[list[float]]) -> np.ndarray:
    """Outcome-feature rows: the Gavel columns of each config plus placement columns."""
    gavel = gavel_features(
        [parse_job_type(j) for j, _, _ in configs],
        [KNOWN_HARDWARE[h] for _, h, _ in configs],
        [g for _, _, g in configs],
        [True] * len(configs),
    )
    extra = np.asarray(placement, dtype=np.float32)
    return np.concatenate([gavel, extra], axis=1)


@pytest.fixture(scope="module")
def logged() -> LoggedRows:
    """600 logged decisions, throughput deterministic per family and class, not by scale (so
    no tree splits on scale and the unseen 4-GPU Recommendation row shares the 1-GPU leaf)."""
    rng = np.random.default_rng(0)
    configs = [SEEN[0]] * 540 + [SEEN[1]] * 60
    placement = [[0.0, rng.uniform(0, 1), rng.uniform(0, 1), 5.0] for _ in configs]
    x = _rows(configs, placement)
    base = {"Recommendation": 2.03, "ResNet-50": 1.0, "LM": 0.4}
    y = np.array([base[j.split(" (")[0]] + (0.3 if h == "K80" else 0.0) for j, h, _ in configs])
    n = len(configs)
    return LoggedRows(
        scenario="synthetic",
        seed=0,
        episode=np.arange(n, dtype=np.int64) % 12,
        outcome_x=x,
        contract_x=np.zeros((n, 1), dtype=np.float32),
        propensity=np.ones(n),
        reward=np.ones(n),
        throughput=np.exp(y),
        run_time=np.ones(n),
        queue_delay=np.zeros(n),
        job_type=np.array([j for j, _, _ in configs]),
        hardware=np.array([h for _, h, _ in configs]),
        work_units=np.ones(n),
    )


@pytest.fixture(scope="module")
def fitted(logged: LoggedRows) -> QuantileModels:
    models, _ = fit_outcome_predictor(logged, LearningConfig(), seed=0)
    return models


def _query() -> np.ndarray:
    return _rows([UNSEEN, SEEN[0]], [[0.0, 0.5, 0.5, 5.0], [0.0, 0.5, 0.5, 5.0]])


def test_without_the_support_rule_the_interval_collapses(fitted: QuantileModels) -> None:
    """The reproduction: offset clipped to 0, one deterministic leaf -> q10 = q50 = q90."""
    assert fitted.offset == 0.0
    q = fitted.offset_log(_query())
    assert q[0, 2] - q[0, 0] < 1e-4, np.exp(q[0])  # the shipped model: [7.6179] * 3


def test_outside_support_the_interval_is_the_widest_seen_and_flagged(
    fitted: QuantileModels,
) -> None:
    assert fitted.support is not None
    x = _query()
    flags = fitted.out_of_support(x)
    assert flags.tolist() == [True, False]
    log_q = np.log(fitted.predict(x))
    raw = fitted.offset_log(x)
    assert log_q[0, 1] == pytest.approx(raw[0, 1])  # the median is unchanged
    assert log_q[0, 1] - log_q[0, 0] >= max(fitted.support.half_width_lo, MIN_HALF_WIDTH_LOG) - 1e-9
    assert log_q[0, 2] - log_q[0, 1] >= max(fitted.support.half_width_hi, MIN_HALF_WIDTH_LOG) - 1e-9
    assert log_q[1].tolist() == pytest.approx(raw[1].tolist())  # in support: as before


def test_the_widening_is_the_widest_training_interval_on_each_side() -> None:
    x = np.array([[0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], dtype=np.float32)
    q_log = np.array([[0.0, 1.0, 1.5], [0.7, 1.0, 2.0], [1.0, 1.0, 1.0]])
    support = fit_support(x, q_log, n_cell_columns=1)
    assert (support.half_width_lo, support.half_width_hi) == (1.0, 1.0)
    assert support.outside(np.array([[1.0, 1.0], [3.0, 1.0], [0.5, 1.0]], np.float32)).tolist() == [
        False,
        True,
        True,
    ]
    widened = support.widen(np.array([[4.0, 4.2, 4.3]]), np.array([True]))
    assert widened.tolist() == [[3.2, 4.2, 5.2]]


def test_any_column_outside_its_training_range_is_out_of_support(fitted: QuantileModels) -> None:
    x = _query()[1:].copy()
    x[0, -1] = 9.0  # log10 work units never seen
    assert fitted.out_of_support(x).tolist() == [True]


def test_onnx_graph_widens_and_flags_as_scikit_learn_does(
    fitted: QuantileModels, logged: LoggedRows
) -> None:
    """Through the service's own predictor class: the flag reaches the predictions."""
    graph = export.predictor_onnx(fitted, N_OUTCOME_FEATURES, "support_test")
    shipped = load_manifest(POLICIES_DIR / "learned-outcome" / "policy.yaml")
    manifest = dataclasses.replace(
        shipped,
        inputs=(TensorSpec(export.INPUT, "float32", ("N", N_OUTCOME_FEATURES)),),
        outputs=(
            TensorSpec(export.PREDICTOR_OUTPUT, "float32", ("N", 3)),
            TensorSpec(SUPPORT_OUTPUT, "float32", ("N", 1)),
        ),
    )
    predictor = OnnxPredictor(OnnxModel(manifest, graph.SerializeToString()))
    x = np.concatenate([_query(), logged.outcome_x[:50]])
    q, flag = predictor.predict_rows_flagged(x)
    assert flag is not None
    assert flag.tolist() == fitted.out_of_support(x).astype(np.float32).tolist()
    assert np.abs(np.log(q) - np.log(fitted.predict(x))).max() < 1e-4
    assert q[0, 2] > q[0, 0]
