"""The versioned feasibility function: which options may be taken, and why not.

Safety is not a reward term. Each constraint is an explicit signal; an option
is feasible only when none fires. Policies see the mask and must not choose a
masked option; how often a policy's raw favourite was masked is itself a
reliability metric.

Rules (version `FEASIBILITY_VERSION`), per node entry of an option, then OR-ed
over the option's nodes:

- ``capacity``: accelerators taken > accelerators free, host CPU or memory
  short of the workload's per-node need, or the option's accelerators in total
  fewer than requested.
- ``accelerator_memory``: the class's per-accelerator memory below the need.
- ``hardware_compatibility``: class not in the workload's allowed list, or an
  accelerator job on a class without accelerators.
- ``affinity``: a node lacks a label the workload requires.
- ``anti_affinity``: a node carries a label the workload forbids.
- ``quota``: the option's accelerators exceed the tenant's remaining quota.
- ``drain``: a node is draining or unhealthy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract.actions import PlacementOptions
from service.contract.state import ClusterState
from service.contract.workload import Workload

FEASIBILITY_VERSION = "feasibility-v1"


class ConstraintSignal(StrEnum):
    """A named reason an option is infeasible; column order of `Feasibility.violations`."""

    CAPACITY = "capacity"
    ACCELERATOR_MEMORY = "accelerator_memory"
    HARDWARE_COMPATIBILITY = "hardware_compatibility"
    AFFINITY = "affinity"
    ANTI_AFFINITY = "anti_affinity"
    QUOTA = "quota"
    DRAIN = "drain"


SIGNALS: tuple[ConstraintSignal, ...] = tuple(ConstraintSignal)


_BIT_WEIGHTS = (1 << np.arange(len(SIGNALS), dtype=np.uint16)).astype(np.uint16)


def bits_of(violations: NDArray[np.bool_]) -> NDArray[np.uint16]:
    """Pack ``(n_options, len(SIGNALS))`` violations into one uint16 per option."""
    v = np.asarray(violations, dtype=bool).reshape(-1, len(SIGNALS))
    packed: NDArray[np.uint16] = (v.astype(np.uint16) * _BIT_WEIGHTS).sum(axis=1, dtype=np.uint16)
    return packed


def violations_of(bits: NDArray[np.integer[Any]]) -> NDArray[np.bool_]:
    """Unpack per-option bits into ``(n_options, len(SIGNALS))`` violations."""
    b = np.asarray(bits, dtype=np.uint16).reshape(-1, 1)
    out: NDArray[np.bool_] = (b & _BIT_WEIGHTS) != 0
    return out


def signals_of(bits: int) -> tuple[ConstraintSignal, ...]:
    """The signals one option's bitmask names, in `SIGNALS` order."""
    return tuple(s for i, s in enumerate(SIGNALS) if bits >> i & 1)


@dataclass(frozen=True, eq=False)
class Feasibility:
    """Per-option feasibility.

    Attributes:
        mask: bool, shape ``(n_options,)``, True where the option may be taken.
        violations: bool, shape ``(n_options, len(SIGNALS))``, True where a signal fired.
        version: the feasibility function's version.
    """

    mask: NDArray[np.bool_]
    violations: NDArray[np.bool_]
    version: str = FEASIBILITY_VERSION

    def failed(self, option: int) -> tuple[ConstraintSignal, ...]:
        """The signals that made `option` infeasible (empty if feasible)."""
        return tuple(s for s, hit in zip(SIGNALS, self.violations[option], strict=True) if hit)

    @property
    def bits(self) -> NDArray[np.uint16]:
        """Per-option bitmask, shape ``(n_options,)``: bit i set when ``SIGNALS[i]`` fired.

        The compact form the decision log keeps once per request (migration 0010).
        """
        return bits_of(self.violations)

    @property
    def any_feasible(self) -> bool:
        """Whether at least one option may be taken."""
        return bool(self.mask.any())


def _node_label_rules(
    state: ClusterState, workload: Workload
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Per-node affinity and anti-affinity violations (a loop over nodes, not options)."""
    affinity_bad = np.zeros(state.n_nodes, dtype=bool)
    anti_bad = np.zeros(state.n_nodes, dtype=bool)
    if workload.affinity or workload.anti_affinity:
        for i, labels in enumerate(state.labels):
            affinity_bad[i] = not workload.affinity <= labels
            anti_bad[i] = bool(workload.anti_affinity & labels)
    return affinity_bad, anti_bad


def _class_rules(
    state: ClusterState, workload: Workload
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Per-hardware-class memory and compatibility violations."""
    memory_bad = np.array(
        [
            workload.accelerators > 0 and h.accelerator_memory_gb < workload.accelerator_memory_gb
            for h in state.hardware
        ],
        dtype=bool,
    )
    compat_bad = np.array(
        [
            (bool(workload.allowed_hardware) and h.name not in workload.allowed_hardware)
            or (workload.accelerators > 0 and not h.has_accelerators)
            for h in state.hardware
        ],
        dtype=bool,
    )
    return memory_bad, compat_bad


def check_feasibility(
    state: ClusterState,
    workload: Workload,
    options: PlacementOptions,
    quota_remaining: float | None = None,
) -> Feasibility:
    """Evaluate every constraint signal for every option, vectorised over node entries."""
    nodes = options.node_index
    taken = options.accelerators
    entry_option = options.entry_option
    n_options = options.n_options

    memory_bad_cls, compat_bad_cls = _class_rules(state, workload)
    affinity_bad, anti_bad = _node_label_rules(state, workload)
    node_cls = state.node_hardware[nodes]

    entry_capacity = (
        (taken > state.accelerators_free[nodes])
        | (state.cpu_free[nodes] < workload.cpu_per_node)
        | (state.memory_free_gb[nodes] < workload.memory_per_node_gb)
    )
    entry_memory = memory_bad_cls[node_cls] & (taken > 0) if len(nodes) else np.zeros(0, bool)
    entry_compat = compat_bad_cls[node_cls] if len(nodes) else np.zeros(0, bool)
    entry_drain = state.draining[nodes] | ~state.healthy[nodes]

    def any_per_option(entry: NDArray[np.bool_]) -> NDArray[np.bool_]:
        counts = np.bincount(entry_option, weights=entry.astype(np.float64), minlength=n_options)
        return counts > 0

    option_total = np.bincount(entry_option, weights=taken.astype(np.float64), minlength=n_options)
    capacity = any_per_option(entry_capacity) | (option_total < workload.accelerators)
    quota = (
        option_total > quota_remaining
        if quota_remaining is not None
        else np.zeros(n_options, dtype=bool)
    )
    violations = np.stack(
        [
            capacity,
            any_per_option(entry_memory),
            any_per_option(entry_compat),
            any_per_option(affinity_bad[nodes]),
            any_per_option(anti_bad[nodes]),
            quota,
            any_per_option(entry_drain),
        ],
        axis=1,
    )
    mask = np.logical_not(violations.any(axis=1))
    return Feasibility(mask=mask, violations=violations)


FeasibilityItem = tuple[ClusterState, Workload, PlacementOptions, float | None]
"""One request's (state, workload, options, quota_remaining)."""


def _batchable(items: Sequence[FeasibilityItem]) -> bool:
    """Whether one pass reproduces every request's own comparisons exactly.

    Host CPU and memory are compared in the state's own float precision (a
    Python number against a float32 column compares in float32), so the
    batched pass needs one floating dtype per column across the batch, as
    the wire delivers it; a hand-built mix is checked request by request.
    """
    dtypes = {
        (
            s.cpu_free.dtype,
            s.memory_free_gb.dtype,
            s.node_hardware.dtype,
            s.accelerators_free.dtype,
            s.healthy.dtype,
            s.draining.dtype,
            o.accelerators.dtype,
        )
        for s, _, o, _ in items
    }
    if len(dtypes) != 1:
        return False
    cpu, memory, *_ = dtypes.pop()
    return bool(np.issubdtype(cpu, np.floating) and np.issubdtype(memory, np.floating))


def _stacked(parts: Sequence[Feasibility]) -> Feasibility:
    return Feasibility(
        mask=np.concatenate([p.mask for p in parts]),
        violations=np.concatenate([p.violations for p in parts]).reshape(-1, len(SIGNALS)),
    )


def _as_float(values: list[float], dtype: np.dtype[Any] | None) -> NDArray[Any]:
    """Python numbers as the comparison with a `dtype` column sees them (cast to `dtype`)."""
    wide = np.array(values, dtype=np.float64)
    if dtype is None:
        return wide
    with np.errstate(over="ignore"):  # an overflowing need falls back to the per-request form
        return wide.astype(dtype)


def check_feasibility_batch(items: Sequence[FeasibilityItem]) -> Feasibility:
    """`check_feasibility` of every request, stacked: one row per option of the batch.

    Bit for bit the per-request masks and violations (tests/policies/
    test_batch_equivalence.py): every rule is a comparison or a boolean OR,
    evaluated on the same values in the same precision, only over the joined
    arrays of the whole micro-batch instead of once per request. Rules that
    read Python objects (classes, labels) still run per hardware class and
    per labelled node, as in `check_feasibility`.
    """
    if not items:
        return Feasibility(np.zeros(0, dtype=bool), np.zeros((0, len(SIGNALS)), dtype=bool))
    if not _batchable(items):
        return _stacked([check_feasibility(*item) for item in items])
    states = [i[0] for i in items]
    options = [i[2] for i in items]
    n_req = len(items)
    n_nodes = np.fromiter((len(s.node_hardware) for s in states), np.int64, n_req)
    n_entries = np.fromiter((len(o.node_index) for o in options), np.int64, n_req)
    n_options = np.fromiter((o.n_options for o in options), np.int64, n_req)
    n_hw = np.fromiter((len(s.hardware) for s in states), np.int64, n_req)
    request_of_entry = np.repeat(np.arange(n_req), n_entries)
    nodes = np.concatenate([o.node_index for o in options], dtype=np.int64)
    nodes += (np.cumsum(n_nodes) - n_nodes)[request_of_entry]
    per_option = np.concatenate([o.nodes_per_option for o in options], dtype=np.int64)
    n_total = int(n_options.sum())
    entry_option = np.repeat(np.arange(n_total), per_option)

    memory_bad: list[bool] = []
    compat_bad: list[bool] = []
    affinity_bad = np.zeros(int(n_nodes.sum()), dtype=bool)
    anti_bad = np.zeros(int(n_nodes.sum()), dtype=bool)
    base = 0
    for state, workload, _, _ in items:
        memory, compat = _class_rules(state, workload)
        memory_bad += memory.tolist()
        compat_bad += compat.tolist()
        if workload.affinity or workload.anti_affinity:
            affinity, anti = _node_label_rules(state, workload)
            affinity_bad[base : base + state.n_nodes] = affinity
            anti_bad[base : base + state.n_nodes] = anti
        base += state.n_nodes
    cls = np.concatenate([s.node_hardware for s in states], dtype=np.int64)[nodes]
    cls += (np.cumsum(n_hw) - n_hw)[request_of_entry]

    def joined(column: str) -> NDArray[Any]:
        values: NDArray[Any] = np.concatenate([getattr(s, column) for s in states])[nodes]
        return values

    cpu_free, memory_free = joined("cpu_free"), joined("memory_free_gb")
    workloads = [i[1] for i in items]
    cpu_need = _as_float([w.cpu_per_node for w in workloads], cpu_free.dtype)
    memory_need = _as_float([w.memory_per_node_gb for w in workloads], memory_free.dtype)
    if not (np.isfinite(cpu_need).all() and np.isfinite(memory_need).all()):
        return _stacked([check_feasibility(*item) for item in items])
    taken = np.concatenate([o.accelerators for o in options])
    entry_capacity = (
        (taken > joined("accelerators_free"))
        | (cpu_free < cpu_need[request_of_entry])
        | (memory_free < memory_need[request_of_entry])
    )
    entry_memory = np.array(memory_bad, dtype=bool)[cls] & (taken > 0)
    entry_compat = np.array(compat_bad, dtype=bool)[cls]
    entry_drain = joined("draining") | ~joined("healthy")

    def any_per_option(entry: NDArray[np.bool_]) -> NDArray[np.bool_]:
        counts = np.bincount(entry_option, weights=entry.astype(np.float64), minlength=n_total)
        return counts > 0

    option_total = np.bincount(entry_option, weights=taken.astype(np.float64), minlength=n_total)
    requested = _as_float([w.accelerators for w in workloads], None)
    quotas = [i[3] for i in items]
    has_quota = np.array([q is not None for q in quotas], dtype=bool)
    quota = _as_float([q if q is not None else 0.0 for q in quotas], None)
    violations = np.stack(
        [
            any_per_option(entry_capacity) | (option_total < np.repeat(requested, n_options)),
            any_per_option(entry_memory),
            any_per_option(entry_compat),
            any_per_option(affinity_bad[nodes]),
            any_per_option(anti_bad[nodes]),
            (option_total > np.repeat(quota, n_options)) & np.repeat(has_quota, n_options),
            any_per_option(entry_drain),
        ],
        axis=1,
    )
    return Feasibility(mask=np.logical_not(violations.any(axis=1)), violations=violations)
