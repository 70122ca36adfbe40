"""The intervals the verdicts use keep 95% coverage in every cell where a verdict is allowed.

The cells are those of docs/ope.md's table (``python -m benchmarks.ope_coverage``):
logging temperatures 0.05–1.0, least-loaded as target, exact truth, i.i.d.
replications; the slow test re-runs the 500- and 2,000-round cells (the
10,000-round ones take ~20 s each; the docs table has them) with 1,000
replications each and asserts, per verdict interval, that the 99%
Clopper-Pearson interval of its coverage contains 0.95 or lies above it.
The quick test checks the harness against the core's own `estimate` and
`PairedOffPolicyBettingCS` on single replications, so what the table counts is
what the service computes.
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.ope_coverage import (
    SHAPES,
    TEMPERATURES,
    VERDICT_ROWS,
    Setting,
    bet_covers,
    holds,
    markdown,
    run_cell,
    setting,
)
from service.ope import BanditData, Estimate, Estimator, PairedOffPolicyBettingCS, estimate
from service.ope.betting import difference_pseudo_outcomes


@pytest.fixture(scope="module")
def table_setting() -> Setting:
    return setting()


@pytest.mark.slow
def test_verdict_intervals_keep_their_coverage(table_setting: Setting) -> None:
    cells = [
        run_cell(table_setting, t, n, shape, 1000, seed=17 + i)
        for i, (t, n, shape) in enumerate(
            (t, n, shape) for t in TEMPERATURES for n in (500, 2000) for shape in SHAPES
        )
    ]
    print("\n" + markdown(cells))
    checked = 0
    for cell in cells:
        for key in VERDICT_ROWS:
            c, total = cell.covered[key], cell.allowed[key]
            if total:
                checked += 1
                assert holds(c, total), (cell.temperature, cell.n, cell.shape, key, c, total)
    assert checked >= len(cells)  # the bounded-reward verdict row is in every cell
    # The table has teeth: the normal IPS interval fails where the tail is heavy.
    cold = next(c for c in cells if c.temperature == 0.1 and c.n == 500)
    assert not holds(cold.covered["IPS", "normal"], cold.replications)


def test_harness_counts_what_the_service_computes(table_setting: Setting) -> None:
    s = table_setting
    mu = s.logging(0.1)
    rng = np.random.default_rng(3)
    n = 800
    ctx = rng.integers(0, s.pool.n, size=n)
    cum = np.cumsum(mu[ctx], axis=1)
    action = np.minimum((cum <= rng.random(n)[:, None] * cum[:, -1:]).sum(axis=1), mu.shape[1] - 1)
    reward = s.table[ctx, action, rng.integers(0, s.table.shape[2], size=n)]
    w = s.target[ctx, action] / mu[ctx, action]
    data = BanditData(
        reward=reward, action=action, pscore=mu[ctx, action], action_dist=s.target[ctx]
    )
    ips = estimate(data, Estimator.IPS)
    assert isinstance(ips, Estimate)
    assert ips.value == pytest.approx(float((w * reward).mean()), rel=1e-12)
    # The harness reads betting coverage at the truth; the grid interval contains that set.
    # Each bound is the grid point just outside the first candidate not rejected, so it may
    # reach one grid step (2 / grid_size in difference units) past the set: probe inside that.
    grid_size = 1000
    cs = PairedOffPolicyBettingCS(0.05, n_planned=n, grid_size=grid_size)
    cs.update(weight=data.weight, reward=reward)
    interval = cs.interval()
    lo, hi = difference_pseudo_outcomes(w[None, :], reward[None, :])
    step = 2 / grid_size
    for d in np.linspace(interval.lower + step, interval.upper - step, 7):
        assert bet_covers(lo, hi, (1 + d) / 2, (1 - d) / 2, n)[0]
    for d in (interval.lower - 0.01, interval.upper + 0.01):
        if -1 < d < 1:
            assert not bet_covers(lo, hi, (1 + d) / 2, (1 - d) / 2, n)[0]
