"""The Policy interface: a batch of requests in, a decision per request out.

Policies are scored in micro-batches, so inputs are concatenated across the
batch in CSR form: request ``r`` owns rows ``offsets[r]:offsets[r + 1]`` of the
option arrays. A policy never sees infeasible options as choosable: it gets the
mask, returns raw scores for every option (so the reliability metric "raw
favourite was infeasible" can be computed) and probabilities that are zero on
masked options.

The action space per request is its options plus `DEFER`; the probability of
deferring is returned separately (``defer_probability``) so the option arrays
stay aligned with the features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from service.contract import MirrorRequest


class DecisionStatus(StrEnum):
    """Outcome of scoring one request with one policy: one vocabulary for every policy.

    What each value promises (docs/policies.md, "Statuses"; `check_policy`
    holds every policy to it, and `decision_status` is the rule itself):

    - ``ok``: some option is feasible, and all probability is on feasible
      options and defer.
    - ``all_infeasible``: no option is feasible, and the decision defers with
      probability 1.
    - ``infeasible_choice``: probability on an option the mask calls infeasible.
      Only a policy that records a decision made elsewhere may report it
      (``records_outside_decisions``; production-mirror, when Runtime chose an
      option Understudy's feasibility refuses); never `all_infeasible`, which
      always means a certain defer.
    - ``error``: no decision (no probability anywhere, `DEFER`); consumers skip it.
    - ``timeout``: a decision as above, made over the time budget.
    """

    OK = "ok"
    ALL_INFEASIBLE = "all_infeasible"
    INFEASIBLE_CHOICE = "infeasible_choice"
    ERROR = "error"
    TIMEOUT = "timeout"


def decision_status(mask: NDArray[np.bool_], probabilities: NDArray[np.float64]) -> DecisionStatus:
    """The status one request's decision has by the vocabulary's rule (not error/timeout).

    `mask` and `probabilities` are that request's rows. Mass on a masked option
    is `infeasible_choice` whether or not another option was feasible; otherwise
    `all_infeasible` exactly when no option is feasible.
    """
    if bool((probabilities[~mask] > 0).any()):
        return DecisionStatus.INFEASIBLE_CHOICE
    return DecisionStatus.OK if bool(mask.any()) else DecisionStatus.ALL_INFEASIBLE


@dataclass(frozen=True, eq=False)
class ScoringBatch:
    """Inputs for one micro-batch.

    Attributes:
        features: float32, shape ``(n_options_total, N_FEATURES)``.
        offsets: int64, shape ``(n_requests + 1,)``, CSR row offsets per request.
        mask: bool, shape ``(n_options_total,)``, True where the option is feasible.
        requests: the contract requests, for baselines that read raw state or
            production's decision; ONNX policies only read the arrays.
        feasibility_bits: uint16, shape ``(n_options_total,)``: per option, bit i
            set when ``SIGNALS[i]`` fired (`Feasibility.bits`), kept from the one
            feasibility pass that made `mask` so the decision log can store why an
            option was masked without checking it again; None when the batch was
            built without it (simulators, tests).
        feasibility_version: the feasibility function's version `feasibility_bits`
            were computed with ('' when there are none).
    """

    features: NDArray[np.float32]
    offsets: NDArray[np.int64]
    mask: NDArray[np.bool_]
    requests: Sequence[MirrorRequest]
    feasibility_bits: NDArray[np.uint16] | None = None
    feasibility_version: str = ""

    @property
    def n_requests(self) -> int:
        """Number of requests in the batch."""
        return len(self.offsets) - 1

    @property
    def request_of_row(self) -> NDArray[np.int64]:
        """Request index of every option row, shape ``(n_options_total,)``."""
        return np.repeat(np.arange(self.n_requests), np.diff(self.offsets))


@dataclass(frozen=True, eq=False)
class PolicyDecisions:
    """A policy's decisions for every request of a batch.

    Attributes:
        scores: float32, shape ``(n_options_total,)``, raw scores before masking
            (higher = preferred); NaN where the policy produces none.
        probabilities: float64, shape ``(n_options_total,)``, probability of
            each option; zero on infeasible options.
        defer_probability: float64, shape ``(n_requests,)``; per request,
            probabilities over its options plus this sum to 1.
        chosen: int64, shape ``(n_requests,)``, option index within the
            request (not the batch row), or ``DEFER`` (-1).
        raw_favourite_infeasible: bool, shape ``(n_requests,)``, whether the
            highest raw score was on a masked option.
        status: one `DecisionStatus` per request.
        predictions: optional predicted outcomes per option row, name -> array
            of shape ``(n_options_total,)`` (e.g. ``"throughput_q50"``).
    """

    scores: NDArray[np.float32]
    probabilities: NDArray[np.float64]
    defer_probability: NDArray[np.float64]
    chosen: NDArray[np.int64]
    raw_favourite_infeasible: NDArray[np.bool_]
    status: tuple[DecisionStatus, ...]
    predictions: dict[str, NDArray[np.float32]] | None = None


@runtime_checkable
class Policy(Protocol):
    """What the scorer, the simulator and offline replay call.

    A policy that records a decision made elsewhere rather than proposing one
    (production-mirror) sets the class attribute ``records_outside_decisions =
    True``; only such a policy may put probability on a masked option, and then
    says so with `DecisionStatus.INFEASIBLE_CHOICE`. It is read with `getattr`,
    so proposing policies need not declare it.
    """

    @property
    def name(self) -> str:
        """Registry name of the policy."""
        ...

    @property
    def version(self) -> str:
        """Version of the policy artifact or code."""
        ...

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        """Score every request of `batch` and sample (or pick) an action for each.

        `rng` makes stochastic policies reproducible: the same batch and seed
        give the same decisions.
        """
        ...
