"""`capacity` in a cost spec: the version-1 signal name, kept as a group over the v2 signals.

A protocol written for feasibility-v1 weighs ``capacity``; under v2 it means
"any of accelerator_count, accelerator_share, cpu, memory fired" and is
weighed once per option, however many of them fired. Every shipped protocol
and scenario must still parse.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from service.contract import SIGNALS, CostSpec, InvalidInput
from service.contract.feasibility import CAPACITY_GROUP, ConstraintSignal
from service.contract.reward import COST_SIGNALS
from service.protocols import load_protocol

ROOT = Path(__file__).resolve().parents[2]


def row(*signals: ConstraintSignal) -> np.ndarray:
    v = np.zeros(len(SIGNALS), dtype=bool)
    for s in signals:
        v[SIGNALS.index(s)] = True
    return v


def test_capacity_is_weighed_once_when_any_member_fires() -> None:
    spec = CostSpec({"capacity": 2.0, "accelerator_memory": 0.5, "cpu": 0.25})
    S = ConstraintSignal
    rows = np.stack(
        [
            row(),
            row(S.ACCELERATOR_COUNT),
            row(S.ACCELERATOR_SHARE),
            row(S.CPU),
            row(S.MEMORY),
            row(S.ACCELERATOR_COUNT, S.ACCELERATOR_SHARE, S.CPU, S.MEMORY),
            row(S.ACCELERATOR_MEMORY),  # not a member: v1's capacity never covered it
            row(S.DRAIN, S.QUOTA),
        ]
    )
    assert spec.signal_cost(rows).tolist() == [0.0, 2.0, 2.0, 2.25, 2.0, 2.25, 0.5, 0.0]
    assert spec.evaluate(rows, ["none"] * len(rows)).tolist() == spec.signal_cost(rows).tolist()
    assert set(CAPACITY_GROUP) == {S.ACCELERATOR_COUNT, S.ACCELERATOR_SHARE, S.CPU, S.MEMORY}


def test_signal_cost_keeps_the_leading_shape() -> None:
    spec = CostSpec({"capacity": 1.0, "drain": 3.0})
    v = np.zeros((2, 3, len(SIGNALS)), dtype=bool)
    v[1, 2, SIGNALS.index(ConstraintSignal.MEMORY)] = True
    v[0, 1, SIGNALS.index(ConstraintSignal.DRAIN)] = True
    assert spec.signal_cost(v).tolist() == [[0.0, 3.0, 0.0], [0.0, 0.0, 1.0]]


def test_every_signal_and_the_group_are_accepted_and_nothing_else() -> None:
    assert (*(s.value for s in SIGNALS), "capacity") == COST_SIGNALS
    CostSpec({name: 1.0 for name in COST_SIGNALS})
    with pytest.raises(InvalidInput, match=r"cost\.signal_weights\.capacity_v1"):
        CostSpec({"capacity_v1": 1.0})


@pytest.mark.parametrize("path", sorted((ROOT / "protocols").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_protocols_still_parse_with_capacity(path: Path) -> None:
    protocol = load_protocol(path)
    assert set(protocol.cost.signal_weights) <= set(COST_SIGNALS)
