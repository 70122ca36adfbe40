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
over one request, so the two are bit-identical by construction. Every
comparison that reads a request's floating columns (host CPU and memory,
device share and memory) runs per request, vectorised over its nodes or
devices, in that request's own precision; what follows is integer counting
and boolean logic over the joined entries and (entry, device) pairs.
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


class _Joined:
    """Per-request columns of a batch, joined: nodes, devices, entries, device sources.

    Everything that compares a request's floating columns with its workload's
    numbers is computed here, per request and vectorised over that request's
    nodes or devices, so both forms compare the same values the same way.
    Device arrays end with one sentinel device (on no node, fitting nothing)
    that an invalid named device index points at.
    """

    def __init__(self, items: Sequence[FeasibilityItem]) -> None:
        cols: dict[str, list[NDArray[Any]]] = {
            k: []
            for k in (
                "cpu_short", "memory_short", "node_bad", "node_allowed", "affinity", "anti",
                "dev_node", "dev_compat", "dev_whole", "dev_fits", "dev_share",
                "nodes", "taken", "starts", "lengths", "source", "named", "is_share",
                "per_option", "requested", "share", "quota", "has_quota",
            )
        }  # fmt: skip
        node_base = dev_base = source_base = 0
        for state, workload, options, quota in items:
            devices = node_devices(state)
            allowed_cls, accel_cls = _class_rules(state, workload)
            n_dev, n_opt = devices.n_devices, options.n_options
            with np.errstate(over="ignore"):  # a need beyond float32 is a shortfall (inf)
                cols["cpu_short"].append(np.asarray(state.cpu_free < workload.cpu_per_node))
                cols["memory_short"].append(
                    np.asarray(state.memory_free_gb < workload.memory_per_node_gb)
                )
                # Unknown (NaN) free memory fits: NaN < need is False.
                cols["dev_fits"].append(~(devices.free_memory_gb < workload.accelerator_memory_gb))
                share = workload.accelerator_share
                cols["dev_share"].append(
                    devices.free_share >= share if share is not None else np.zeros(n_dev, bool)
                )
            cols["dev_whole"].append(devices.free_share >= 1.0)
            cols["dev_compat"].append((allowed_cls & accel_cls)[devices.hardware])
            cols["dev_node"].append(devices.node + node_base)
            cols["node_bad"].append(
                np.asarray(state.draining, dtype=bool) | ~np.asarray(state.healthy, dtype=bool)
            )
            cols["node_allowed"].append(allowed_cls[np.asarray(state.node_hardware, np.int64)])
            affinity, anti = _node_label_rules(state, workload)
            cols["affinity"].append(affinity)
            cols["anti"].append(anti)
            nodes = np.asarray(options.node_index, dtype=np.int64)
            cols["nodes"].append(nodes + node_base)
            cols["taken"].append(np.asarray(options.accelerators, dtype=np.int64))
            if options.names_devices:
                offsets = np.asarray(options.device_offsets, dtype=np.int64)
                starts, lengths = offsets[:-1], np.diff(offsets)
                named = np.asarray(options.device_index, dtype=np.int64)
                valid = (named >= 0) & (named < n_dev)
                source = np.where(valid, named + dev_base, -1)
            else:
                starts = devices.offsets[nodes]
                lengths = devices.offsets[nodes + 1] - starts
                source = np.arange(dev_base, dev_base + n_dev, dtype=np.int64)
            cols["starts"].append(starts + source_base)
            cols["lengths"].append(lengths)
            cols["source"].append(source)
            n_entries = len(nodes)
            cols["named"].append(np.full(n_entries, options.names_devices, dtype=bool))
            cols["is_share"].append(np.full(n_entries, workload.is_share, dtype=bool))
            cols["per_option"].append(np.asarray(options.nodes_per_option, dtype=np.int64))
            cols["requested"].append(np.full(n_opt, workload.accelerators, dtype=np.float64))
            cols["share"].append(np.full(n_opt, share if share is not None else np.nan))
            cols["quota"].append(np.full(n_opt, quota if quota is not None else np.nan))
            cols["has_quota"].append(np.full(n_opt, quota is not None, dtype=bool))
            node_base += state.n_nodes
            dev_base += n_dev
            source_base += len(source)
        self.n_devices = dev_base
        joined = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
        for k in ("dev_node", "dev_compat", "dev_whole", "dev_fits", "dev_share"):
            sentinel = np.array([-1 if k == "dev_node" else 0], dtype=joined[k].dtype)
            joined[k] = np.concatenate([joined[k], sentinel])
        self.c = joined


def _csr_positions(
    starts: NDArray[np.int64], lengths: NDArray[np.int64]
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """(row of every position, position) of the ranges ``starts[i]:starts[i]+lengths[i]``."""
    row = np.repeat(np.arange(len(starts), dtype=np.int64), lengths)
    first = np.cumsum(lengths) - lengths
    position = np.arange(len(row), dtype=np.int64) - first[row] + starts[row]
    return row, position


def check_feasibility_batch(items: Sequence[FeasibilityItem]) -> Feasibility:
    """`check_feasibility` of every request, stacked: one row per option of the batch.

    One pass over the joined arrays of the whole micro-batch: the per-request
    comparisons (`_Joined`), then counting over (entry, device) pairs and ORs
    over entries, with no loop over options or devices. `check_feasibility`
    is this function on one request, so the forms agree bit for bit
    (tests/policies/test_batch_equivalence.py).
    """
    if not items:
        return Feasibility(np.zeros(0, dtype=bool), np.zeros((0, len(SIGNALS)), dtype=bool))
    c = _Joined(items).c
    nodes, taken = c["nodes"].astype(np.int64), c["taken"].astype(np.int64)
    n_entries = len(nodes)
    per_option = c["per_option"].astype(np.int64)
    n_total = len(per_option)
    entry_option = np.repeat(np.arange(n_total, dtype=np.int64), per_option)
    named, is_share = c["named"].astype(bool), c["is_share"].astype(bool)

    # (entry, device) pairs: the devices each entry may use (named, or all of its node).
    lengths = c["lengths"].astype(np.int64)
    pair_entry, position = _csr_positions(c["starts"].astype(np.int64), lengths)
    source = c["source"].astype(np.int64)[position]
    sentinel = len(c["dev_node"]) - 1
    device = np.where(source < 0, sentinel, source)
    compat = c["dev_compat"][device]
    whole = compat & c["dev_whole"][device]
    fits = c["dev_fits"][device]
    share_fits = compat & c["dev_share"][device]
    off_node = c["dev_node"][device] != nodes[pair_entry]

    def per_entry(flag: NDArray[np.bool_]) -> NDArray[np.int64]:
        counts: NDArray[np.int64] = np.bincount(pair_entry[flag], minlength=n_entries)
        return counts

    n_compat, n_whole, n_whole_fit = per_entry(compat), per_entry(whole), per_entry(whole & fits)
    n_share, n_share_fit = per_entry(share_fits), per_entry(share_fits & fits)
    n_fit = per_entry(compat & fits)
    # A named device on another node, or named twice in one entry, is a wrong count.
    bad_names = per_entry(off_node) > 0
    if named.any():
        order = np.lexsort((source, pair_entry))
        e, d = pair_entry[order], source[order]
        twice = (e[1:] == e[:-1]) & (d[1:] == d[:-1])
        bad_names[e[1:][twice]] = True
    bad_names &= named

    whole_job = ~is_share & (taken > 0)
    count = np.where(
        is_share,
        (taken > 1) | (per_option[entry_option] > 1) | (named & (lengths > 1)) | bad_names,
        whole_job & ((n_whole < taken) | (named & (lengths != taken)) | bad_names),
    )
    share_short = is_share & (n_share == 0)
    memory = np.where(
        is_share,
        (n_share_fit == 0) & ((n_share > 0) | (n_fit == 0)),
        whole_job & (n_whole >= taken) & (n_whole_fit < taken),
    )
    accelerator_entry = is_share | (taken > 0)
    compat_bad = np.where(accelerator_entry, n_compat == 0, ~c["node_allowed"][nodes])

    def any_per_option(entry: NDArray[np.bool_]) -> NDArray[np.bool_]:
        return np.bincount(entry_option[entry], minlength=n_total) > 0

    option_total = np.bincount(entry_option, weights=taken.astype(np.float64), minlength=n_total)
    share_option = np.isfinite(c["share"])
    usage = np.where(share_option, c["share"], option_total)
    with np.errstate(invalid="ignore"):
        quota = c["has_quota"].astype(bool) & (usage > c["quota"])
    violations = np.stack(
        [
            any_per_option(count) | (option_total < c["requested"]),
            any_per_option(share_short),
            any_per_option(memory),
            any_per_option(c["cpu_short"].astype(bool)[nodes]),
            any_per_option(c["memory_short"].astype(bool)[nodes]),
            any_per_option(compat_bad),
            any_per_option(c["affinity"].astype(bool)[nodes]),
            any_per_option(c["anti"].astype(bool)[nodes]),
            quota,
            any_per_option((c["node_bad"].astype(bool))[nodes]),
        ],
        axis=1,
    )
    return Feasibility(mask=np.logical_not(violations.any(axis=1)), violations=violations)


def check_feasibility(
    state: ClusterState,
    workload: Workload,
    options: PlacementOptions,
    quota_remaining: float | None = None,
) -> Feasibility:
    """Evaluate every constraint signal for every option (the batch pass on one request)."""
    return check_feasibility_batch([(state, workload, options, quota_remaining)])
