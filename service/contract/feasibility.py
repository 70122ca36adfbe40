"""The versioned feasibility function: which options may be taken, and why not.

Safety is not a reward term. Each constraint is an explicit signal; an option
is feasible only when none fires. Policies see the mask and must not choose a
masked option; how often a policy's raw favourite was masked is itself a
reliability metric.

Rules (version `FEASIBILITY_VERSION`, docs/contract.md "Feasibility"). Devices
are read only through `service.contract.devices.node_devices`, so sent devices
and the node-level shortcut are treated alike. Per node entry of an option
(node n, k = the entry's ``accelerators``), D = the devices the entry names
(``options.device_offsets``) or, when options name none, every device of n;
C = the devices of D whose class is allowed (an empty ``allowed_hardware``
allows every class) and has accelerators (a partition is a device with its own
class, so compatibility is judged per device). "Memory fits" means the
device's free memory >= ``accelerator_memory_gb``; an unknown (NaN) free
memory fits.

Whole-device job (``accelerator_share`` None), entry with k > 0:
  W = the wholly free devices of C (free share >= 1), M = those of W whose
  memory fits.

- ``accelerator_count``: |W| < k; or named devices whose number != k, one
  not on n, or one named twice; or the option's k in total < the workload's
  ``accelerators``.
- ``accelerator_memory``: |W| >= k and |M| < k.

Share job (``accelerator_share`` set, every entry; k is 0 or 1):
  S = devices of C with free share >= the share, Mm = devices of C whose
  memory fits.

- ``accelerator_share``: S is empty.
- ``accelerator_memory``: S ∩ Mm is empty, and S is non-empty or Mm is empty
  (a device with room for both is what the job needs; memory is named when
  it is what is missing).
- ``accelerator_count``: k > 1, the option has more than one node entry, or
  the entry names more than one device, one not on n, or one twice.

Every job:

- ``hardware_compatibility``: an accelerator entry (k > 0, or any entry of a
  share job) has C empty; an entry without accelerators is on a node whose
  own class is not allowed.
- ``cpu`` / ``memory``: the node's free host CPU / memory < the per-node need.
- ``affinity``: a node lacks a label the workload requires.
- ``anti_affinity``: a node carries a label the workload forbids.
- ``quota``: the option's whole accelerators (sum of k; for a share job, the
  share) > the tenant's ``quota_remaining``.
- ``drain``: a node is draining or unhealthy.

Entry signals are OR-ed over the option's entries (a gang is infeasible if any
member is). Protocols may still weigh the version-1 name ``capacity``: a
group, "any of accelerator_count, accelerator_share, cpu, memory fired"
(`CAPACITY_GROUP`, applied by `service.contract.reward.CostSpec`).

One implementation serves both forms: `check_feasibility` is the batch pass
over one request, so the two are bit-identical by construction. Host CPU and
memory are compared per request in that state's own precision; device share
and memory (float32 for every request) once for the batch against each
need cast to float32; what follows is integer counting and boolean logic:
per node, how many of its devices fall in each set above; per entry that
names devices, the same over those devices; ORs over an option's entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
from numpy.typing import NDArray

from service.contract.actions import PlacementOptions
from service.contract.devices import node_devices
from service.contract.state import ClusterState
from service.contract.workload import Workload

FEASIBILITY_VERSION = "feasibility-v2"


class ConstraintSignal(StrEnum):
    """A named reason an option is infeasible; column order of `Feasibility.violations`."""

    ACCELERATOR_COUNT = "accelerator_count"
    ACCELERATOR_SHARE = "accelerator_share"
    ACCELERATOR_MEMORY = "accelerator_memory"
    CPU = "cpu"
    MEMORY = "memory"
    HARDWARE_COMPATIBILITY = "hardware_compatibility"
    AFFINITY = "affinity"
    ANTI_AFFINITY = "anti_affinity"
    QUOTA = "quota"
    DRAIN = "drain"


SIGNALS: tuple[ConstraintSignal, ...] = tuple(ConstraintSignal)

CAPACITY = "capacity"
"""The version-1 signal name, still accepted where a protocol weighs signals (a group)."""

CAPACITY_GROUP: tuple[ConstraintSignal, ...] = (
    ConstraintSignal.ACCELERATOR_COUNT,
    ConstraintSignal.ACCELERATOR_SHARE,
    ConstraintSignal.CPU,
    ConstraintSignal.MEMORY,
)
"""What ``capacity`` means in a cost spec: any of these fired (weighed once per option)."""


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


FeasibilityItem = tuple[ClusterState, Workload, PlacementOptions, float | None]
"""One request's (state, workload, options, quota_remaining)."""


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
    """Per hardware class: allowed by the workload, and offering accelerators at all."""
    allowed = workload.allowed_hardware
    return (
        np.array([not allowed or h.name in allowed for h in state.hardware], dtype=bool),
        np.array([h.has_accelerators for h in state.hardware], dtype=bool),
    )


# Columns of the per-node and per-device boolean tables `_batch` builds.
_CPU_SHORT, _MEMORY_SHORT, _CLASS_REFUSED, _AFFINITY, _ANTI_AFFINITY, _DRAINED = range(6)
_COMPATIBLE, _AVAILABLE, _AVAILABLE_FITS, _COMPATIBLE_FITS = range(4)


@dataclass(frozen=True, eq=False)
class _Batch:
    """Per-request columns of a batch, joined (one request: its own arrays, no copy).

    Every comparison of a request's columns with its workload's numbers is
    made in that request's precision (`_batch`), so both forms compare the
    same values the same way. Devices stay in CSR order over the joined
    nodes; the device tables end with one sentinel device (on no node,
    fitting nothing) that an invalid named device index points at.
    """

    node_rules: NDArray[np.bool_]  # (n_nodes, 6): the columns above
    device_sets: NDArray[np.bool_]  # (n_devices + 1, 4): the sets `_device_sets` names
    device_node: NDArray[np.int64]  # (n_devices + 1,), -1 for the sentinel
    devices_per_node: NDArray[np.int64]  # (n_nodes,)
    nodes: NDArray[np.int64]  # per entry, global node
    taken: NDArray[np.int64]  # per entry
    named_lengths: NDArray[np.int64]  # per entry of a request naming devices
    named_source: NDArray[np.int64]  # the devices those entries name; -1 = no such device
    per_option: NDArray[np.int64]  # entries per option
    entries: NDArray[np.int64]  # per request
    options: NDArray[np.int64]  # per request
    named: NDArray[np.bool_]  # per request
    share: NDArray[np.float64]  # per request, NaN = whole-device job
    requested: NDArray[np.float64]  # per request
    quota: NDArray[np.float64]  # per request, NaN = none


def _join(parts: list[NDArray[Any]], dtype: Any) -> NDArray[Any]:
    if len(parts) == 1:
        return np.asarray(parts[0], dtype=dtype)
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _batch(items: Sequence[FeasibilityItem]) -> _Batch:
    """The joined columns of `items` (see `_Batch`).

    Host CPU and memory are compared per request (their columns' precision
    may differ between requests); device columns are float32 whatever the
    request (`node_devices`), so a device's share and memory are compared
    once for the batch, against each request's need cast to float32 — what
    a Python number against a float32 column compares as.
    """
    cpu_short, memory_short, node_class, draining, healthy = [], [], [], [], []
    class_allowed, class_usable, labelled = [], [], []
    device_class, free_share, free_memory, device_node, per_node = [], [], [], [], []
    nodes, taken, named_lengths, named_source, per_option, n_devices = [], [], [], [], [], []
    node_base = dev_base = class_base = 0
    with np.errstate(over="ignore"):  # a need beyond float32 is a shortfall (inf)
        for state, workload, options, _ in items:
            devices = node_devices(state)
            allowed, accelerators = _class_rules(state, workload)
            class_allowed.append(allowed)
            class_usable.append(allowed & accelerators)
            cpu_short.append(state.cpu_free < workload.cpu_per_node)
            memory_short.append(state.memory_free_gb < workload.memory_per_node_gb)
            node_class.append(np.asarray(state.node_hardware, dtype=np.int64) + class_base)
            draining.append(state.draining)
            healthy.append(state.healthy)
            if workload.affinity or workload.anti_affinity:
                labelled.append((node_base, state, workload))
            device_class.append(devices.hardware.astype(np.int64) + class_base)
            free_share.append(devices.free_share)
            free_memory.append(devices.free_memory_gb)
            device_node.append(devices.node + node_base)
            per_node.append(np.diff(devices.offsets))
            n_devices.append(devices.n_devices)
            nodes.append(np.asarray(options.node_index, dtype=np.int64) + node_base)
            taken.append(options.accelerators)
            if options.names_devices:
                offsets = np.asarray(options.device_offsets, dtype=np.int64)
                named = np.asarray(options.device_index, dtype=np.int64)
                named = named[offsets[0] : offsets[-1]]
                valid = (named >= 0) & (named < devices.n_devices)
                named_lengths.append(np.diff(offsets))
                named_source.append(np.where(valid, named + dev_base, -1))
            per_option.append(options.nodes_per_option)
            node_base += state.n_nodes
            dev_base += devices.n_devices
            class_base += len(state.hardware)

        def each(value: Any, dtype: Any) -> NDArray[Any]:
            return np.fromiter(map(value, items), dtype=dtype, count=len(items))

        share = each(
            lambda i: np.nan if i[1].accelerator_share is None else i[1].accelerator_share,
            np.float64,
        )
        # Available = free share >= 1 for a whole-device job, >= the share for a share job.
        threshold = np.where(np.isnan(share), 1.0, share).astype(np.float32)
        need = each(lambda i: i[1].accelerator_memory_gb, np.float64).astype(np.float32)
    per_device = np.asarray(n_devices, dtype=np.int64)
    affinity = np.zeros(node_base, dtype=bool)
    anti = np.zeros(node_base, dtype=bool)
    for base, state, workload in labelled:
        affinity[base : base + state.n_nodes], anti[base : base + state.n_nodes] = (
            _node_label_rules(state, workload)
        )
    node_rules = np.stack(
        [
            _join(cpu_short, bool),
            _join(memory_short, bool),
            ~_join(class_allowed, bool)[_join(node_class, np.int64)],
            affinity,
            anti,
            _join(draining, bool) | ~_join(healthy, bool),
        ],
        axis=1,
    )
    device_sets = _device_sets(
        _join(class_usable, bool)[_join(device_class, np.int64)],
        _join(free_share, np.float32) >= np.repeat(threshold, per_device),
        # Unknown (NaN) free memory fits: NaN < need is False.
        ~(_join(free_memory, np.float32) < np.repeat(need, per_device)),
    )
    return _Batch(
        node_rules=node_rules,
        device_sets=np.concatenate([device_sets, np.zeros((1, 4), dtype=bool)]),
        device_node=np.concatenate([_join(device_node, np.int64), [-1]]),
        devices_per_node=_join(per_node, np.int64),
        nodes=_join(nodes, np.int64),
        taken=_join(taken, np.int64),
        named_lengths=_join(named_lengths, np.int64),
        named_source=_join(named_source, np.int64),
        per_option=_join(per_option, np.int64),
        entries=each(lambda i: len(i[2].node_index), np.int64),
        options=each(lambda i: i[2].n_options, np.int64),
        named=each(lambda i: i[2].names_devices, bool),
        share=share,
        requested=each(lambda i: i[1].accelerators, np.float64),
        quota=each(lambda i: np.nan if i[3] is None else i[3], np.float64),
    )


def _segment_sums(values: NDArray[Any], lengths: NDArray[np.int64]) -> NDArray[Any]:
    """Column sums over consecutive row segments of `lengths` rows each (empty ones: 0).

    Flags are summed in int32 (fewer than 2**31 devices or entries); integer
    columns (accelerators taken) in int64, so no total can wrap.
    """
    dtype = np.int32 if values.dtype == np.bool_ else np.int64
    totals = np.zeros((len(values) + 1, values.shape[1]), dtype=dtype)
    np.cumsum(values, axis=0, dtype=dtype, out=totals[1:])
    ends = np.cumsum(lengths)
    sums: NDArray[Any] = totals[ends] - totals[ends - lengths]
    return sums


def _device_sets(
    compatible: NDArray[np.bool_], available: NDArray[np.bool_], fits: NDArray[np.bool_]
) -> NDArray[np.bool_]:
    """Per device, membership of the sets an entry counts (module docstring).

    ``available`` is free share >= 1 for a whole-device job, >= the share for a
    share job, so one table serves both: C; W or S (C and available); M or
    S ∩ Mm (those whose memory fits); Mm (C and memory fits).
    """
    usable = compatible & available
    return np.stack([compatible, usable, usable & fits, compatible & fits], axis=1)


def check_feasibility_batch(items: Sequence[FeasibilityItem]) -> Feasibility:
    """`check_feasibility` of every request, stacked: one row per option of the batch.

    One pass over the joined arrays of the whole micro-batch: the per-request
    comparisons (`_batch`); then, per node, how many of its devices fall in
    each set the rule counts (so an entry that names no devices costs one
    lookup, however many options share its node), per named entry the same
    over the devices it names, and ORs over entries: no loop over options or
    devices. `check_feasibility` is this function on one request, so the forms
    agree bit for bit (tests/policies/test_batch_equivalence.py).
    """
    if not items:
        return Feasibility(np.zeros(0, dtype=bool), np.zeros((0, len(SIGNALS)), dtype=bool))
    return feasibility_of_joined(_batch(items))


def feasibility_of_joined(b: _Batch) -> Feasibility:
    """The feasibility of joined columns (`_Batch`), however they were joined: from
    request objects (`_batch`) or from a columnar batch
    (`service.contract.batch.validation`, which builds the same columns)."""
    if not len(b.options):
        return Feasibility(np.zeros(0, dtype=bool), np.zeros((0, len(SIGNALS)), dtype=bool))
    nodes, taken, per_option = b.nodes, b.taken, b.per_option
    n_entries = len(nodes)
    named = np.repeat(b.named, b.entries)
    is_share = np.repeat(~np.isnan(b.share), b.entries)

    sets = b.device_sets
    counts = _segment_sums(sets[:-1], b.devices_per_node)[nodes]
    lengths = b.devices_per_node[nodes]
    bad_names = np.zeros(n_entries, dtype=bool)
    if b.named.any():
        # Entries that name devices count over those devices instead; a named device on
        # another node (or none), or named twice in one entry, is a wrong count.
        which = np.flatnonzero(named)
        pair = np.repeat(np.arange(len(which), dtype=np.int64), b.named_lengths)
        source = b.named_source
        device = np.where(source < 0, len(b.device_node) - 1, source)
        off_node = b.device_node[device] != nodes[which][pair]
        named_counts = _segment_sums(np.column_stack([sets[device], off_node]), b.named_lengths)
        counts[which] = named_counts[:, :4]
        lengths[which] = b.named_lengths
        order = np.lexsort((source, pair))
        e, d = pair[order], source[order]
        twice = np.zeros(len(which), dtype=bool)
        twice[e[1:][(e[1:] == e[:-1]) & (d[1:] == d[:-1])]] = True
        bad_names[which] = (named_counts[:, 4] > 0) | twice
    # For a whole-device job "available" is W (M when it fits), for a share job S (S ∩ Mm).
    n_compat, n_available, n_available_fit, n_fit = counts.T

    whole_job = ~is_share & (taken > 0)
    count = np.where(
        is_share,
        (taken > 1) | (np.repeat(per_option, per_option) > 1) | (named & (lengths > 1)),
        whole_job & ((n_available < taken) | (named & (lengths != taken))),
    ) | (bad_names & (is_share | whole_job))
    memory = np.where(
        is_share,
        (n_available_fit == 0) & ((n_available > 0) | (n_fit == 0)),
        whole_job & (n_available >= taken) & (n_available_fit < taken),
    )
    node = b.node_rules[nodes]
    compat_bad = np.where(is_share | (taken > 0), n_compat == 0, node[:, _CLASS_REFUSED])
    per_entry = np.stack(
        [
            count,
            is_share & (n_available == 0),
            memory,
            node[:, _CPU_SHORT],
            node[:, _MEMORY_SHORT],
            compat_bad,
            node[:, _AFFINITY],
            node[:, _ANTI_AFFINITY],
            taken,  # summed per option below: the option's whole accelerators (quota)
            node[:, _DRAINED],
        ],
        axis=1,
    )
    # One entry per option (no gangs): the entries are the options.
    sums = per_entry if (per_option == 1).all() else _segment_sums(per_entry, per_option)
    quota_column = SIGNALS.index(ConstraintSignal.QUOTA)
    option_total = sums[:, quota_column].astype(np.float64)
    violations = sums > 0
    share = np.repeat(b.share, b.options)
    usage = np.where(np.isnan(share), option_total, share)
    quota = np.repeat(b.quota, b.options)
    violations[:, 0] |= option_total < np.repeat(b.requested, b.options)
    with np.errstate(invalid="ignore"):
        violations[:, quota_column] = ~np.isnan(quota) & (usage > quota)
    return Feasibility(mask=np.logical_not(violations.any(axis=1)), violations=violations)


def check_feasibility(
    state: ClusterState,
    workload: Workload,
    options: PlacementOptions,
    quota_remaining: float | None = None,
) -> Feasibility:
    """Evaluate every constraint signal for every option (the batch pass on one request)."""
    return check_feasibility_batch([(state, workload, options, quota_remaining)])
