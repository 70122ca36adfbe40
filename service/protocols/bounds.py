"""The range a protocol's reward and cost can take, for betting sequences.

Betting confidence sequences (Waudby-Smith & Ramdas 2023) need outcomes in a
known ``[lower, upper]``. A reward that weighs only bounded outcome fields
(`slo_met`, 0 or 1) has one; queue delay, throughput and completion time are
unbounded, so a reward weighing them has none and the evaluator falls back to
the asymptotic sequence (and says so). A cost is always bounded: each
constraint signal fires or not, and a job has one failure kind.
"""

from __future__ import annotations

from service.protocols.schema import Protocol

BOUNDED_FIELDS = {"slo_met": (0.0, 1.0)}
"""Outcome fields with a known range."""


def reward_bounds(protocol: Protocol) -> tuple[float, float] | None:
    """``(lower, upper)`` of the protocol's reward, or None when a weighed field is unbounded."""
    lo = hi = 0.0
    for name, w in protocol.reward.weights.items():
        if name not in BOUNDED_FIELDS:
            return None
        a, b = BOUNDED_FIELDS[name]
        lo += min(w * a, w * b)
        hi += max(w * a, w * b)
    return (lo, hi) if hi > lo else None


def cost_bounds(protocol: Protocol) -> tuple[float, float] | None:
    """``(lower, upper)`` of the protocol's cost (signals fire or not; one failure kind)."""
    signals = protocol.cost.signal_weights.values()
    failures = list(protocol.cost.failure_weights.values())
    lo = sum(min(0.0, w) for w in signals) + min([0.0, *failures])
    hi = sum(max(0.0, w) for w in signals) + max([0.0, *failures])
    return (lo, hi) if hi > lo else None
