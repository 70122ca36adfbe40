"""Reference policies the simulator's tests and reports run: small, obvious, contract-only.

These implement the `Policy` protocol and read only what a mirrored request
carries, so they stand in for (and can be swapped for) the baselines in
`service.policies`:

- `ThroughputAware` knows Gavel's measurements (as Gavel's scheduler does)
  and picks the option with the highest expected steps/s: the consolidated or
  spread rate of the job's type on the option's class, times the mean pair
  ratio when the placement would share a GPU (a whole-GPU job never does now;
  a share job does when the device its option names is partly taken; it
  cannot see with whom). Ties go to the fuller server, then the lower index.
- `LeastLoaded` picks the option whose servers have the lowest mean
  utilisation (feature ``utilisation``), ties split evenly.
- `RandomFeasible` is uniform over feasible options.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from service.contract import FEATURE_NAMES, MirrorRequest
from service.environment.data import SCALE_FACTORS, ThroughputTable
from service.environment.emulator import idle_from_state, packing_scores
from service.environment.policy_kit import TIE_TOLERANCE, Distribution, assemble, greedy
from service.environment.scenario import ProductionConfig
from service.policies.base import PolicyDecisions, ScoringBatch

_UTILISATION = FEATURE_NAMES.index("utilisation")
_BEST_FIT = ProductionConfig(share_penalty=0.0, spread_penalty=0.0)


class ThroughputAware:
    """Highest expected measured throughput; deterministic."""

    def __init__(self, table: ThroughputTable) -> None:
        self.table = table
        self._pair_ratio = table.mean_pair_ratio()

    @property
    def name(self) -> str:
        """Registry-style name."""
        return "throughput-aware"

    @property
    def version(self) -> str:
        """Code version."""
        return "1"

    def expected_rate(self, request: MirrorRequest) -> NDArray[np.float64]:
        """Expected steps/s per option, shape ``(n_options,)``; 0 where nothing was measured."""
        w, s, o = request.workload, request.state, request.options
        out = np.zeros(o.n_options)
        gpus = 1 if w.is_share else w.accelerators
        if w.model_family not in self.table.job_types or gpus not in SCALE_FACTORS:
            return out
        t = self.table.type_index(w.model_family)
        sf = SCALE_FACTORS.index(gpus)
        if w.is_share:
            return self._share_rate(request, t)
        idle = idle_from_state(s.accelerators_total, s.utilisation)
        for i in range(o.n_options):
            nodes = o.nodes_of(i)
            name = s.hardware_of(int(nodes[0])).name
            if name not in self.table.classes:
                continue
            c = self.table.class_index(name)
            rate = self.table.isolated[t, sf, c, int(len(nodes) == 1)]
            lo = int(o.node_offsets[i])
            shares = bool(np.any(idle[nodes] < o.accelerators[lo : lo + len(nodes)]))
            if shares and w.accelerators == 1:
                rate *= self._pair_ratio[t, c]
            out[i] = float(np.nan_to_num(rate))
        return out

    def _share_rate(self, request: MirrorRequest, t: int) -> NDArray[np.float64]:
        """A share job: alone rate on the named device's class, times the mean pair
        ratio when that device is partly taken (free share below 1)."""
        s, o = request.state, request.options
        out = np.zeros(o.n_options)
        if not o.names_devices:
            return out
        for i in range(o.n_options):
            lo, hi = int(o.device_offsets[i]), int(o.device_offsets[i + 1])
            if hi == lo:
                continue
            d = int(o.device_index[lo])
            name = s.hardware[int(s.device_hardware[d])].name
            if name not in self.table.classes:
                continue
            c = self.table.class_index(name)
            rate = self.table.isolated[t, 0, c, 1]
            if s.device_free_share[d] < 1.0:
                rate *= self._pair_ratio[t, c]
            out[i] = float(np.nan_to_num(rate))
        return out

    def _distribution(
        self, rate: NDArray[np.float64], mask: NDArray[np.bool_], request: MirrorRequest
    ) -> Distribution:
        probs = np.zeros(len(rate))
        if not mask.any():
            return probs, 1.0
        top = mask & (rate >= np.max(rate[mask]) * (1.0 - TIE_TOLERANCE))
        o, s = request.options, request.state
        fit = packing_scores(
            o.node_offsets,
            o.node_index,
            o.accelerators,
            idle_from_state(s.accelerators_total, s.utilisation),
            s.accelerators_total.astype(np.float64),
            _BEST_FIT,
        )
        fit = np.where(top, fit, -np.inf)
        probs[int(np.argmax(fit))] = 1.0
        return probs, 0.0

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        """Pick the fastest feasible option per request."""
        return assemble(batch, rng, lambda r, _f, _m: self.expected_rate(r), self._distribution)


class LeastLoaded:
    """Lowest mean utilisation of the option's servers; ties split evenly."""

    @property
    def name(self) -> str:
        """Registry-style name."""
        return "least-loaded"

    @property
    def version(self) -> str:
        """Code version."""
        return "1"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        """Sample among the least-utilised feasible options."""
        return assemble(
            batch,
            rng,
            lambda _r, f, _m: -f[:, _UTILISATION].astype(np.float64),
            lambda s, m, _r: greedy(s, m),
        )


class RandomFeasible:
    """Uniform over feasible options."""

    @property
    def name(self) -> str:
        """Registry-style name."""
        return "random-feasible"

    @property
    def version(self) -> str:
        """Code version."""
        return "1"

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        """Sample uniformly among feasible options."""
        return assemble(
            batch, rng, lambda _r, f, _m: np.zeros(len(f)), lambda s, m, _r: greedy(s, m)
        )
