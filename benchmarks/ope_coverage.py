"""Coverage of the OPE intervals across logging temperatures, sample sizes and reward shapes.

``python -m benchmarks.ope_coverage [--replications 1000] [--out docs/ope_coverage.md]``
writes the table of docs/ope.md. The contexts are the OPE tests' loaded
training log (``tests/ope/conftest.py``: 120 decisions, co-location on), its
counterfactual outcomes forked for every action; production is re-tempered
per cell (the emulator's softmax at temperature T on the same contexts), the
target is least-loaded. Each replication draws ``n`` rounds i.i.d.: context
uniform over the pool, action from production at T, reward by shape:

- ``slo``: SLO met (0/1), one of the stored rollouts of that (decision, action);
- ``beta``: continuous, ``Beta(2 q, 2 (1 - q))`` with ``q`` the exact expected
  SLO rate of that (decision, action) (mean ``q``: the truth is unchanged).

So the truth is exact: ``V = mean_x sum_a pi(a|x) q(x, a)`` and the paired
difference ``V - V_production``. Every interval is computed on all
replications at once, with the core's own pieces (kernel contributions as
``service.ope.kernels``, `pareto_khat`, `plugin_bets` / `log_capital`,
`difference_pseudo_outcomes`, `normal_allowed`); betting coverage is read
at the true mean (the grid set the service reports contains that exact set,
so its coverage is at least the figure shown).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from service.environment import (
    ContextPool,
    LeastLoaded,
    ProductionConfig,
    ProductionEmulator,
    World,
    build_pool,
    load_scenario,
)
from service.environment.dataset import target_probabilities
from service.ope import clopper_pearson
from service.ope.betting import difference_pseudo_outcomes, log_capital, plugin_bets
from service.ope.comparison import normal_allowed
from service.ope.tail import pareto_khat, tail_size

TEMPERATURES = (0.05, 0.1, 0.3, 1.0)
SIZES = (500, 2_000, 10_000)
SHAPES = ("slo", "beta")
LEVEL = 0.95
C = 0.5
"""The betting truncation the service uses (`OffPolicyBettingCS(c=0.5)`)."""
LOADED = {"jobs_per_episode": 30, "background_fraction": 0.6}
_CELLS = 3_000_000
"""Replications x rounds held at once."""

INTERVALS = (
    ("IPS", "normal"),
    ("SNIPS", "normal"),
    ("DR", "normal"),
    ("SNDR", "normal"),
    ("IPS", "betting"),
    ("DR - prod", "normal"),
    ("IPS - prod", "betting"),
    ("DR - prod", "normal, light weights"),
)
"""Rows per cell: the value's intervals, then the paired difference's. The verdicts use
``IPS - prod, betting`` for a bounded reward and ``DR - prod, normal, light weights``
(counted only over the replications `normal_allowed` admits) for an unbounded one."""
VERDICT_ROWS = (("IPS - prod", "betting"), ("DR - prod", "normal, light weights"))


@dataclass(frozen=True, eq=False)
class Setting:
    """The pool and the exact per-(decision, action) SLO rate."""

    pool: ContextPool
    target: NDArray[np.float64]
    q: NDArray[np.float64]
    table: NDArray[np.float64]

    def logging(self, temperature: float) -> NDArray[np.float64]:
        """Production's distribution at `temperature` on the pool's contexts ``(n, A)``."""
        emulator = ProductionEmulator(ProductionConfig(temperature=temperature))
        p = self.pool
        return target_probabilities(p.features, p.n_options, p.mask, p.requests, emulator)

    def truth(self, dist: NDArray[np.float64]) -> float:
        """``mean_x sum_a dist(a|x) q(x, a)``."""
        return float((dist * self.q).sum(axis=1).mean())


def setting() -> Setting:
    """Build the loaded training log (about 10 s) and least-loaded's distribution."""
    train = load_scenario("train")
    world = World(train.replace(**LOADED, production=ProductionConfig(temperature=1.0)))
    pool = build_pool(world, seed=11, n_episodes=4, n_worlds=3)
    target = target_probabilities(
        pool.features, pool.n_options, pool.mask, pool.requests, LeastLoaded()
    )
    q, _ = pool.q()
    return Setting(pool, target, np.nan_to_num(q), np.nan_to_num(pool.reward_table()))


@dataclass(frozen=True, eq=False)
class Cell:
    """One (temperature, n, shape) cell: coverage counts per `INTERVALS` row."""

    temperature: float
    n: int
    shape: str
    replications: int
    covered: dict[tuple[str, str], int]
    allowed: dict[tuple[str, str], int]
    khat_median: float
    normal_share: float
    """Share of replications whose weights `normal_allowed` calls light."""

    def rows(self) -> Iterator[tuple[str, str, int, int]]:
        """(estimator, interval, covered, replications counted), rows with any counted."""
        for key in INTERVALS:
            if self.allowed[key]:
                yield (*key, self.covered[key], self.allowed[key])


def normal_covers(psi: NDArray[np.float64], truth: float) -> NDArray[np.bool_]:
    """Whether ``mean(psi) +- z sd(psi)/sqrt(n)`` contains `truth`, per row."""
    n = psi.shape[1]
    z = float(stats.norm.ppf(0.5 + LEVEL / 2))
    half = z * psi.std(axis=1, ddof=1) / math.sqrt(n)
    out: NDArray[np.bool_] = np.abs(psi.mean(axis=1) - truth) <= half
    return out


def bet_covers(
    lo: NDArray[np.float64], hi: NDArray[np.float64], m_lo: float, m_hi: float, n: int
) -> NDArray[np.bool_]:
    """Whether both one-sided bets (alpha/2 each, tuned for n) keep the true means."""
    threshold = math.log(2 / (1 - LEVEL))
    out = np.ones(lo.shape[0], dtype=bool)
    for phi, m in ((lo, m_lo), (hi, m_hi)):
        lam, _ = plugin_bets(phi, log_threshold=threshold, n_planned=n)
        out &= log_capital(phi, lam, m, C) < threshold
    return out


def _self_normalised(d: NDArray[np.float64], c: NDArray[np.float64], m: NDArray[np.float64]) -> Any:
    vc = c.sum(axis=1, keepdims=True) / m.sum(axis=1, keepdims=True)
    return d + vc + (c - vc * m) / m.mean(axis=1, keepdims=True)


def run_cell(
    s: Setting, temperature: float, n: int, shape: str, replications: int, seed: int
) -> Cell:
    """Coverage of every `INTERVALS` row over `replications` datasets of `n` rounds."""
    mu = s.logging(temperature)
    v, v_prod = s.truth(s.target), s.truth(mu)
    cum = np.cumsum(mu, axis=1)
    rng = np.random.default_rng(seed)
    covered = dict.fromkeys(INTERVALS, 0)
    allowed = dict.fromkeys(INTERVALS, 0)
    khats: list[NDArray[np.float64]] = []
    normal_used = 0
    chunk = max(1, min(replications, _CELLS // n))
    for start in range(0, replications, chunk):
        b = min(chunk, replications - start)
        ctx = rng.integers(0, s.pool.n, size=(b, n))
        u = rng.random((b, n)) * cum[ctx, -1]
        action = np.minimum((cum[ctx] <= u[..., None]).sum(axis=2), mu.shape[1] - 1)
        if shape == "slo":
            world = rng.integers(0, s.table.shape[2], size=(b, n))
            r = s.table[ctx, action, world]
        else:
            q = np.clip(s.q[ctx, action], 1e-9, 1 - 1e-9)
            r = rng.beta(2 * q, 2 * (1 - q))
        w = s.target[ctx, action] / mu[ctx, action]
        # DR's model as ``ope_run.constant_model``: two folds, each the other's mean reward.
        fold = np.arange(n) % 2
        means = np.stack([r[:, fold == 1].mean(axis=1), r[:, fold == 0].mean(axis=1)], axis=1)
        qhat = means[:, fold]
        psi = {
            "IPS": w * r,
            "SNIPS": _self_normalised(0 * w, w * r, w),
            "DR": qhat + w * (r - qhat),
            "SNDR": _self_normalised(qhat, w * (r - qhat), w),
        }
        hits: dict[tuple[str, str], NDArray[np.bool_]] = {
            (e, "normal"): normal_covers(p, v) for e, p in psi.items()
        }
        hits["IPS", "betting"] = bet_covers(w * r, w * (1 - r), v, 1 - v, n)
        hits["DR - prod", "normal"] = normal_covers(psi["DR"] - r, v - v_prod)
        lo, hi = difference_pseudo_outcomes(w, r)
        dv = v - v_prod
        hits["IPS - prod", "betting"] = bet_covers(lo, hi, (1 + dv) / 2, (1 - dv) / 2, n)
        size = tail_size(n) + 1
        khat = pareto_khat(np.partition(w, n - size, axis=1)[:, -size:], n)
        ess = w.sum(axis=1) ** 2 / (w * w).sum(axis=1)
        ratio = np.where(mu > 0, s.target / np.where(mu > 0, mu, 1.0), 0.0)
        possible = ratio.max(axis=1)[ctx].max(axis=1)  # largest weight these contexts allow
        light = normal_allowed(khat, ess, possible)
        for key, hit in hits.items():
            covered[key] += int(hit.sum())
            allowed[key] += b
        key = ("DR - prod", "normal, light weights")
        covered[key] += int((hits["DR - prod", "normal"] & light).sum())
        allowed[key] += int(light.sum())
        khats.append(khat)
        normal_used += int(light.sum())
    return Cell(
        temperature,
        n,
        shape,
        replications,
        covered,
        allowed,
        float(np.nanmedian(np.concatenate(khats))),
        normal_used / replications,
    )


def holds(covered: int, total: int) -> bool:
    """The test's criterion: the 99% CP interval contains 0.95 or lies above it."""
    return clopper_pearson(covered, total, level=0.99).upper >= LEVEL


def markdown(cells: list[Cell]) -> str:
    """The docs table: one row per cell, coverage [99% CP] per interval; ✗ where the
    CP interval lies below 0.95; (k) = replications counted where fewer than all."""
    names = [f"{e} {k}" for e, k in INTERVALS]
    lines = [
        "| T | n | reward | k-hat (median) | " + " | ".join(names) + " |",
        "|---|---|---|---|" + "---|" * len(names),
    ]
    for cell in cells:
        out = []
        for key in INTERVALS:
            c, total = cell.covered[key], cell.allowed[key]
            if total == 0:
                out.append("—")
                continue
            cp = clopper_pearson(c, total, level=0.99)
            mark = "" if holds(c, total) else " ✗"
            count = "" if total == cell.replications else f" ({total})"
            out.append(f"{c / total:.3f} [{cp.lower:.3f}, {cp.upper:.3f}]{count}{mark}")
        lines.append(
            f"| {cell.temperature:g} | {cell.n:,} | {cell.shape} | {cell.khat_median:.2f} | "
            + " | ".join(out)
            + " |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replications", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=2027)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    from rich.progress import Progress

    s = setting()
    grid = [(t, n, shape) for t in TEMPERATURES for n in SIZES for shape in SHAPES]
    cells = []
    with Progress() as progress:
        task = progress.add_task("coverage cells", total=len(grid))
        for i, (t, n, shape) in enumerate(grid):
            cells.append(run_cell(s, t, n, shape, args.replications, args.seed + i))
            progress.advance(task)
    text = markdown(cells)
    if args.out is not None:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
