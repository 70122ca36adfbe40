"""A policy wrapper that records what a rollout cannot see: errors, raw favourites, cost, latency.

`service.environment.on_policy` reports a policy's outcomes; the reliability
side of a comparison — how often it failed, how often its raw favourite was an
option the feasibility function masks, the constraint cost of what it chose,
how long it took — is read off its decisions on the way through. The wrapper
runs the policy through `decide_isolated` (the scorer's fence), so a policy
that raises gets status ``error`` and defers, exactly as in the service.

Counts are per request. ``raw_favourite_infeasible`` counts only requests
with at least one feasible option (as the service's metric does). Latency is
wall time and never enters ``results.json``.
"""

from __future__ import annotations

import numpy as np

from service.contract import CostSpec, check_feasibility
from service.policies.base import DecisionStatus, Policy, PolicyDecisions, ScoringBatch
from service.policies.runner import decide_isolated

_FAILED = (DecisionStatus.ERROR, DecisionStatus.TIMEOUT)


class Instrumented:
    """`policy` plus counters; the `Policy` protocol, so any driver can run it."""

    def __init__(self, policy: Policy, cost: CostSpec) -> None:
        self.policy = policy
        self.cost_spec = cost
        self.requests = 0
        self.with_choice = 0
        self.errors = 0
        self.raw_favourite_infeasible = 0
        self.cost = 0.0
        self.latency_s: list[float] = []

    @property
    def name(self) -> str:
        """The wrapped policy's name."""
        return self.policy.name

    @property
    def version(self) -> str:
        """The wrapped policy's version."""
        return self.policy.version

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        """Decide through the fence and count."""
        run = decide_isolated(self.policy, batch, rng)
        d = run.decisions
        self.latency_s.append(run.latency_s)
        for r in range(batch.n_requests):
            lo, hi = int(batch.offsets[r]), int(batch.offsets[r + 1])
            self.requests += 1
            self.errors += d.status[r] in _FAILED
            if batch.mask[lo:hi].any():
                self.with_choice += 1
                self.raw_favourite_infeasible += bool(d.raw_favourite_infeasible[r])
            c = int(d.chosen[r])
            if c >= 0 and not batch.mask[lo + c]:
                req = batch.requests[r]
                v = check_feasibility(req.state, req.workload, req.options).violations
                self.cost += float(self.cost_spec.evaluate(v[c : c + 1], ["none"])[0])
        return d
