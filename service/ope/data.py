"""Logged bandit data, validated once, in the shapes every estimator reads.

Shapes: ``n`` logged rounds, ``A`` action columns (for Understudy: a request's
placement options padded to the most options, plus one column for DEFER).

Arrays with fixed names, as in zr-obp (Saito et al. 2021, "Open Bandit
Dataset and Pipeline"): `reward`, `action`, `pscore`, `action_dist`,
`estimated_rewards`. A cost is just another outcome: estimate it with the same
call on ``data.with_outcome(cost, estimated_rewards=cost_model)``; rewards and
costs are never merged (docs/contract.md).

Invalid input raises `service.contract.InvalidInput` naming the argument, e.g.
"`action` elements must be integers in the range of [0, `action_dist.shape[1]`),
got 7 at round 2". Missing propensities (Runtime may not know one) are not
invalid input: drop those rounds with `screen_pscore` first and pass the count
as `unusable_pscore`, so the diagnostics report it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from service.contract import InvalidInput

SUM_TOLERANCE = 1e-6
"""How far a probability row may sum from 1 (float32 policies round)."""

_A = TypeVar("_A", NDArray[np.float64], NDArray[np.bool_])

_ACTION_RANGE = "elements must be integers in the range of [0, `action_dist.shape[1]`)"


@dataclass(frozen=True, slots=True)
class PropensityScreen:
    """Which logged propensities are usable.

    Attributes:
        usable: bool ``(n,)``, finite and in (0, 1].
        missing: rounds whose propensity is NaN (unknown to Runtime).
        invalid: rounds whose propensity is infinite, <= 0 or > 1.
    """

    usable: NDArray[np.bool_]
    missing: int
    invalid: int

    @property
    def unusable(self) -> int:
        """``missing + invalid``."""
        return self.missing + self.invalid


def screen_pscore(pscore: NDArray[np.float64]) -> PropensityScreen:
    """Split raw logged propensities (NaN = missing) into usable and not.

    Estimators assume the dropped rounds are missing at random; the count is
    reported in `Diagnostics.unusable_pscore` so a reader can judge that.
    """
    p = np.asarray(pscore, dtype=np.float64)
    missing = np.isnan(p)
    ok = np.isfinite(p) & (p > 0) & (p <= 1)
    return PropensityScreen(ok, int(missing.sum()), int((~ok & ~missing).sum()))


def one_hot(action: NDArray[np.int64], n_actions: int) -> NDArray[np.float64]:
    """A deterministic target as an ``(n, n_actions)`` action distribution."""
    a = np.asarray(action)
    out = np.zeros((len(a), n_actions))
    out[np.arange(len(a)), a] = 1.0
    return out


def _at(mask: NDArray[np.bool_]) -> int:
    """Index of the first row where `mask` holds (over all trailing axes)."""
    flat = mask.reshape(len(mask), -1).any(axis=1) if mask.ndim > 1 else mask
    return int(np.flatnonzero(flat)[0])


def _float_array(name: str, value: object, ndim: int) -> NDArray[np.float64]:
    arr = np.asarray(value)
    if arr.ndim != ndim:
        raise InvalidInput(name, f"must be a {ndim}-dimensional array, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise InvalidInput(name, f"must be numeric, got dtype {arr.dtype}")
    out = arr.astype(np.float64)
    bad = ~np.isfinite(out)
    if bad.any():
        t = _at(bad)
        raise InvalidInput(
            name, f"must be finite, got {out[t].ravel()[bad[t].ravel()][0]} at round {t}"
        )
    return out


def _check_distribution(name: str, dist: NDArray[np.float64]) -> None:
    neg = dist < 0
    if neg.any():
        t = _at(neg)
        raise InvalidInput(name, f"must be non-negative, got {dist[t].min()} at round {t}")
    sums = dist.sum(axis=1)
    off = np.abs(sums - 1.0) > SUM_TOLERANCE
    if off.any():
        t = _at(off)
        raise InvalidInput(name, f"rows must sum to 1, got {sums[t]} at round {t}")


def _logging_array(value: object) -> NDArray[np.float64]:
    """`logging_dist` as float64: finite, except whole rows of NaN (not known there)."""
    arr = np.asarray(value)
    if arr.ndim == 2 and np.issubdtype(arr.dtype, np.floating):
        unknown = np.isnan(arr).all(axis=1)
        if unknown.any():
            out = _float_array("logging_dist", np.where(unknown[:, None], 0.0, arr), 2)
            out[unknown] = np.nan
            return out
    return _float_array("logging_dist", arr, 2)


@dataclass(frozen=True, eq=False)
class BanditData:
    """Logged contextual-bandit rounds and one target policy's action distribution.

    Attributes:
        reward: float64 ``(n,)``, the logged outcome (a reward, or a cost).
        action: int64 ``(n,)``, logged action column in ``[0, A)``.
        pscore: float64 ``(n,)``, logging probability of `action`, in (0, 1].
        action_dist: float64 ``(n, A)``, the target's distribution ``pi(a|x_t)``;
            rows sum to 1; one-hot for a deterministic target (`one_hot`).
        estimated_rewards: float64 ``(n, A)`` or None, a reward model
            ``q_hat(x_t, a)`` (needed by DM, DR, SNDR, switch-DR). Fit it on
            other rounds (cross-fitting) for DR's guarantees.
        feasible: bool ``(n, A)`` or None, the per-decision feasible set; the
            target must put no probability outside it.
        logging_dist: float64 ``(n, A)`` or None, the logging policy's full
            distribution; with it, support is checked for every action. A row
            of NaN says it is not known at that round (a log where production
            sent its distribution for some requests only): support there is
            checked as without it (`logging_known`).
        unusable_pscore: rounds dropped before this data for a missing or
            invalid propensity (`screen_pscore`), reported in diagnostics.
    """

    reward: NDArray[np.float64]
    action: NDArray[np.int64]
    pscore: NDArray[np.float64]
    action_dist: NDArray[np.float64]
    estimated_rewards: NDArray[np.float64] | None = None
    feasible: NDArray[np.bool_] | None = None
    logging_dist: NDArray[np.float64] | None = None
    unusable_pscore: int = 0

    def __post_init__(self) -> None:
        reward = _float_array("reward", self.reward, 1)
        pscore = _float_array("pscore", self.pscore, 1)
        dist = _float_array("action_dist", self.action_dist, 2)
        n, a = dist.shape
        if n == 0:
            raise InvalidInput("reward", "must hold at least one round, got 0")
        action = np.asarray(self.action)
        if action.ndim != 1:
            raise InvalidInput("action", f"must be a 1-dimensional array, got shape {action.shape}")
        for name, length in (
            ("reward", len(reward)),
            ("action", len(action)),
            ("pscore", len(pscore)),
        ):
            if length != n:
                raise InvalidInput(
                    name, f"must have one entry per row of `action_dist` ({n}), got {length}"
                )
        if not np.issubdtype(action.dtype, np.integer):
            raise InvalidInput("action", f"{_ACTION_RANGE}, got dtype {action.dtype}")
        bad = (action < 0) | (action >= a)
        if bad.any():
            t = _at(bad)
            raise InvalidInput("action", f"{_ACTION_RANGE}, got {action[t]} at round {t}")
        out = (pscore <= 0) | (pscore > 1)
        if out.any():
            t = _at(out)
            raise InvalidInput("pscore", f"must be in (0, 1], got {pscore[t]} at round {t}")
        _check_distribution("action_dist", dist)
        object.__setattr__(self, "reward", reward)
        object.__setattr__(self, "action", action.astype(np.int64))
        object.__setattr__(self, "pscore", pscore)
        object.__setattr__(self, "action_dist", dist)
        self._check_optional(n, a)
        if self.unusable_pscore < 0:
            raise InvalidInput("unusable_pscore", f"must be >= 0, got {self.unusable_pscore}")

    def _check_optional(self, n: int, a: int) -> None:
        for name in ("estimated_rewards", "logging_dist"):
            value = getattr(self, name)
            if value is None:
                continue
            arr = _logging_array(value) if name == "logging_dist" else _float_array(name, value, 2)
            if arr.shape != (n, a):
                raise InvalidInput(
                    name, f"must have the shape of `action_dist` {(n, a)}, got {arr.shape}"
                )
            object.__setattr__(self, name, arr)
        if self.feasible is not None:
            feasible = np.asarray(self.feasible)
            if feasible.dtype != np.bool_ or feasible.shape != (n, a):
                raise InvalidInput(
                    "feasible",
                    f"must be a bool array of the shape of `action_dist` {(n, a)}, "
                    f"got {feasible.dtype} {feasible.shape}",
                )
            outside = (self.action_dist > 0) & ~feasible
            if outside.any():
                t = _at(outside)
                raise InvalidInput(
                    "action_dist", f"puts probability on an infeasible action at round {t}"
                )
            object.__setattr__(self, "feasible", feasible)
        if self.logging_dist is not None:
            known = self.logging_known
            # unknown rows stand in as uniform, so a bad row is named by its own round
            _check_distribution(
                "logging_dist", np.where(known[:, None], self.logging_dist, 1.0 / a)
            )
            logged = self.logging_dist[np.arange(n), self.action]
            off = known & (np.abs(logged - self.pscore) > SUM_TOLERANCE)
            if off.any():
                t = _at(off)
                raise InvalidInput(
                    "pscore",
                    f"must equal `logging_dist` at the logged action, got {self.pscore[t]} "
                    f"vs {logged[t]} at round {t}",
                )

    @property
    def logging_known(self) -> NDArray[np.bool_]:
        """bool ``(n,)``: rounds whose logging distribution is known (a row of
        `logging_dist` that is not NaN); all False without `logging_dist`."""
        if self.logging_dist is None:
            return np.zeros(self.n, dtype=bool)
        known: NDArray[np.bool_] = np.asarray(~np.isnan(self.logging_dist).all(axis=1))
        return known

    @property
    def n(self) -> int:
        """Logged rounds."""
        return len(self.reward)

    @property
    def n_actions(self) -> int:
        """Action columns ``A``."""
        return int(self.action_dist.shape[1])

    @property
    def target_pscore(self) -> NDArray[np.float64]:
        """``pi(a_t|x_t)``, shape ``(n,)``."""
        return self.action_dist[np.arange(self.n), self.action]

    @property
    def weight(self) -> NDArray[np.float64]:
        """Importance weights ``w_t = pi(a_t|x_t) / pscore_t``, shape ``(n,)``."""
        return self.target_pscore / self.pscore

    def with_outcome(
        self, reward: NDArray[np.float64], estimated_rewards: NDArray[np.float64] | None = None
    ) -> BanditData:
        """The same rounds and target with another outcome (e.g. a cost) and its model."""
        return replace(self, reward=reward, estimated_rewards=estimated_rewards)

    def with_target(self, action_dist: NDArray[np.float64]) -> BanditData:
        """The same logged rounds evaluated for another target."""
        return replace(self, action_dist=action_dist)

    def subset(self, rows: NDArray[np.bool_] | NDArray[np.int64]) -> BanditData:
        """The rounds selected by `rows` (a bool mask or indices), e.g. one slice.

        `unusable_pscore` is not carried over: which slice a dropped round
        belonged to is unknown.
        """
        return BanditData(
            reward=self.reward[rows],
            action=self.action[rows],
            pscore=self.pscore[rows],
            action_dist=self.action_dist[rows],
            estimated_rewards=None
            if self.estimated_rewards is None
            else self.estimated_rewards[rows],
            feasible=None if self.feasible is None else self.feasible[rows],
            logging_dist=None if self.logging_dist is None else self.logging_dist[rows],
        )

    @staticmethod
    def concatenate(parts: Sequence[BanditData]) -> BanditData:
        """Rounds of several batches in order (the batch view of a stream)."""
        models = [p.estimated_rewards for p in parts]
        feasible = [p.feasible for p in parts]
        logging = [p.logging_dist for p in parts]
        return BanditData(
            reward=np.concatenate([p.reward for p in parts]),
            action=np.concatenate([p.action for p in parts]),
            pscore=np.concatenate([p.pscore for p in parts]),
            action_dist=np.concatenate([p.action_dist for p in parts]),
            estimated_rewards=_cat(models),
            feasible=_cat(feasible),
            logging_dist=_cat_logging(logging, [p.n for p in parts], parts[0].n_actions),
            unusable_pscore=sum(p.unusable_pscore for p in parts),
        )


def _cat_logging(
    arrays: Sequence[NDArray[np.float64] | None], sizes: Sequence[int], a: int
) -> NDArray[np.float64] | None:
    """Concatenate logging distributions: None when no batch has one, NaN rows (not
    known) for the batches without."""
    if all(x is None for x in arrays):
        return None
    out: NDArray[np.float64] = np.concatenate(
        [np.full((n, a), np.nan) if x is None else x for x, n in zip(arrays, sizes, strict=True)]
    )
    return out


def _cat(arrays: Sequence[_A | None]) -> _A | None:
    """Concatenate optional arrays: None unless every batch has one."""
    present = [x for x in arrays if x is not None]
    if len(present) < len(arrays):
        return None
    out: _A = np.concatenate(present)
    return out
