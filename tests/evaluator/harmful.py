"""A harmful candidate built on a learned model, and a registry whose scorer honours the gate.

`SlowestThroughput` places each job on the option the learned Gavel
throughput predictor (``policies/gavel-throughput``, gradient-boosted
quantile trees exported to ONNX) predicts to be *slowest*: a learned model
turned against its purpose, so it is clearly worse than production at
meeting SLOs. None of the learned policies in ``policies/`` is known to be
harmful, so the end-to-end test constructs this one.

`gated_registry` wraps a registry so that the scorer's policy source
(``lambda: list(registry.policies.values())`` in the composition root)
leaves out what the `CandidateGate` halts — what the composition root does
with ``gate.active(...)`` once it is wired there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace

import numpy as np

from service.evaluator.candidate_gate import CandidateGate
from service.policies.base import Policy, PolicyDecisions, ScoringBatch
from service.policies.predictor import Predictor
from service.policies.probabilities import ProbabilityRule, RuleKind, decide_from_scores
from service.policies.registry import Registry

NAME = "slowest-throughput"
VERSION = "e2e-1"


class SlowestThroughput:
    """The option with the lowest predicted median throughput (module docstring)."""

    name = NAME
    version = VERSION
    rule = ProbabilityRule(RuleKind.ARGMAX)

    def __init__(self, predictor: Predictor) -> None:
        self.predictor = predictor

    def decide(self, batch: ScoringBatch, rng: np.random.Generator) -> PolicyDecisions:
        predictions = self.predictor.predict(batch)
        scores = (-predictions["throughput_q50"]).astype(np.float32)
        return decide_from_scores(self.name, scores, batch, self.rule, rng, predictions)


class _Gated(Mapping[str, Policy]):
    """A live view of `policies` without what `gate` halts."""

    def __init__(self, policies: Mapping[str, Policy], gate: CandidateGate) -> None:
        self._policies = policies
        self._gate = gate

    def __getitem__(self, name: str) -> Policy:
        policy = self._policies[name]
        if not self._gate.allows(policy):
            raise KeyError(name)
        return policy

    def __iter__(self) -> Iterator[str]:
        halted = self._gate.halted()
        return iter(
            [n for n, p in self._policies.items() if (str(p.name), str(p.version)) not in halted]
        )

    def __len__(self) -> int:
        return sum(1 for _ in self)


def gated_registry(registry: Registry, extra: Policy, gate: CandidateGate) -> Registry:
    """`registry` plus `extra`, its policies filtered through `gate`."""
    policies = {**registry.policies, str(extra.name): extra}
    return replace(registry, policies=_Gated(policies, gate))
