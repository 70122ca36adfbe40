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

from dataclasses import dataclass
from enum import StrEnum

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
