"""Support and the mean weight with production's whole distribution, per round (issue 22 item 8).

Ground truth is known here: the logging distribution ``mu`` is drawn first,
the logged actions are sampled from it, so ``E_mu[w | x] = sum_{mu(a) > 0}
pi(a | x) = 1 - u(x)`` and the unsupported mass ``u`` are exact numbers the
diagnostics must reproduce; rounds whose distribution is not known (a NaN row)
must be judged exactly as without it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.contract import InvalidInput
from service.ope import BanditData, diagnostics
from service.ope.diagnostics import DiagnosticSums, caveats, unsupported_mass
from service.ope.results import Basis


def _log(
    n: int = 4000, a: int = 5, seed: int = 0
) -> tuple[BanditData, np.ndarray, np.ndarray, np.ndarray]:
    """Rounds where production never takes the last action at even rounds, a target that
    puts 0.3 there, actions sampled from production: returns (data without the
    distribution, mu, pi, exact u)."""
    rng = np.random.default_rng(seed)
    mu = rng.dirichlet(np.ones(a), size=n)
    mu[::2, -1] = 0.0
    mu /= mu.sum(axis=1, keepdims=True)
    pi = rng.dirichlet(np.ones(a - 1), size=n) * 0.7
    pi = np.concatenate([pi, np.full((n, 1), 0.3)], axis=1)
    action = np.array([rng.choice(a, p=row) for row in mu])
    rows = np.arange(n)
    data = BanditData(
        reward=rng.random(n),
        action=action,
        pscore=mu[rows, action],
        action_dist=pi,
    )
    u = (pi * (mu <= 0)).sum(axis=1)
    return data, mu, pi, u


def test_the_exact_unsupported_mass_and_expected_weight_with_the_distribution() -> None:
    data, mu, _, u = _log()
    full = BanditData(**{**_fields(data), "logging_dist": mu})
    d = diagnostics(full)
    assert d.support_known and d.support_rounds == data.n
    assert d.unsupported_share == pytest.approx(u.mean(), abs=1e-12) == pytest.approx(0.15)
    assert d.unsupported_rounds == data.n // 2
    assert d.expected_mean_weight == pytest.approx(1.0 - u.mean(), abs=1e-12)
    # the sample mean weight estimates exactly that, and the z is judged against it
    assert abs(d.weight_mean_z) < 4.0
    assert d.mean_weight == pytest.approx(d.expected_mean_weight, abs=0.05)
    # without the distribution the same log is judged from propensities (never 1 here):
    # the missing support is invisible, and the mean weight is tested against 1
    d0 = diagnostics(data)
    assert not d0.support_known and d0.support_rounds == 0
    assert d0.unsupported_share == 0.0 and math.isnan(d0.expected_mean_weight)
    assert abs(d0.weight_mean_z) > 4.0


def _fields(data: BanditData) -> dict[str, object]:
    return {
        "reward": data.reward,
        "action": data.action,
        "pscore": data.pscore,
        "action_dist": data.action_dist,
    }


def test_rounds_without_the_distribution_are_judged_as_today() -> None:
    data, mu, _, u = _log(n=400)
    known = np.arange(data.n) % 3 != 0
    partial = np.where(known[:, None], mu, np.nan)
    mixed = BanditData(**{**_fields(data), "logging_dist": partial})
    assert (mixed.logging_known == known).all()
    estimate = unsupported_mass(data)  # as without any distribution
    expected_u = np.where(known, u, estimate)
    assert np.array_equal(unsupported_mass(mixed), expected_u)
    d = diagnostics(mixed)
    assert not d.support_known and d.support_rounds == int(known.sum())
    assert d.unsupported_share == pytest.approx(expected_u.mean(), abs=1e-12)
    assert d.expected_mean_weight == pytest.approx(1.0 - u[known].mean(), abs=1e-12)
    # E[w] is tested against 1, as without the distribution, since not every round is known
    assert math.isnan(d.expected_w2) and math.isnan(d.max_possible_weight)
    text = caveats(d, Basis.IMPORTANCE_WEIGHTED, 0.5, 0.01)
    assert any(f"exactly on the {known.sum()} of {data.n} rounds" in c for c in text)


def test_streaming_sums_of_mixed_batches_equal_the_batch() -> None:
    data, mu, _, _ = _log(n=600, seed=2)
    known = np.arange(data.n) >= 250
    partial = np.where(known[:, None], mu, np.nan)
    whole = BanditData(**{**_fields(data), "logging_dist": partial})
    first = whole.subset(np.arange(300))
    second = BanditData(**{**_fields(whole.subset(np.arange(300, 600))), "logging_dist": None})
    # the second batch passes no distribution at all: concatenation fills NaN rows
    joined = BanditData.concatenate([first, second])
    assert joined.logging_dist is not None
    assert int(joined.logging_known.sum()) == 50
    merged = DiagnosticSums.of(first).merge(DiagnosticSums.of(second)).finish()
    batch = diagnostics(joined)
    assert merged.support_rounds == batch.support_rounds == 50
    assert merged.unsupported_share == pytest.approx(batch.unsupported_share, abs=1e-12)
    assert merged.expected_mean_weight == pytest.approx(batch.expected_mean_weight, abs=1e-12)


def test_a_partial_nan_row_or_a_disagreeing_known_row_is_refused() -> None:
    data, mu, _, _ = _log(n=20)
    half = mu.copy()
    half[3, 0] = np.nan
    with pytest.raises(InvalidInput) as info:
        BanditData(**{**_fields(data), "logging_dist": half})
    assert info.value.field == "logging_dist" and "round 3" in str(info.value)
    wrong = np.where((np.arange(20) == 5)[:, None], np.roll(mu, 1, axis=1), mu)
    wrong[0] = np.nan  # an unknown row is never compared with its pscore
    with pytest.raises(InvalidInput) as info:
        BanditData(**{**_fields(data), "logging_dist": wrong})
    assert info.value.field == "pscore" and "round 5" in str(info.value)


def test_simulated_logs_carry_the_emulator_distribution_and_the_diagnostics_use_it() -> None:
    """Ground truth from the simulator: production's distribution is the emulator's own.

    Each recorded request carries exactly the distribution the emulator sampled its
    choice from (and validates, zero on every option the contract masks). The
    emulator never defers while an option is feasible, so a target that defers
    half the time has unsupported mass 1/2 at every round: exact with the
    distribution, invisible without it (no logged propensity is 1 where there is
    a choice).
    """
    from service.contract.validation import validate_request
    from service.environment import World, load_scenario, log_episode

    world = World(load_scenario("demo").replace(jobs_per_episode=60))
    log = log_episode(world, seed=4, episode=0)
    assert log.decisions
    a = max(d.request.options.n_options for d in log.decisions) + 1
    rows, mu, pi, action, pscore = [], [], [], [], []
    for d in log.decisions:
        p = d.request.production
        assert p is not None and p.probabilities is not None
        assert p.probabilities == tuple(float(x) for x in d.probabilities)
        assert p.defer_probability == float(d.defer_probability)
        validate_request(d.request)
        k = d.request.options.n_options
        m = np.zeros(a)
        m[:k], m[-1] = d.probabilities, d.defer_probability
        target = np.zeros(a)
        feasible = np.flatnonzero(~d.violations.any(axis=1))
        target[int(feasible[np.argmin(d.probabilities[feasible])])] = 0.5
        target[-1] = 0.5  # DEFER
        rows.append(len(rows))
        mu.append(m)
        pi.append(target)
        action.append(d.chosen)
        pscore.append(float(d.probabilities[d.chosen]))
    mu_a, pi_a = np.array(mu), np.array(pi)
    data = BanditData(
        reward=np.zeros(len(rows)),
        action=np.array(action),
        pscore=np.array(pscore),
        action_dist=pi_a,
        logging_dist=mu_a,
    )
    d = diagnostics(data)
    truth = (pi_a * (mu_a <= 0)).sum(axis=1)
    assert d.support_known and d.support_rounds == len(rows)
    assert d.unsupported_share == pytest.approx(truth.mean(), abs=1e-12)
    assert d.expected_mean_weight == pytest.approx(1.0 - truth.mean(), abs=1e-12)
    assert truth.mean() == pytest.approx(0.5)
    without = diagnostics(BanditData(data.reward, data.action, data.pscore, data.action_dist))
    choice = np.array(pscore) < 1.0
    assert without.unsupported_share == pytest.approx(0.5 * (~choice).mean(), abs=1e-12)
    assert without.unsupported_share < d.unsupported_share
