"""Baseline policies in code: the floor every candidate is compared against.

Each one is a scoring rule plus a `ProbabilityRule`, so masking, defer and
the "raw favourite was infeasible" metric work exactly as for ONNX policies.
All are deterministic except random-feasible, and none defers while a
feasible option exists.

=====================  =====================================================
name                   raw score of an option (higher = preferred)
=====================  =====================================================
production-mirror      1 on the option Runtime chose, 0 elsewhere; none
                       (NaN) when Runtime deferred or has not decided
random-feasible        none (NaN); uniform over feasible options
first-fit              minus its position in Runtime's list
best-fit               minus the accelerators left free on its nodes after
                       placing (tightest packing); for a share job, minus
                       the free share left on the tightest device it fits
                       on; a node the option overfills counts 10^6 + the
                       shortfall
least-loaded           minus mean utilisation minus 0.1 x log1p(max queue)
throughput-greedy      a predictor's median throughput (q50)
=====================  =====================================================

Production-mirror records what happened rather than proposing anything: it
follows Runtime even onto an option the feasibility function masks (then the
mass sits on a masked option, the one documented exception to the masking
invariant, and the status says so: ``infeasible_choice``), and returns
``ERROR`` for a request whose production decision is not yet known.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.contract import DEFER, FEATURE_NAMES, MirrorRequest
from service.contract.devices import node_devices
from service.policies.base import (
    DecisionStatus,
    Policy,
    PolicyDecisions,
    ScoringBatch,
    decision_status,
)
from service.policies.predictor import Predictor
from service.policies.probabilities import ProbabilityRule, RuleKind, decide_from_scores

BASELINE_VERSION = "builtin-1"
_ARGMAX = ProbabilityRule(RuleKind.ARGMAX)
_UTILISATION = FEATURE_NAMES.index("utilisation")
_QUEUE = FEATURE_NAMES.index("queue_length")
_OVERFILL = 1e6


class _Baseline:
    """Shared plumbing: a name, a version, a rule and a score function."""

    name: str = ""
    rule: ProbabilityRule = _ARGMAX

    @property
    def version(self) -> str:
        """Baselines are versioned with the code."""
        return BASELINE_VERSION

    def score(self, batch: ScoringBatch) -> NDArray[np.float32]:
        """Raw score per option row."""
        raise NotImplementedError

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        """Score every option and apply the rule."""
        return decide_from_scores(self.name, self.score(batch), batch, self.rule, rng)


class RandomFeasible(_Baseline):
    """Uniform over feasible options: the no-information floor with full support."""

    name = "random-feasible"
    rule = ProbabilityRule(RuleKind.UNIFORM)

    def score(self, batch: ScoringBatch) -> NDArray[np.float32]:
        return np.full(len(batch.mask), np.nan, dtype=np.float32)


class FirstFit(_Baseline):
    """The first feasible option in Runtime's order."""

    name = "first-fit"

    def score(self, batch: ScoringBatch) -> NDArray[np.float32]:
        rows = np.arange(len(batch.mask), dtype=np.int64)
        return (-(rows - batch.offsets[:-1][batch.request_of_row])).astype(np.float32)


def _whole_left(request: MirrorRequest) -> NDArray[np.float64]:
    """Per entry: wholly free devices of its node left after taking its accelerators.

    Node counts as sent (``accelerators_free``) unless the sender gave devices,
    then the node's wholly free devices (free share 1).
    """
    o, s = request.options, request.state
    if s.has_devices:
        devices = node_devices(s)
        wholly = (devices.free_share >= 1.0).astype(np.float64)
        free = np.bincount(devices.node, weights=wholly, minlength=s.n_nodes).astype(np.float64)
    else:
        free = s.accelerators_free.astype(np.float64)
    left: NDArray[np.float64] = free[o.node_index] - o.accelerators
    return left


def _share_left(request: MirrorRequest) -> NDArray[np.float64]:
    """Per entry: the smallest free share any device of its node keeps after the job's share.

    Best fit on the device (the tightest device the share fits on); negative,
    the shortfall on the roomiest device, when none fits. A node without
    devices falls short by the whole share.
    """
    o, s, w = request.options, request.state, request.workload
    share = float(w.accelerator_share or 0.0)
    devices = node_devices(s)
    left = devices.free_share.astype(np.float64) - share
    nodes = np.asarray(o.node_index, dtype=np.int64)
    tightest = np.full(s.n_nodes, np.inf)
    np.minimum.at(tightest, devices.node, np.where(left >= 0, left, np.inf))
    roomiest = np.full(s.n_nodes, -share)
    np.maximum.at(roomiest, devices.node, left)
    entry: NDArray[np.float64] = np.where(
        np.isfinite(tightest[nodes]), tightest[nodes], roomiest[nodes]
    )
    return entry


class BestFit(_Baseline):
    """Tightest packing: fewest accelerators (or, for a share job, least device share) left."""

    name = "best-fit"

    def score(self, batch: ScoringBatch) -> NDArray[np.float32]:
        parts = []
        for request in batch.requests:
            o = request.options
            left = _share_left(request) if request.workload.is_share else _whole_left(request)
            # A node the option overfills ranks below every option that fits.
            left = np.where(left < 0, _OVERFILL - left, left)
            parts.append(-np.bincount(o.entry_option, weights=left, minlength=o.n_options))
        return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


class LeastLoaded(_Baseline):
    """Least busy nodes: low accelerator utilisation, short queues (contract features)."""

    name = "least-loaded"

    def score(self, batch: ScoringBatch) -> NDArray[np.float32]:
        f = batch.features
        return (-f[:, _UTILISATION] - 0.1 * f[:, _QUEUE]).astype(np.float32)


class ThroughputGreedy(_Baseline):
    """The option with the highest predicted median throughput."""

    name = "throughput-greedy"

    def __init__(self, predictor: Predictor) -> None:
        self.predictor = predictor

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        predictions = self.predictor.predict(batch)
        scores = predictions["throughput_q50"]
        return decide_from_scores(self.name, scores, batch, self.rule, rng, predictions)


class ProductionMirror:
    """What Runtime did, as a policy: the reference every candidate is compared with.

    It records production's choice even where Understudy's mask calls it
    infeasible (status ``infeasible_choice``, never ``all_infeasible``, which
    promises a certain defer): the log says what production did, and the
    disagreement with the mask is itself worth a reviewer's look.
    """

    name = "production-mirror"
    records_outside_decisions = True  # may put probability on a masked option (policies/base.py)

    @property
    def version(self) -> str:
        """Versioned with the code."""
        return BASELINE_VERSION

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        """One-hot on production's option (or defer); ERROR where it is unknown.

        The status follows the one rule for every policy (`decision_status`):
        ``infeasible_choice`` when production chose a masked option, else
        ``all_infeasible`` when nothing was feasible (production deferred), else ``ok``.
        """
        n_rows, n_req = len(batch.mask), batch.n_requests
        scores = np.full(n_rows, np.nan, dtype=np.float32)  # no favourite unless one is chosen
        probs = np.zeros(n_rows, dtype=np.float64)
        defer_p = np.zeros(n_req, dtype=np.float64)
        chosen = np.full(n_req, DEFER, dtype=np.int64)
        fav_infeasible = np.zeros(n_req, dtype=bool)
        status = []
        for r, request in enumerate(batch.requests):
            production = request.production
            if production is None:
                status.append(DecisionStatus.ERROR)
                continue
            start, end = int(batch.offsets[r]), int(batch.offsets[r + 1])
            mask = batch.mask[start:end]
            chosen[r] = production.option
            if production.option == DEFER:
                defer_p[r] = 1.0
            else:
                row = start + production.option
                scores[start:end] = 0.0
                scores[row] = 1.0
                probs[row] = 1.0
                # the raw-favourite flag's rule: only when something else was feasible
                fav_infeasible[r] = bool(mask.any()) and not batch.mask[row]
            status.append(decision_status(mask, probs[start:end]))
        return PolicyDecisions(
            scores=scores,
            probabilities=probs,
            defer_probability=defer_p,
            chosen=chosen,
            raw_favourite_infeasible=fav_infeasible,
            status=tuple(status),
        )


def builtin_baselines(predictor: Predictor | None = None) -> tuple[Policy, ...]:
    """Every baseline; throughput-greedy only when a predictor is given."""
    out: list[Policy] = [ProductionMirror(), RandomFeasible(), FirstFit(), BestFit(), LeastLoaded()]
    if predictor is not None:
        out.append(ThroughputGreedy(predictor))
    return tuple(out)
