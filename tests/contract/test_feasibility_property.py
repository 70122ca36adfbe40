"""Acceptance (issue 22): feasibility-v2 equals a brute-force check, every option and signal.

The brute force below is written from the rule in docs/contract.md
("Feasibility"), not from the module: plain Python loops over every option,
every node entry and every device, sets instead of counts, its own copy of
the node-level shortcut ("node i has accelerators_total[i] devices of its
class, the first accelerators_free[i] wholly free with the class's memory,
the others taken"). It is compared with `check_feasibility` and with
`check_feasibility_batch` on thousands of random cases (tests/feasibility_cases.py):
shared and partitioned devices, sent or derived; whole-device, share and CPU
jobs; allow-lists, labels, quotas, drains; single nodes, gangs, named devices.
Comparisons are made in float32, as the contract's columns are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from service.contract import SIGNALS, check_feasibility
from service.contract.feasibility import FEASIBILITY_VERSION, check_feasibility_batch
from tests.feasibility_cases import FeasibilityCase, random_cases

N_CASES = 4000


@dataclass(frozen=True)
class Device:
    node: int
    cls: int
    free_share: float
    free_memory: float


def f32(x: float) -> float:
    """`x` as the contract's float32 columns hold it (comparisons happen in float32)."""
    return float(np.float32(x))


def devices_of(state) -> list[Device]:  # type: ignore[no-untyped-def]
    """Every device: as sent, or the node-level shortcut, one device at a time."""
    out: list[Device] = []
    if len(state.device_offsets):
        for node in range(state.n_nodes):
            for d in range(int(state.device_offsets[node]), int(state.device_offsets[node + 1])):
                out.append(
                    Device(
                        node,
                        int(state.device_hardware[d]),
                        float(state.device_free_share[d]),
                        float(state.device_free_memory_gb[d]),
                    )
                )
        return out
    for node in range(state.n_nodes):
        cls = int(state.node_hardware[node])
        memory = state.hardware[cls].accelerator_memory_gb
        for rank in range(max(int(state.accelerators_total[node]), 0)):
            if rank < int(state.accelerators_free[node]):
                out.append(Device(node, cls, 1.0, math.nan if memory is None else f32(memory)))
            else:
                out.append(Device(node, cls, 0.0, 0.0))
    return out


def brute_force(case: FeasibilityCase) -> list[set[str]]:
    """The signals that fire on each option, by the written rule."""
    state, w, options, quota = case
    devices = devices_of(state)
    names_devices = len(options.device_offsets) > 0

    def allowed(cls: int) -> bool:
        return not w.allowed_hardware or state.hardware[cls].name in w.allowed_hardware

    def compatible(d: int) -> bool:
        if not 0 <= d < len(devices):
            return False
        hw = state.hardware[devices[d].cls]
        has_accelerators = hw.accelerator_memory_gb is None or hw.accelerator_memory_gb > 0
        return allowed(devices[d].cls) and has_accelerators

    def memory_fits(d: int) -> bool:
        memory = devices[d].free_memory
        return math.isnan(memory) or memory >= f32(w.accelerator_memory_gb)

    out: list[set[str]] = []
    for o in range(options.n_options):
        fired: set[str] = set()
        entries = range(int(options.node_offsets[o]), int(options.node_offsets[o + 1]))
        total = 0
        for e in entries:
            node, k = int(options.node_index[e]), int(options.accelerators[e])
            total += k
            if names_devices:
                lo, hi = int(options.device_offsets[e]), int(options.device_offsets[e + 1])
                named = [int(options.device_index[j]) for j in range(lo, hi)]
                wrong_names = len(set(named)) != len(named) or any(
                    not 0 <= d < len(devices) or devices[d].node != node for d in named
                )
                candidates = named
            else:
                wrong_names = False
                candidates = [d for d in range(len(devices)) if devices[d].node == node]
            usable = [d for d in candidates if compatible(d)]
            if w.accelerator_share is not None:
                room = {d for d in usable if devices[d].free_share >= f32(w.accelerator_share)}
                memory = {d for d in usable if memory_fits(d)}
                if not room:
                    fired.add("accelerator_share")
                if not room & memory and (room or not memory):
                    fired.add("accelerator_memory")
                if k > 1 or len(entries) > 1 or (names_devices and len(named) > 1) or wrong_names:
                    fired.add("accelerator_count")
            elif k > 0:
                free = [d for d in usable if devices[d].free_share >= 1.0]
                fit = [d for d in free if memory_fits(d)]
                if len(free) < k or (names_devices and len(named) != k) or wrong_names:
                    fired.add("accelerator_count")
                if len(free) >= k and len(fit) < k:
                    fired.add("accelerator_memory")
            if w.accelerator_share is not None or k > 0:
                if not usable:
                    fired.add("hardware_compatibility")
            elif not allowed(int(state.node_hardware[node])):
                fired.add("hardware_compatibility")
            if float(state.cpu_free[node]) < f32(w.cpu_per_node):
                fired.add("cpu")
            if float(state.memory_free_gb[node]) < f32(w.memory_per_node_gb):
                fired.add("memory")
            if not w.affinity <= state.labels[node]:
                fired.add("affinity")
            if w.anti_affinity & state.labels[node]:
                fired.add("anti_affinity")
            if bool(state.draining[node]) or not bool(state.healthy[node]):
                fired.add("drain")
        if total < w.accelerators:
            fired.add("accelerator_count")
        used = w.accelerator_share if w.accelerator_share is not None else total
        if quota is not None and used > quota:
            fired.add("quota")
        out.append(fired)
    return out


def as_sets(violations: np.ndarray) -> list[set[str]]:
    return [{s.value for s, hit in zip(SIGNALS, row, strict=True) if hit} for row in violations]


@pytest.fixture(scope="module")
def cases() -> list[FeasibilityCase]:
    return random_cases(20261203, N_CASES)


@pytest.fixture(scope="module")
def expected(cases: list[FeasibilityCase]) -> list[list[set[str]]]:
    return [brute_force(c) for c in cases]


def test_the_cases_exercise_every_signal_and_both_outcomes(
    cases: list[FeasibilityCase], expected: list[list[set[str]]]
) -> None:
    """Guard against a generator that stopped producing the hard cases."""
    options = [s for per_case in expected for s in per_case]
    assert len(options) > 10_000
    for signal in SIGNALS:
        alone = sum(s == {signal.value} for s in options)
        assert alone >= 10, f"{signal.value} alone fired only {alone} times"
    assert sum(not s for s in options) > 1_000
    assert any(c[0].has_devices for c in cases) and any(not c[0].has_devices for c in cases)
    assert any(c[2].names_devices for c in cases)
    share_memory_only = sum(
        s == {"accelerator_memory"}
        for c, e in zip(cases, expected, strict=True)
        for s in e
        if c[1].is_share
    )
    assert share_memory_only >= 10


def test_per_request_form_equals_the_brute_force(
    cases: list[FeasibilityCase], expected: list[list[set[str]]]
) -> None:
    for i, (case, want) in enumerate(zip(cases, expected, strict=True)):
        f = check_feasibility(*case)
        assert f.version == FEASIBILITY_VERSION == "feasibility-v2"
        got = as_sets(f.violations)
        assert got == want, f"case {i}: " + "; ".join(
            f"option {o}: got {sorted(g)} want {sorted(x)}"
            for o, (g, x) in enumerate(zip(got, want, strict=True))
            if g != x
        )
        assert f.mask.tolist() == [not s for s in want]


def test_batched_form_equals_the_brute_force(
    cases: list[FeasibilityCase], expected: list[list[set[str]]]
) -> None:
    rng = np.random.default_rng(7)
    start = 0
    while start < len(cases):
        size = int(rng.integers(1, 64))
        batch = cases[start : start + size]
        want = [s for per_case in expected[start : start + size] for s in per_case]
        f = check_feasibility_batch(batch)
        assert as_sets(f.violations) == want, f"batch at case {start}"
        assert f.mask.tolist() == [not s for s in want]
        start += size
