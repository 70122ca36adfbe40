"""Production's whole distribution: the rules a sent ``probabilities`` vector must meet.

Runtime may send, with its decision, the probability its policy gave every
option and DEFER (``ProductionDecision.probabilities`` and
``defer_probability``), as Decision Service logs do. The overlap diagnostics
then check support exactly instead of estimating it, so a distribution that
is not a distribution, or that disagrees with the decision it came with,
would turn a wrong log into a confident diagnostic. It is refused instead,
naming the first offending value:

- one probability per option; each finite and in ``[0, 1]``; the defer
  probability likewise (absent = 0);
- options and defer sum to 1 within `SUM_TOLERANCE`;
- a ``defer_probability`` without ``probabilities`` is refused (half a
  distribution says nothing about support);
- when ``propensity`` is sent too, it equals the chosen action's probability
  (``probabilities[option]``, or ``defer_probability`` for `DEFER`) within
  `SUM_TOLERANCE`; when it is not, the propensity *is* that probability
  (`effective_propensity`; the log stores the derived value);
- the chosen action has probability > 0 (production took it);
- every option the feasibility function masks has probability exactly 0
  (`check_support`: this needs the mask, so it is computed at ingest only for
  requests that carry a distribution).

An outcome that carries production's decision has no options to count, so
`check_distribution` runs there with ``n_options=None`` (values, sum,
propensity agreement, chosen > 0, and the chosen option within the vector).
"""

from __future__ import annotations

import math

import numpy as np

from service.contract.actions import DEFER
from service.contract.errors import InvalidInput
from service.contract.feasibility import Feasibility, check_feasibility
from service.contract.request import MirrorRequest, ProductionDecision

SUM_TOLERANCE = 1e-6
"""How far options plus defer may sum from 1, and a sent propensity from the
chosen action's probability: float64 senders land within 1e-12, float32 ones
(a softmax in single precision over up to 10,000 options) within about 1e-6."""


def defer_of(production: ProductionDecision) -> float:
    """The defer probability of a sent distribution (absent = 0)."""
    d = production.defer_probability
    return 0.0 if d is None else float(d)


def chosen_probability(production: ProductionDecision) -> float | None:
    """The distribution's probability of the chosen action; None without a distribution
    or when the chosen option lies outside it."""
    probs = production.probabilities
    if probs is None:
        return None
    if production.option == DEFER:
        return defer_of(production)
    if 0 <= production.option < len(probs):
        return float(probs[production.option])
    return None


def effective_propensity(production: ProductionDecision) -> float | None:
    """The sent propensity, or, when only the distribution was sent, the chosen
    action's probability in it (documented in docs/contract.md)."""
    if production.propensity is not None:
        return production.propensity
    return chosen_probability(production)


def _check_value(field: str, value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise InvalidInput(field, f"must be finite and in [0, 1], got {value}")


def check_distribution(field: str, production: ProductionDecision, n_options: int | None) -> None:
    """Check the distribution's own rules (module docstring); a no-op without one.

    Args:
        field: the decision's dotted path (``"production"``).
        production: the decision.
        n_options: the request's options; None for an outcome-carried decision
            (no request to count against).
    """
    probs = production.probabilities
    if probs is None:
        if production.defer_probability is not None:
            raise InvalidInput(
                f"{field}.defer_probability",
                f"needs `{field}.probabilities` (one per option) alongside it",
            )
        return
    if n_options is not None and len(probs) != n_options:
        raise InvalidInput(
            f"{field}.probabilities",
            f"must hold one probability per option ({n_options}), got {len(probs)}",
        )
    if n_options is None and not probs:
        raise InvalidInput(f"{field}.probabilities", "must hold one probability per option")
    values = np.asarray(probs, dtype=np.float64)
    # one vectorised question first (NaN fails it); the loop names the first bad value
    if not bool(((values >= 0.0) & (values <= 1.0)).all()):
        for i, p in enumerate(probs):
            _check_value(f"{field}.probabilities[{i}]", p)
    defer = defer_of(production)
    _check_value(f"{field}.defer_probability", defer)
    total = math.fsum(values.tolist()) + defer
    if abs(total - 1.0) > SUM_TOLERANCE:
        raise InvalidInput(
            f"{field}.probabilities",
            f"must sum to 1 with `{field}.defer_probability` (within {SUM_TOLERANCE:g}), "
            f"got {total!r}",
        )
    option = production.option
    if option != DEFER and option >= len(probs):
        raise InvalidInput(
            f"{field}.option", f"must index `{field}.probabilities` (< {len(probs)}), got {option}"
        )
    chosen = chosen_probability(production)
    assert chosen is not None  # a distribution, and the option within it
    where = f"{field}.defer_probability" if option == DEFER else f"{field}.probabilities[{option}]"
    if chosen <= 0.0:
        raise InvalidInput(where, f"must be > 0: production chose it, got {chosen}")
    sent = production.propensity
    if sent is not None and abs(sent - chosen) > SUM_TOLERANCE:
        raise InvalidInput(
            f"{field}.propensity",
            f"must equal `{where}` (within {SUM_TOLERANCE:g}), got {sent} vs {chosen}",
        )


def check_support(field: str, production: ProductionDecision, feasibility: Feasibility) -> None:
    """Refuse probability on an option the feasibility mask calls infeasible."""
    probs = production.probabilities
    if probs is None:
        return
    bad = np.flatnonzero((np.asarray(probs, dtype=np.float64) != 0.0) & ~feasibility.mask)
    if len(bad):
        i = int(bad[0])
        signals = ", ".join(s.value for s in feasibility.failed(i))
        raise InvalidInput(
            f"{field}.probabilities[{i}]",
            f"must be 0: option {i} is infeasible (signals {signals}), got {probs[i]}",
        )


def check_request_support(request: MirrorRequest) -> None:
    """`check_support` for a request's decision, computing the mask only when a
    distribution was sent (the one extra feasibility pass at ingest; its cost is
    in docs/contract.md, "Production's decision")."""
    production = request.production
    if production is None or production.probabilities is None:
        return
    feasibility = check_feasibility(
        request.state, request.workload, request.options, request.quota_remaining
    )
    check_support("production", production, feasibility)
