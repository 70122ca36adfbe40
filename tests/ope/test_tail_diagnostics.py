"""The weight-tail diagnostics: Pareto k-hat, the E[w] = 1 test, the top-1% share, and
the caveats that explain them (unseen tail vs missing support vs wrong propensities)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from service.environment import ProductionConfig, ProductionEmulator
from service.environment.dataset import target_probabilities
from service.ope import BanditData, Estimate, Estimator, StreamingEstimator, estimate
from service.ope.tail import TAIL_KEEP, TailSketch, khat_limit, pareto_khat, weight_mean_z
from tests.ope.conftest import Sim


@pytest.mark.parametrize("xi", [0.2, 0.5, 0.8])
def test_khat_recovers_the_generalized_pareto_shape(xi: float) -> None:
    rng = np.random.default_rng(int(xi * 100))
    w = stats.genpareto.rvs(xi, size=(60, 4000), random_state=rng)
    k = pareto_khat(np.sort(w, axis=1)[:, -500:], 4000)
    print(f"\n[ope] k-hat on GPD(xi={xi}) samples of 4,000: mean {k.mean():.3f} sd {k.std():.3f}")
    assert abs(float(k.mean()) - xi) < 0.06


def test_khat_of_bounded_weights_is_negative_and_flat_weights_have_none() -> None:
    rng = np.random.default_rng(3)
    assert float(pareto_khat(rng.uniform(0, 5, size=2000), 2000)) < 0
    assert math.isnan(float(pareto_khat(np.ones(500), 500)))
    assert math.isnan(TailSketch.of(rng.uniform(size=10)).khat())  # too few rounds


def test_thresholds_follow_psis() -> None:
    assert khat_limit(100) == pytest.approx(0.5)
    assert khat_limit(1000) == pytest.approx(1 - 1 / 3)
    assert khat_limit(100_000) == 0.7


def test_sketch_merges_exactly() -> None:
    rng = np.random.default_rng(9)
    w = stats.genpareto.rvs(0.6, size=3 * TAIL_KEEP, random_state=rng)
    merged = TailSketch()
    for part in np.array_split(w, 7):
        merged = merged.merge(TailSketch.of(part))
    whole = TailSketch.of(w)
    assert merged.khat() == pytest.approx(whole.khat(), abs=1e-12)
    top = np.sort(w)[-math.ceil(len(w) / 100) :].sum() / w.sum()
    assert merged.top_share() == pytest.approx(top, rel=1e-12)


def test_weight_mean_z() -> None:
    w = np.array([0.5, 1.5, 0.5, 1.5, 0.5])
    z = (w.mean() - 1) / (w.std(ddof=1) / math.sqrt(len(w)))
    assert weight_mean_z(len(w), float(w.sum()), float((w * w).sum())) == pytest.approx(z)


def tempered(
    sim: Sim, temperature: float, n: int, seed: int, claimed: float | None = None
) -> tuple[BanditData, BanditData]:
    """Least-loaded on `n` rounds logged by production acting at `temperature`, with and
    without the full logging distribution; `claimed`: the temperature whose
    distributions production logs instead (wrong propensities)."""
    pool = sim.pool

    def dist(t: float) -> np.ndarray:
        emulator = ProductionEmulator(ProductionConfig(temperature=t))
        return target_probabilities(
            pool.features, pool.n_options, pool.mask, pool.requests, emulator
        )

    mu = dist(temperature)
    logged = mu if claimed is None else dist(claimed)
    rng = np.random.default_rng(seed)
    ctx = rng.integers(0, pool.n, size=n)
    cum = np.cumsum(mu[ctx], axis=1)
    action = np.minimum((cum <= rng.random(n)[:, None] * cum[:, -1:]).sum(axis=1), mu.shape[1] - 1)
    table = np.nan_to_num(pool.reward_table())
    reward = table[ctx, action, rng.integers(0, table.shape[2], size=n)]
    pi = sim.targets["least-loaded"][ctx]
    common = dict(reward=reward, action=action, pscore=logged[ctx, action], action_dist=pi)
    return BanditData(**common, logging_dist=logged[ctx]), BanditData(**common)


def test_cold_logging_gives_a_heavy_tail_caveat_naming_khat(sim: Sim) -> None:
    full, bare = tempered(sim, 0.1, 2000, seed=4)
    for data in (full, bare):
        r = estimate(data, Estimator.IPS)
        assert isinstance(r, Estimate)
        d = r.diagnostics
        print(
            f"\n[ope] T=0.1: k-hat {d.khat:.2f} (limit {d.khat_limit:.2f}), mean w "
            f"{d.mean_weight:.2f} z {d.weight_mean_z:.1f}, top 1% {d.top_share:.0%}, "
            f"E[w^2] {d.expected_w2:.3g} vs sample {d.mean_w2:.3g}"
        )
        assert d.heavy_tail
        assert any("Pareto k-hat" in c and "not a valid interval" in c for c in r.caveats)
        assert not any("wrong propensities" in c for c in r.caveats)
    d = estimate(full, Estimator.IPS).diagnostics
    pi, mu = full.action_dist, full.logging_dist
    assert mu is not None
    exact = np.mean(
        [sum(p * p / m for p, m in zip(pi[t], mu[t], strict=True) if m > 0) for t in range(full.n)]
    )
    assert d.expected_w2 == pytest.approx(exact, rel=1e-12)
    streamed = StreamingEstimator(Estimator.IPS)
    for rows in np.array_split(np.arange(full.n), 5):
        streamed.update(full.subset(rows))
    assert streamed.estimate().diagnostics.khat == pytest.approx(d.khat, abs=1e-12)


def test_warm_logging_is_light_and_wrong_propensities_are_named(sim: Sim) -> None:
    full, _ = tempered(sim, 1.0, 3000, seed=5)
    ok = estimate(full, Estimator.IPS)
    assert isinstance(ok, Estimate) and not ok.diagnostics.heavy_tail
    assert not any("k-hat" in c or "mean importance weight" in c for c in ok.caveats)
    # Production acted at T=0.5 but logged its T=2.0 distributions: wrong propensities.
    full, bare = tempered(sim, 0.5, 5000, seed=6, claimed=2.0)
    with_dist = estimate(full, Estimator.IPS)
    without = estimate(bare, Estimator.IPS)
    assert isinstance(with_dist, Estimate) and isinstance(without, Estimate)
    d = with_dist.diagnostics
    print(
        f"\n[ope] wrong propensities: mean w {d.mean_weight:.3f}, "
        f"z {d.weight_mean_z:.1f}, k-hat {d.khat:.2f}"
    )
    assert not d.heavy_tail
    assert any("(wrong propensities)" in c for c in with_dist.caveats), with_dist.caveats
    expected = "the logged propensities are wrong" if d.mean_weight > 1 else "cannot be told apart"
    assert any(expected in c for c in without.caveats), without.caveats
