"""The production emulator: the logging policy, a stochastic bin-packer with known propensities.

It plays Runtime's scheduler: hardware-oblivious best-fit packing, as many
production schedulers do. Per option,

    score = -max(idle - take, 0) / total - share_penalty * [idle < take]
            - spread_penalty * (servers - 1)

(a share job's entry takes 1 when its named device is wholly free, else 0
and shares: the same score a single-GPU job has always had here)

summed over the option's servers, where ``idle`` = GPUs with no job
(``round(total * (1 - utilisation))`` in the contract state) and ``total`` =
their GPUs. Fuller servers score higher (best fit keeps large holes for large
jobs); sharing a busy GPU is a last resort; spreading over servers is
penalised. The action distribution over feasible options is

- ``softmax``: ``p ∝ exp(score / temperature)`` — full support, the usual OPE setting;
- ``epsilon_greedy``: ``1 - epsilon`` on the best (ties split), ``epsilon`` uniform;
- ``deterministic``: all mass on the lowest-index best option (no overlap: OPE
  must say so rather than estimate).

It never defers while an option is feasible, and defers with probability 1
when none is. `packing_scores` is the single definition: the simulator's
fast path and the `Policy` path (`ProductionEmulator.decide`) both call it.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.contract import MirrorRequest
from service.environment.policy_kit import Distribution, assemble, first_best, greedy, softmax
from service.environment.scenario import EmulatorMode, ProductionConfig
from service.policies.base import PolicyDecisions, ScoringBatch


def packing_scores(
    offsets: NDArray[np.int64],
    node: NDArray[np.int32],
    take: NDArray[np.int32],
    idle: NDArray[np.float64],
    total: NDArray[np.float64],
    config: ProductionConfig,
    would_share: NDArray[np.bool_] | None = None,
) -> NDArray[np.float64]:
    """Best-fit score per option, shape ``(n_options,)``; CSR inputs as `PlacementOptions`.

    `idle` and `total` are per server, shape ``(n_nodes,)``. For a share job,
    `would_share` (per entry) says whether the entry's named device is partly
    taken: the entry then takes no idle GPU and shares (penalised), else it
    takes one idle GPU, as a single-GPU job always has in this score.
    """
    if len(node) == 0:
        return np.zeros(len(offsets) - 1)
    starts = offsets[:-1]
    t = take.astype(np.float64)
    if would_share is not None:
        t = np.where(would_share, 0.0, 1.0)
    idle_after = np.add.reduceat(np.maximum(idle[node] - t, 0.0), starts)
    sharing = (idle[node] < t) if would_share is None else would_share
    shares = np.add.reduceat(sharing.astype(np.float64), starts) > 0
    total_sum = np.add.reduceat(total[node], starts)
    servers = np.diff(offsets).astype(np.float64)
    out: NDArray[np.float64] = (
        -idle_after / np.maximum(total_sum, 1.0)
        - config.share_penalty * shares
        - config.spread_penalty * (servers - 1.0)
    )
    return out


def would_share(request: MirrorRequest) -> NDArray[np.bool_] | None:
    """Per entry of a share request, whether its named device is partly taken; else None."""
    o, s = request.options, request.state
    if not request.workload.is_share or not o.names_devices:
        return None
    named = np.diff(o.device_offsets) > 0
    first = np.minimum(o.device_offsets[:-1], max(len(o.device_index) - 1, 0))
    free = s.device_free_share[o.device_index[first]] if len(o.device_index) else np.ones(0)
    out: NDArray[np.bool_] = named & (free < 1.0)
    return out


def idle_from_state(
    total: NDArray[np.int32], utilisation: NDArray[np.float32]
) -> NDArray[np.float64]:
    """Idle GPUs per server as the contract state shows them: ``round(total * (1 - util))``."""
    t = total.astype(np.float64)
    out: NDArray[np.float64] = np.rint(t * (1.0 - utilisation.astype(np.float64)))
    return out


def emulator_distribution(
    scores: NDArray[np.float64], mask: NDArray[np.bool_], config: ProductionConfig
) -> Distribution:
    """The emulator's action distribution for one request."""
    if config.mode is EmulatorMode.SOFTMAX:
        return softmax(scores, mask, config.temperature)
    if config.mode is EmulatorMode.EPSILON_GREEDY:
        return greedy(scores, mask, config.epsilon)
    return first_best(scores, mask)


class ProductionEmulator:
    """The logging policy as a `Policy`; reads only the contract request (state + options)."""

    def __init__(self, config: ProductionConfig | None = None) -> None:
        self.config = config or ProductionConfig()

    @property
    def name(self) -> str:
        """Registry-style name."""
        return "production-emulator"

    @property
    def version(self) -> str:
        """Mode and knobs: a different configuration is a different policy."""
        c = self.config
        return (
            f"{c.mode.value}-t{c.temperature:g}-e{c.epsilon:g}"
            f"-share{c.share_penalty:g}-spread{c.spread_penalty:g}"
        )

    def scores(self, request: MirrorRequest) -> NDArray[np.float64]:
        """Packing scores of `request`'s options from its contract state."""
        o, s = request.options, request.state
        return packing_scores(
            o.node_offsets,
            o.node_index,
            o.accelerators,
            idle_from_state(s.accelerators_total, s.utilisation),
            s.accelerators_total.astype(np.float64),
            self.config,
            would_share(request),
        )

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        """Score, mask, and sample one action per request (one uniform each)."""
        return assemble(
            batch,
            rng,
            lambda req, _f, _m: self.scores(req),
            lambda s, m, _r: emulator_distribution(s, m, self.config),
        )
