"""`check_policy` and `check_predictor`: public conformance checkers.

Like Gymnasium's ``check_env``, they state the contract as executable checks.
The registry runs them on a probe batch before accepting a policy, and the
test suite runs them over every manifest in ``policies/``. Every problem is
collected, so one run tells the author everything to fix.

A conformant policy, on every request whose status is not ``error``:

- returns arrays of the documented dtypes and shapes;
- puts probability >= 0, and exactly 0 on infeasible options -- unless it
  records decisions made elsewhere (``records_outside_decisions``, i.e.
  production-mirror), and then only with status ``infeasible_choice``;
- sums to 1 over options plus defer (within 1e-6);
- chooses `DEFER` or an option in range with positive probability, feasible
  unless the status is ``infeasible_choice``;
- has the status the vocabulary's rule gives (`base.decision_status`, the same
  for every policy): ``infeasible_choice`` exactly when probability sits on a
  masked option, else ``all_infeasible`` exactly when no option is feasible,
  and then defers with probability 1; else ``ok``;
- flags ``raw_favourite_infeasible`` exactly when some option is feasible and
  its highest finite raw score sits on a masked option;
- gives identical decisions for the same batch and seed.

On a probe batch (valid requests), ``error`` or ``timeout`` is itself a problem.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.contract import DEFER
from service.policies.base import (
    DecisionStatus,
    Policy,
    PolicyDecisions,
    ScoringBatch,
    decision_status,
)
from service.policies.errors import PolicyConformanceError
from service.policies.predictor import THROUGHPUT_NAMES, Predictor
from service.policies.probabilities import first_argmax

TOLERANCE = 1e-6
_ARRAYS: tuple[tuple[str, type[np.generic], str], ...] = (
    ("scores", np.float32, "rows"),
    ("probabilities", np.float64, "rows"),
    ("defer_probability", np.float64, "requests"),
    ("chosen", np.int64, "requests"),
    ("raw_favourite_infeasible", np.bool_, "requests"),
)


def _shape_problems(d: PolicyDecisions, n_rows: int, n_req: int) -> list[str]:
    problems = []
    for attr, dtype, axis in _ARRAYS:
        value = getattr(d, attr)
        want = (n_rows,) if axis == "rows" else (n_req,)
        if not isinstance(value, np.ndarray) or value.shape != want or value.dtype != dtype:
            got = (value.shape, value.dtype) if isinstance(value, np.ndarray) else type(value)
            problems.append(f"`{attr}` must be {np.dtype(dtype)} of shape {want}, got {got}")
    if len(d.status) != n_req or not all(isinstance(s, DecisionStatus) for s in d.status):
        problems.append(f"`status` must hold {n_req} DecisionStatus values")
    for name, arr in (d.predictions or {}).items():
        if not isinstance(arr, np.ndarray) or arr.shape != (n_rows,):
            problems.append(f"`predictions[{name!r}]` must have shape ({n_rows},)")
    return problems


def _request_problems(
    d: PolicyDecisions, batch: ScoringBatch, records_outside: bool = False
) -> list[str]:
    problems: list[str] = []
    favourite = first_argmax(
        d.scores.astype(np.float64), batch.offsets, np.ones(len(batch.mask), dtype=bool)
    )
    for r in range(batch.n_requests):
        start, end = int(batch.offsets[r]), int(batch.offsets[r + 1])
        status = d.status[r]
        where = f"request {r}"
        if status in (DecisionStatus.ERROR, DecisionStatus.TIMEOUT):
            problems.append(f"{where}: status {status} on a valid probe request")
            continue
        p, mask, defer = d.probabilities[start:end], batch.mask[start:end], d.defer_probability[r]
        if not (np.isfinite(p).all() and np.isfinite(defer)):
            problems.append(f"{where}: probabilities must be finite")
            continue
        if (p < 0).any() or defer < 0:
            problems.append(f"{where}: probabilities must be >= 0")
        if (p[~mask] != 0).any() and not records_outside:
            bad = int(np.flatnonzero((p != 0) & ~mask)[0])
            problems.append(f"{where}: option {bad} is infeasible but has probability {p[bad]}")
        total = float(p.sum() + defer)
        if abs(total - 1.0) > TOLERANCE:
            problems.append(f"{where}: probabilities plus defer sum to {total}, expected 1")
        any_feasible = bool(mask.any())
        expected = decision_status(mask, p)
        if status is not expected:
            masked_mass = float(p[~mask].sum())
            problems.append(
                f"{where}: status {status}, but the rule gives {expected} "
                f"({int(mask.sum())} feasible options, {masked_mass:g} on masked ones)"
            )
        outside = expected is DecisionStatus.INFEASIBLE_CHOICE
        c = int(d.chosen[r])
        if c == DEFER:
            if defer <= 0:
                problems.append(f"{where}: chose defer, which has probability 0")
        elif not 0 <= c < end - start:
            problems.append(f"{where}: `chosen` {c} is not -1 or in [0, {end - start})")
        elif (not mask[c] and not outside) or p[c] <= 0:
            problems.append(f"{where}: chose option {c} (feasible={bool(mask[c])}, p={p[c]})")
        if not any_feasible and not outside and (abs(defer - 1.0) > TOLERANCE or c != DEFER):
            problems.append(f"{where}: no feasible option, so it must defer with probability 1")
        scores = d.scores[start:end]
        if end > start and np.isfinite(scores).all():
            expect = any_feasible and not batch.mask[favourite[r]]
            if bool(d.raw_favourite_infeasible[r]) != expect:
                problems.append(f"{where}: `raw_favourite_infeasible` must be {expect}")
    return problems


def _same(a: PolicyDecisions, b: PolicyDecisions) -> bool:
    arrays_equal = all(
        np.array_equal(getattr(a, attr), getattr(b, attr), equal_nan=attr != "chosen")
        if getattr(a, attr).dtype.kind == "f"
        else np.array_equal(getattr(a, attr), getattr(b, attr))
        for attr, _, _ in _ARRAYS
    )
    return arrays_equal and a.status == b.status


def check_policy(policy: Policy, batch: ScoringBatch, *, seed: int = 0) -> PolicyDecisions:
    """Run `policy` twice on `batch` with `seed`; raise `PolicyConformanceError` on any problem.

    Returns the first run's decisions, so a caller can inspect or time them.
    """
    name = str(getattr(policy, "name", type(policy).__name__))
    try:
        first = policy.decide(batch, np.random.default_rng(seed))
        second = policy.decide(batch, np.random.default_rng(seed))
    except Exception as exc:  # a conformance checker reports, whatever the failure
        raise PolicyConformanceError(name, [f"decide raised {type(exc).__name__}: {exc}"]) from exc
    problems = _shape_problems(first, len(batch.mask), batch.n_requests)
    if not problems:
        records_outside = bool(getattr(policy, "records_outside_decisions", False))
        problems += _request_problems(first, batch, records_outside)
        if not _same(first, second):
            problems.append(f"decisions differ between two runs with seed {seed}")
    if problems:
        raise PolicyConformanceError(name, problems)
    return first


def check_predictor(predictor: Predictor, batch: ScoringBatch) -> dict[str, NDArray[np.float32]]:
    """Check shapes, positivity, quantile order and determinism of a predictor's output."""
    name = str(getattr(predictor, "name", type(predictor).__name__))
    try:
        first = predictor.predict(batch)
        second = predictor.predict(batch)
    except Exception as exc:  # a conformance checker reports, whatever the failure
        raise PolicyConformanceError(name, [f"predict raised {type(exc).__name__}: {exc}"]) from exc
    problems = []
    n_rows = len(batch.mask)
    for key in THROUGHPUT_NAMES:
        value = first.get(key)
        if value is None or value.shape != (n_rows,):
            problems.append(f"`{key}` must be present with shape ({n_rows},)")
        elif not (np.isfinite(value).all() and (value > 0).all()):
            problems.append(f"`{key}` must be finite and > 0")
    if not problems:
        q = np.stack([first[k] for k in THROUGHPUT_NAMES], axis=1)
        if (np.diff(q, axis=1) < 0).any():
            problems.append("quantiles must be ordered q10 <= q50 <= q90")
        if any(not np.array_equal(first[k], second[k], equal_nan=True) for k in first):
            problems.append("predictions differ between two runs")
    if problems:
        raise PolicyConformanceError(name, problems)
    return first
