"""From the logged rounds to estimator arrays: reward, production's action and propensity, targets.

Action columns are a request's options padded to the most options in the
log, then one column for DEFER, always the last (as in
``service.protocols.rounds``). Per round:

- ``action``: production's option (``-1`` = DEFER goes to the last column);
- ``pscore``: production's propensity from the requests table;
- target row: the decision's ``probabilities_f64`` blob over the options, its
  defer probability in the last column (a request with no feasible option is
  deferred with probability 1, by production and by every policy).

- logging row: production's whole distribution when Runtime sent it
  (``requests.production_probabilities_f64``, options then DEFER, in the same
  columns), NaN where it did not (or where it disagrees with the logged
  propensity or does not sum to 1, which validation refuses at ingest): the
  diagnostics then check support exactly at those rounds and estimate it at
  the others (``service.ope.diagnostics``).

Rounds are left out, and counted, when the outcome field the reward reads was
not observed, when production's decision or propensity is missing (assumed
missing at random, reported as ``unusable_pscore``), or when the policy has no
usable distribution there (status ``error``, not scored, or a row that does not
sum to 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

from service.ope import BanditData
from service.storage.reads.ope import UNKNOWN_OPTION, OpeLog, PolicyLog

USABLE_STATUSES = frozenset({"ok", "timeout", "all_infeasible", "infeasible_choice"})
"""Decision statuses that carry a distribution (an ``error`` has none)."""
SUM_TOLERANCE = 1e-6


class Reward(StrEnum):
    """Which joined-outcome field is the reward (higher is better)."""

    SLO_MET = "slo-met"
    """1 when the job met its SLO, else 0."""
    NEG_COMPLETION_HOURS = "neg-completion-hours"
    """``-completion_time_s / 3600``."""
    NEG_QUEUE_HOURS = "neg-queue-hours"
    """``-queue_delay_s / 3600``."""

    def of(self, log: OpeLog) -> NDArray[np.float64]:
        """The reward per round, NaN where the field was not observed."""
        if self is Reward.SLO_MET:
            return log.slo_met.copy()
        if self is Reward.NEG_COMPLETION_HOURS:
            return -log.completion_time_s / 3600.0
        return -log.queue_delay_s / 3600.0


@dataclass(frozen=True, slots=True)
class Dropped:
    """Rounds of the log left out of one policy's data, by reason."""

    no_reward: int
    no_production: int
    no_target: int

    @property
    def total(self) -> int:
        """All rounds left out."""
        return self.no_reward + self.no_production + self.no_target


@dataclass(frozen=True, eq=False)
class PolicyRounds:
    """One policy's estimator input and the bookkeeping a report needs.

    Attributes:
        policy: ``(name, version)``.
        data: the rounds used, or None when none is usable.
        rows: int64 indices into the `OpeLog` of the rounds in `data`.
        dropped: how many were left out, by reason.
        infeasible_favourites: share of its logged decisions whose raw
            favourite was infeasible (over the rounds it scored).
        timeout_share: share of the rounds in `data` whose decision timed out
            (a fallback distribution).
    """

    policy: tuple[str, str]
    data: BanditData | None
    rows: NDArray[np.int64]
    dropped: Dropped
    infeasible_favourites: float
    timeout_share: float


def width(log: OpeLog) -> int:
    """Action columns: the most options in the log plus DEFER."""
    return (int(log.n_options.max()) if log.n else 0) + 1


def production_columns(log: OpeLog) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Production's action column (DEFER last) and propensity; NaN where either is unknown."""
    a = width(log)
    known = log.production_option != UNKNOWN_OPTION
    in_range = known & (log.production_option < log.n_options)
    action = np.where(log.production_option >= 0, log.production_option, a - 1).astype(np.int64)
    action = np.where(in_range, action, a - 1)
    pscore = np.where(in_range, log.production_propensity, np.nan)
    return action, pscore


def target_rows(policy: PolicyLog, n_options: NDArray[np.int64], a: int) -> NDArray[np.float64]:
    """The policy's distribution over (options..., DEFER) per round; zero rows where unusable."""
    out = np.zeros((len(n_options), a))
    for i, (status, probs) in enumerate(zip(policy.status, policy.probabilities, strict=True)):
        k = int(n_options[i])
        if status not in USABLE_STATUSES or probs is None or len(probs) != k:
            continue
        defer = policy.defer_probability[i]
        out[i, :k] = probs
        out[i, -1] = 0.0 if np.isnan(defer) else defer
        if abs(out[i].sum() - 1.0) > SUM_TOLERANCE or (out[i] < 0).any():
            out[i] = 0.0
    return out


def feasible_columns(policy: PolicyLog, n_options: NDArray[np.int64], a: int) -> NDArray[np.bool_]:
    """Per round, the columns that exist (its options and DEFER); DEFER only when the
    policy logged ``all_infeasible`` (no feasible option: nothing to choose).

    Option-level feasibility is not decoded from the stored request, so an existing
    option counts as feasible; this keeps `Diagnostics.deterministic_share` from
    counting no-choice rounds as deterministic logging.
    """
    out = np.arange(a)[None, :] < n_options[:, None]
    out[:, -1] = True
    none = np.array([s == "all_infeasible" for s in policy.status], dtype=bool)
    out[none, :-1] = False
    return out


def logging_rows(
    log: OpeLog, action: NDArray[np.int64], pscore: NDArray[np.float64], a: int
) -> NDArray[np.float64] | None:
    """Production's distribution over (options..., DEFER) per round, NaN rows where it is
    not known or not consistent with the logged action's propensity; None when no round
    has one (the diagnostics then behave as without it). Vectorised over the rounds."""
    dists = log.production_distribution
    if not any(x is not None for x in dists):
        return None
    k_all = log.n_options
    at = np.array(
        [i for i, x in enumerate(dists) if x is not None and len(x) == k_all[i] + 1],
        dtype=np.int64,
    )
    out = np.full((log.n, a), np.nan)
    if not len(at):
        return out
    k = k_all[at]
    values = np.concatenate([dists[i] for i in at.tolist()])
    starts = np.cumsum(k + 1) - (k + 1)
    filled = np.zeros((len(at), a))
    line = np.repeat(np.arange(len(at)), k)
    column = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
    filled[line, column] = values[np.repeat(starts, k) + column]
    filled[:, -1] = values[starts + k]
    ok = (
        np.isfinite(filled).all(axis=1)
        & (filled >= 0).all(axis=1)
        & (np.abs(filled.sum(axis=1) - 1.0) <= SUM_TOLERANCE)
        & (np.abs(filled[np.arange(len(at)), action[at]] - pscore[at]) <= SUM_TOLERANCE)
    )
    out[at[ok]] = filled[ok]
    return out


def policy_rounds(log: OpeLog, reward: Reward, policy: tuple[str, str]) -> PolicyRounds:
    """`BanditData` for `policy` on `log` with `reward` (module docstring for what is left out)."""
    logged = log.policies[policy]
    r = reward.of(log)
    action, pscore = production_columns(log)
    target = target_rows(logged, log.n_options, width(log))
    feasible = feasible_columns(logged, log.n_options, width(log))
    target[((target > 0) & ~feasible).any(axis=1)] = 0.0  # inconsistent: unusable
    has_reward = ~np.isnan(r)
    has_target = target.sum(axis=1) > 0
    usable_p = np.isfinite(pscore) & (pscore > 0) & (pscore <= 1)
    keep = has_reward & has_target & usable_p
    dropped = Dropped(
        no_reward=int((~has_reward).sum()),
        no_production=int((has_reward & ~usable_p).sum()),
        no_target=int((has_reward & usable_p & ~has_target).sum()),
    )
    scored = np.array([s != "" for s in logged.status], dtype=bool)
    favourites = (
        float(logged.raw_favourite_infeasible[scored].mean()) if scored.any() else float("nan")
    )
    rows = np.flatnonzero(keep).astype(np.int64)
    logging = logging_rows(log, action, pscore, width(log))
    data = (
        None
        if not len(rows)
        else BanditData(
            reward=r[rows],
            action=action[rows],
            pscore=pscore[rows],
            action_dist=target[rows],
            feasible=feasible[rows],
            logging_dist=None if logging is None else logging[rows],
            unusable_pscore=dropped.no_production,
        )
    )
    timeouts = np.array([logged.status[i] == "timeout" for i in rows], dtype=bool)
    timeout_share = float(timeouts.mean()) if len(rows) else 0.0
    return PolicyRounds(policy, data, rows, dropped, favourites, timeout_share)


def production_rounds(log: OpeLog, reward: Reward) -> NDArray[np.float64]:
    """Production's observed rewards (on-policy), NaN rounds left out."""
    r = reward.of(log)
    return r[~np.isnan(r)]
