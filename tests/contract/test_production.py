"""Production's whole distribution (issue 22 item 8): every rule refuses naming its field.

Requests are the sampled ones the other contract tests use (trace jobs against
sampled clusters, up to 50 options); the distribution is built from the
project's own feasibility mask, so "valid" means what ingest will meet.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from service.contract import DEFER, InvalidInput, MirrorRequest, Outcome, ProductionDecision
from service.contract.feasibility import check_feasibility
from service.contract.outcome import FailureKind
from service.contract.production import SUM_TOLERANCE, effective_propensity
from service.contract.validation import validate_outcome, validate_request
from service.environment.samples import sample_requests


def _with_masked_option() -> tuple[MirrorRequest, np.ndarray]:
    """A sampled request with at least two feasible options and one infeasible one."""
    for request in sample_requests(200, seed=3, max_options=50):
        mask = check_feasibility(
            request.state, request.workload, request.options, request.quota_remaining
        ).mask
        if mask.sum() >= 2 and (~mask).any():
            return request, mask
    raise AssertionError("no sampled request has both feasible and masked options")


REQUEST, MASK = _with_masked_option()
FEASIBLE = np.flatnonzero(MASK)
MASKED = int(np.flatnonzero(~MASK)[0])


def _uniform(defer: float = 0.0) -> tuple[float, ...]:
    p = np.where(MASK, (1.0 - defer) / MASK.sum(), 0.0)
    return tuple(float(x) for x in p)


def _request(production: ProductionDecision) -> MirrorRequest:
    return replace(REQUEST, production=production)


def _refused(request: MirrorRequest) -> InvalidInput:
    with pytest.raises(InvalidInput) as info:
        validate_request(request)
    return info.value


CHOSEN = int(FEASIBLE[0])


def test_a_valid_distribution_is_accepted() -> None:
    probs = _uniform(defer=0.2)
    validate_request(_request(ProductionDecision(CHOSEN, probs[CHOSEN], probs, 0.2)))
    validate_request(_request(ProductionDecision(DEFER, 0.2, probs, 0.2)))
    # no propensity: derived from the distribution
    decision = ProductionDecision(CHOSEN, None, probs, 0.2)
    validate_request(_request(decision))
    assert effective_propensity(decision) == probs[CHOSEN]
    assert effective_propensity(ProductionDecision(DEFER, None, probs, 0.2)) == 0.2
    # a float32 sender's rounding passes
    f32 = tuple(float(np.float32(x)) for x in _uniform())
    validate_request(_request(ProductionDecision(CHOSEN, f32[CHOSEN], f32, None)))


def _bad(**change: object) -> ProductionDecision:
    probs = _uniform(defer=0.2)
    base = ProductionDecision(CHOSEN, probs[CHOSEN], probs, 0.2)
    return replace(base, **change)  # type: ignore[arg-type]


def _set(i: int, value: float, defer: float = 0.2) -> tuple[float, ...]:
    p = list(_uniform(defer))
    p[i] = value
    return tuple(p)


def _moved(source: int, to: int) -> tuple[float, ...]:
    """The valid distribution with option `source`'s mass moved to option `to`."""
    p = list(_uniform(defer=0.2))
    p[to], p[source] = p[source], 0.0
    return tuple(p)


CASES = [
    (
        "too few",
        _bad(probabilities=_uniform()[:-1]),
        "production.probabilities",
        "one probability per option",
    ),
    (
        "too many",
        _bad(probabilities=(*_uniform(0.2), 0.0)),
        "production.probabilities",
        "one probability per option",
    ),
    (
        "NaN",
        _bad(probabilities=_set(CHOSEN, float("nan"))),
        f"production.probabilities[{CHOSEN}]",
        "finite",
    ),
    (
        "negative",
        _bad(probabilities=_set(MASKED, -0.1)),
        f"production.probabilities[{MASKED}]",
        "[0, 1]",
    ),
    (
        "above 1",
        _bad(probabilities=_set(CHOSEN, 1.5)),
        f"production.probabilities[{CHOSEN}]",
        "[0, 1]",
    ),
    ("defer NaN", _bad(defer_probability=float("nan")), "production.defer_probability", "finite"),
    ("defer > 1", _bad(defer_probability=2.0), "production.defer_probability", "[0, 1]"),
    ("sum 0.8", _bad(defer_probability=0.0), "production.probabilities", "sum to 1"),
    ("sum off by 1e-5", _bad(defer_probability=0.2 + 1e-5), "production.probabilities", "sum to 1"),
    ("defer alone", _bad(probabilities=None), "production.defer_probability", "needs"),
    ("propensity disagrees", _bad(propensity=0.5), "production.propensity", "must equal"),
    (
        "defer propensity disagrees",
        _bad(option=DEFER, propensity=0.5),
        "production.propensity",
        "production.defer_probability",
    ),
    (
        "chosen has 0",
        _bad(option=MASKED, propensity=None),
        f"production.probabilities[{MASKED}]",
        "> 0",
    ),
    (
        "defer chosen with 0",
        _bad(option=DEFER, propensity=None, probabilities=_uniform(), defer_probability=0.0),
        "production.defer_probability",
        "> 0",
    ),
    (
        "mass on a masked option",
        _bad(probabilities=_moved(int(FEASIBLE[1]), MASKED)),
        f"production.probabilities[{MASKED}]",
        "infeasible",
    ),
]


@pytest.mark.parametrize(("name", "production", "field", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_distributions_are_refused_naming_the_field(
    name: str, production: ProductionDecision, field: str, words: str
) -> None:
    exc = _refused(_request(production))
    assert exc.field == field, (name, str(exc))
    assert words in exc.problem, (name, str(exc))


def test_the_masked_option_message_names_option_and_signals() -> None:
    probs = list(_uniform())
    probs[CHOSEN] -= 1e-3
    probs[MASKED] = 1e-3
    exc = _refused(_request(ProductionDecision(CHOSEN, probs[CHOSEN], tuple(probs), None)))
    assert exc.field == f"production.probabilities[{MASKED}]"
    assert f"must be 0: option {MASKED} is infeasible (signals " in exc.problem
    signals = check_feasibility(
        REQUEST.state, REQUEST.workload, REQUEST.options, REQUEST.quota_remaining
    ).failed(MASKED)
    assert all(s.value in exc.problem for s in signals) and signals


def test_sum_tolerance_is_the_documented_one() -> None:
    assert SUM_TOLERANCE == 1e-6
    inside = _bad(defer_probability=0.2 + 0.5e-6)
    validate_request(_request(replace(inside, propensity=None)))


def _outcome(production: ProductionDecision) -> Outcome:
    return Outcome(
        request_id="r-1",
        observed_at=1_700_000_100.0,
        queue_delay_s=1.0,
        throughput=None,
        completion_time_s=None,
        slo_met=None,
        failure=FailureKind.NONE,
        production=production,
    )


def test_outcome_carried_distributions_are_checked_without_the_request() -> None:
    validate_outcome(_outcome(ProductionDecision(1, None, (0.25, 0.75), None)))
    validate_outcome(_outcome(ProductionDecision(DEFER, 0.5, (0.25, 0.25), 0.5)))
    for production, field in (
        (ProductionDecision(1, None, (0.25, 0.5), None), "production.probabilities"),
        (ProductionDecision(2, None, (0.25, 0.75), None), "production.option"),
        (ProductionDecision(0, 0.5, (0.25, 0.75), None), "production.propensity"),
        (ProductionDecision(0, None, (), 1.0), "production.probabilities"),
        (ProductionDecision(0, None, (0.0, 1.0), None), "production.probabilities[0]"),
    ):
        with pytest.raises(InvalidInput) as info:
            validate_outcome(_outcome(production))
        assert info.value.field == field, str(info.value)
