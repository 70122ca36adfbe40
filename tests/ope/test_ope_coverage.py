"""Coverage and bias against the simulator's exact per-decision truth.

Datasets: `tests.ope.simdata.draw` on the session's loaded log (>= 70% cluster
utilisation, co-location on). A nominal 95% interval passes when the 99%
Clopper-Pearson interval of its observed coverage over the seeded
replications contains 0.95. The figures are printed; run with ``-s`` to see
them (``-m slow`` for the 1,000-replication versions).
"""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from service.contract import RewardSpec
from service.ope import Bootstrap, Estimate, Estimator, clopper_pearson, estimate
from tests.ope.conftest import Sim
from tests.ope.simdata import dataset, draw, exact_model, linear_model

WEIGHTED = (Estimator.IPS, Estimator.SNIPS, Estimator.DR, Estimator.SNDR)


def run_coverage(
    sim: Sim, target: str, replications: int, rounds: int, n_boot: int, seed: int
) -> list[tuple[str, str, int, int]]:
    """Coverage counts per (estimator, interval): rows (estimator, interval, covered, total)."""
    pool, pi = sim.pool, sim.targets[target]
    truth = sim.truth(target)
    draws = draw(pool, np.random.default_rng(seed), replications + 1, rounds)
    model = linear_model(pool, draws, replications)  # fitted on a held-out replication
    covered = {(e, kind): 0 for e in WEIGHTED for kind in ("normal", "bootstrap")}
    for i in range(replications):
        data = dataset(pool, draws, i, pi, model)
        for e in WEIGHTED:
            normal = estimate(data, e)
            boot = estimate(data, e, bootstrap=Bootstrap(n_boot=n_boot, seed=seed + i))
            assert isinstance(normal, Estimate) and isinstance(boot, Estimate)
            covered[e, "normal"] += normal.interval.contains(truth)
            covered[e, "bootstrap"] += boot.interval.contains(truth)
    rows = [(e.value, kind, c, replications) for (e, kind), c in covered.items()]
    print(f"\n[ope] coverage, target {target} (truth {truth:.4f}), {rounds} rounds per dataset:")
    for name, kind, c, total in rows:
        cp = clopper_pearson(c, total, level=0.99)
        print(
            f"  {name:6s} {kind:9s} nominal 0.95  observed {c / total:.3f} ({c}/{total})  "
            f"99% CP [{cp.lower:.3f}, {cp.upper:.3f}]"
        )
    return rows


def assert_covers(rows: list[tuple[str, str, int, int]]) -> None:
    for name, kind, c, total in rows:
        assert clopper_pearson(c, total, level=0.99).contains(0.95), (name, kind, c, total)


def test_coverage_quick(sim: Sim) -> None:
    assert_covers(run_coverage(sim, "least-loaded", 200, 500, 200, seed=100))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["least-loaded", "random-feasible"])
def test_coverage_over_a_thousand_replications(sim: Sim, target: str) -> None:
    """Least-loaded: near-deterministic (ties split); random-feasible: stochastic."""
    assert_covers(
        run_coverage(sim, target, 1000, 500, 400, seed=1 if target == "least-loaded" else 2)
    )


def bias_figures(
    sim: Sim,
    target: str,
    replications: int,
    rounds: int,
    seed: int,
    spec: RewardSpec | None = None,
) -> dict[Estimator, NDArray[np.float64]]:
    pool, pi = sim.pool, sim.targets[target]
    draws = draw(pool, np.random.default_rng(seed), replications + 1, rounds, spec)
    model = linear_model(pool, draws, replications)
    out: dict[Estimator, list[float]] = {e: [] for e in Estimator}
    for i in range(replications):
        data = dataset(pool, draws, i, pi, model)
        for e in Estimator:
            r = estimate(data, e)
            assert isinstance(r, Estimate)
            out[e].append(r.value)
    return {e: np.asarray(v) for e, v in out.items()}


def check_unbiased(values: dict[Estimator, NDArray[np.float64]], truth: float, label: str) -> None:
    print(f"\n[ope] bias, {label} (truth {truth:.4f}):")
    for e, v in values.items():
        mc = v.std(ddof=1) / np.sqrt(len(v))
        print(
            f"  {e.value:9s} mean {v.mean():.4f}  bias {v.mean() - truth:+.5f}  "
            f"MC error {mc:.5f}  ({(v.mean() - truth) / mc:+.2f} MC errors)  sd {v.std():.4f}"
        )
    for e in (Estimator.IPS, Estimator.DR):
        v = values[e]
        mc = v.std(ddof=1) / np.sqrt(len(v))
        assert abs(v.mean() - truth) < 4 * mc, (e, v.mean(), truth, mc)


def test_ips_and_dr_are_unbiased_quick(sim: Sim) -> None:
    values = bias_figures(sim, "random-feasible", 300, 300, seed=7)
    check_unbiased(values, sim.truth("random-feasible"), "random-feasible, 300 x 300 rounds")


@pytest.mark.slow
@pytest.mark.parametrize("target", ["least-loaded", "throughput-aware"])
def test_ips_and_dr_are_unbiased(sim: Sim, target: str) -> None:
    values = bias_figures(sim, target, 2000, 300, seed=11)
    check_unbiased(values, sim.truth(target), f"{target}, 2000 x 300 rounds")


@pytest.mark.slow
def test_a_cost_guardrail_is_estimated_without_bias_by_the_same_call(sim: Sim) -> None:
    """Completion time in hours as a cost: the same estimators, another outcome array."""
    cost = RewardSpec({"completion_time_s": 1 / 3600})
    values = bias_figures(sim, "least-loaded", 1000, 300, seed=13, spec=cost)
    truth = sim.pool.truth(sim.targets["least-loaded"], cost).value.value
    check_unbiased(values, truth, "cost = completion time (h), least-loaded, 1000 x 300 rounds")


@pytest.mark.parametrize(
    "replications",
    [pytest.param(300, id="quick"), pytest.param(1000, id="full", marks=pytest.mark.slow)],
)
def test_dr_beats_dm_when_the_reward_model_is_misspecified(sim: Sim, replications: int) -> None:
    """A linear model of the option features is wrong; DR corrects it with the logged rewards."""
    pool, target = sim.pool, "least-loaded"
    truth = sim.truth(target)
    values = bias_figures(sim, target, replications, 300, seed=17)
    rmse = {e: float(np.sqrt(np.mean((v - truth) ** 2))) for e, v in values.items()}
    print(f"\n[ope] misspecified linear model, {target}, {replications} x 300 rounds, RMSE:")
    for e, v in rmse.items():
        print(f"  {e.value:9s} RMSE {v:.4f}  bias {values[e].mean() - truth:+.4f}")
    dm = values[Estimator.DM]
    assert abs(dm.mean() - truth) > 4 * dm.std(ddof=1) / np.sqrt(len(dm))  # DM is biased
    assert rmse[Estimator.DR] < rmse[Estimator.DM]
    assert rmse[Estimator.SNDR] < rmse[Estimator.DM]
    # with the exact model DR has less error than IPS
    exact = exact_model(pool)
    draws = draw(pool, np.random.default_rng(19), 200, 300)
    err = {Estimator.DR: [], Estimator.IPS: []}  # type: dict[Estimator, list[float]]
    for i in range(200):
        data = dataset(pool, draws, i, sim.targets[target], exact)
        for e in err:
            r = estimate(data, e)
            assert isinstance(r, Estimate)
            err[e].append((r.value - truth) ** 2)
    assert np.mean(err[Estimator.DR]) < np.mean(err[Estimator.IPS])


def test_the_near_bound_limit_is_visible(sim: Sim) -> None:
    """Throughput-aware's value is 0.99 of a 0/1 reward: SNIPS's Wald-type interval under-covers
    there (0.88 over 1,000 replications of 500 rounds), and every such estimate says so."""
    pool, truth = sim.pool, sim.truth("throughput-aware")
    draws = draw(pool, np.random.default_rng(23), 300, 500)
    covered = flagged = 0
    for i in range(300):
        r = estimate(dataset(pool, draws, i, sim.targets["throughput-aware"]), Estimator.SNIPS)
        assert isinstance(r, Estimate)
        covered += r.interval.contains(truth)
        flagged += any("near the edge" in c for c in r.caveats)
    print(
        f"\n[ope] throughput-aware SNIPS: coverage {covered / 300:.3f}, "
        f"near-edge caveat {flagged}/300"
    )
    assert clopper_pearson(covered, 300, level=0.99).upper < 0.95
    assert flagged >= 0.9 * 300
    typical = estimate(dataset(pool, draws, 0, sim.targets["least-loaded"]), Estimator.SNIPS)
    assert isinstance(typical, Estimate)
    assert not any("near the edge" in c for c in typical.caveats)
