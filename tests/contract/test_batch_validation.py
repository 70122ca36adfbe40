"""`validate_batch` / `validate_outcome_batch` against the single-request validators.

The batch form must mean exactly the N single requests it encodes (issue 24,
invariant 1): for every request of a batch the verdict equals
`validate_request`'s on ``batch.requests()[r]``, and when a request has exactly
one fault the refusal names the same field with the same message. Faults are
made by a catalogue with one mutation per rule of validate_request, on a batch
of 64 requests sharing 8 snapshots (a fault in a snapshot refuses every request
on it); randomised multi-fault batches hold the verdicts equal; outcomes
likewise against `validate_outcome`. No mocks: real simulator requests and the
contract-v2 variants of tests/contract/v2_requests.py.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from service.contract import HardwareClass, MirrorRequest, ProductionDecision
from service.contract.batch import OutcomeColumns, RequestBatch
from service.contract.batch.validation import (
    BatchVerdict,
    check_layout,
    validate_batch,
    validate_outcome_batch,
)
from service.contract.errors import InvalidInput
from service.contract.outcome import FailureKind, Outcome
from service.contract.rejections import refusal_of
from service.contract.state import ClusterState, frozen_array
from service.contract.validation import RequestLimits, validate_outcome, validate_request
from service.environment import simulated_episodes
from tests.contract import v2_requests as v2

LIMITS = RequestLimits()


# ---------------------------------------------------------------------------
# fixtures: valid requests, and batches of 64 sharing 8 snapshots


@functools.cache
def _simulated(scenario: str, seed: int, episodes: int) -> tuple[MirrorRequest, ...]:
    return tuple(r for reqs, _ in simulated_episodes(scenario, seed, range(episodes)) for r in reqs)


@functools.cache
def _outcomes() -> tuple[Outcome, ...]:
    return tuple(o for _, outs in simulated_episodes("shared", 0, range(2)) for o in outs.values())


def _with_labels(r: MirrorRequest) -> MirrorRequest:
    """`r` whose nodes carry two labels each and whose workload asks for one of them."""
    s = r.state
    labels = tuple(ls | {f"rack=r{i % 2}"} for i, ls in enumerate(s.labels))
    w = dataclasses.replace(r.workload, affinity=frozenset({"zone=any"}) - {"zone=any"})
    return dataclasses.replace(r, state=dataclasses.replace(s, labels=labels), workload=w)


def _with_option_ids(r: MirrorRequest) -> MirrorRequest:
    o = r.options
    ids = tuple(f"opt-{i}" for i in range(o.n_options))
    return dataclasses.replace(r, options=dataclasses.replace(o, option_ids=ids))


def _plain(r: MirrorRequest) -> MirrorRequest:
    """`r` without devices (the node-count shortcut), option ids or production's
    distribution (derived devices change feasibility, so the sent one may not fit)."""
    s = r.state
    state = dataclasses.replace(
        s,
        device_offsets=frozen_array([], np.int64),
        device_hardware=frozen_array([], np.int32),
        device_free_share=frozen_array([], np.float32),
        device_free_memory_gb=frozen_array([], np.float32),
        device_ids=(),
    )
    o = dataclasses.replace(
        r.options,
        option_ids=(),
        device_offsets=frozen_array([], np.int64),
        device_index=frozen_array([], np.int32),
    )
    return _no_distribution(dataclasses.replace(r, state=state, options=o))


def _no_distribution(r: MirrorRequest) -> MirrorRequest:
    """`r` with production's decision but not its whole distribution (a variant that
    changes feasibility would otherwise put mass on a masked option)."""
    p = r.production
    if p is None:
        return r
    return dataclasses.replace(r, production=ProductionDecision(p.option, p.propensity))


def _spread(r: MirrorRequest) -> MirrorRequest:
    """`v2.spread` of the plain request, production's distribution giving the gang 0."""
    r = v2.spread(_plain(r), gang_size=2)
    p = r.production
    if p is not None and p.probabilities is not None:
        probabilities = (*p.probabilities, 0.0)
        r = dataclasses.replace(r, production=dataclasses.replace(p, probabilities=probabilities))
    return r


def _schema_1(r: MirrorRequest) -> MirrorRequest:
    """`r` as a valid schema-1 request: no v2 field."""
    r = _plain(r)
    w = dataclasses.replace(r.workload, accelerator_share=None, qos_class="", kind="train")
    if r.workload.accelerator_share is not None:
        w = dataclasses.replace(w, accelerators=1)
    p = r.production
    if p is not None:
        p = ProductionDecision(p.option, p.propensity)
    return dataclasses.replace(r, schema_version=1, workload=w, production=p)


VARIANTS: tuple[Callable[[MirrorRequest], MirrorRequest], ...] = (
    lambda r: r,
    _plain,
    lambda r: _no_distribution(v2.naming_devices(_plain(r))),
    lambda r: _no_distribution(v2.sharing(_plain(r))),
    v2.unknown_capabilities,
    _spread,
    _with_labels,
    lambda r: _with_option_ids(_plain(r)),
)


def _group(base: MirrorRequest, variant: int, copies: int, tag: str) -> list[MirrorRequest]:
    """`copies` requests sharing one snapshot: the variant of `base`, ids made distinct."""
    r = VARIANTS[variant % len(VARIANTS)](base)
    return [
        dataclasses.replace(
            r,
            request_id=f"{r.request_id}-{tag}{j}",
            workload=dataclasses.replace(r.workload, workload_id=f"{r.workload.workload_id}-{j}"),
        )
        for j in range(copies)
    ]


def shared_batch(seed: int = 0, schema: int = 2) -> list[MirrorRequest]:
    """64 valid requests, 8 per snapshot (each group shares one `ClusterState` object)."""
    pool = _simulated("shared", 0, 2) + _simulated("train", 1, 1)
    rng = random.Random(seed)
    out: list[MirrorRequest] = []
    for k in range(8):
        base = rng.choice(pool)
        if schema == 1:
            out.extend(_group(_schema_1(base), 0, 8, f"g{k}-"))
        else:
            out.extend(_group(base, k + seed, 8, f"g{k}-"))
    return out


def expected(requests: list[MirrorRequest], limits: RequestLimits) -> list[InvalidInput | None]:
    """validate_request's verdict on each request the batch of `requests` means."""
    out: list[InvalidInput | None] = []
    for r in RequestBatch.from_requests(requests).requests():
        try:
            validate_request(r, limits)
        except InvalidInput as exc:
            out.append(exc)
        else:
            out.append(None)
    return out


def assert_same_verdicts(
    requests: list[MirrorRequest], limits: RequestLimits = LIMITS, fields: bool = True
) -> tuple[BatchVerdict, list[InvalidInput | None]]:
    batch = RequestBatch.from_requests(requests)
    verdict = validate_batch(batch, limits)
    want = expected(requests, limits)
    assert verdict.ok.tolist() == [w is None for w in want]
    got = {r.index: r for r in verdict.refusals}
    assert sorted(got) == [i for i, w in enumerate(want) if w is not None]
    assert [r.index for r in verdict.refusals] == sorted(got)
    for i, w in enumerate(want):
        if w is None:
            continue
        refusal = refusal_of(w)
        assert refusal is not None
        assert got[i].reason == refusal.reason, (i, got[i], w)
        if fields:
            assert (got[i].field, got[i].message) == (w.field, w.problem), (i, got[i], w)
    return verdict, want


# ---------------------------------------------------------------------------
# (1) valid requests are accepted


@pytest.mark.parametrize(("scenario", "seed"), [("shared", 0), ("train", 1), ("degraded", 2)])
def test_simulated_requests_are_accepted(scenario: str, seed: int) -> None:
    requests = list(_simulated(scenario, seed, 2))
    verdict = validate_batch(RequestBatch.from_requests(requests), LIMITS)
    assert verdict.ok.all() and not verdict.refusals
    assert len(verdict.ok) == len(requests)


def test_contract_v2_variants_are_accepted() -> None:
    base = list(_simulated("shared", 0, 1))[:40]
    requests = [VARIANTS[i % len(VARIANTS)](r) for i, r in enumerate(base)]
    requests += [v2.with_distribution(r) for r in base[:5]]
    assert all(e is None for e in expected(requests, LIMITS))
    verdict = validate_batch(RequestBatch.from_requests(requests), LIMITS)
    assert verdict.ok.all() and not verdict.refusals


@pytest.mark.parametrize("schema", [1, 2])
def test_shared_batches_are_accepted(schema: int) -> None:
    requests = shared_batch(0, schema)
    batch = RequestBatch.from_requests(requests)
    assert batch.states.n_states == 8 and batch.n_requests == 64
    assert all(e is None for e in expected(requests, LIMITS))
    verdict = validate_batch(batch, LIMITS)
    assert verdict.ok.all() and not verdict.refusals


def test_empty_batch() -> None:
    verdict = validate_batch(RequestBatch.from_requests([]), LIMITS)
    assert len(verdict.ok) == 0 and verdict.refusals == ()


# ---------------------------------------------------------------------------
# (2) the mutation catalogue: one fault per rule


def _arr(values: Any, like: np.ndarray) -> np.ndarray:
    return frozen_array(values, like.dtype.type)


def _set(array: np.ndarray, i: int, value: Any) -> np.ndarray:
    out = np.array(array, copy=True)
    out[i] = value
    return _arr(out, array)


def _node(s: ClusterState, name: str, i: int, value: Any) -> ClusterState:
    changes: dict[str, Any] = {name: _set(getattr(s, name), i, value)}
    return dataclasses.replace(s, **changes)


def _tuple_set(t: tuple[Any, ...], i: int, value: Any) -> tuple[Any, ...]:
    return (*t[:i], value, *t[i + 1 :])


def _hw(s: ClusterState, i: int, **changes: Any) -> ClusterState:
    return dataclasses.replace(
        s, hardware=_tuple_set(s.hardware, i, dataclasses.replace(s.hardware[i], **changes))
    )


def _w(r: MirrorRequest, **changes: Any) -> MirrorRequest:
    return dataclasses.replace(r, workload=dataclasses.replace(r.workload, **changes))


def _o(r: MirrorRequest, **changes: Any) -> MirrorRequest:
    return dataclasses.replace(r, options=dataclasses.replace(r.options, **changes))


def _p(r: MirrorRequest, **changes: Any) -> MirrorRequest:
    assert r.production is not None
    return dataclasses.replace(r, production=dataclasses.replace(r.production, **changes))


def _last(s: ClusterState) -> int:
    return s.n_nodes - 1


def _empty_state(s: ClusterState) -> ClusterState:
    cols: dict[str, Any] = {
        name: _arr([], getattr(s, name))
        for name in (
            "node_hardware",
            "accelerators_free",
            "accelerators_total",
            "cpu_free",
            "cpu_total",
            "memory_free_gb",
            "memory_total_gb",
            "utilisation",
            "queue_length",
            "healthy",
            "draining",
        )
    }
    return _plain_state(
        dataclasses.replace(s, node_ids=(), zone=(), locality=(), labels=(), **cols)
    )


def _plain_state(s: ClusterState) -> ClusterState:
    return dataclasses.replace(
        s,
        device_offsets=frozen_array([], np.int64),
        device_hardware=frozen_array([], np.int32),
        device_free_share=frozen_array([], np.float32),
        device_free_memory_gb=frozen_array([], np.float32),
        device_ids=(),
    )


def _first_device_node(s: ClusterState) -> int:
    counts = np.diff(s.device_offsets)
    return int(np.flatnonzero(counts > 0)[0])


def _backward_devices(s: ClusterState) -> ClusterState:
    """Device offsets that step backwards between two nodes (the end still matches)."""
    o = np.array(s.device_offsets, copy=True)
    k = _first_device_node(s) + 1  # o[k] > o[k-1]
    o[k] = o[k - 1] - 1 if o[k - 1] > 0 else -1
    return dataclasses.replace(s, device_offsets=frozen_array(o, np.int64))


def _device_memory_over(s: ClusterState) -> ClusterState:
    d = int(s.device_offsets[_first_device_node(s)])
    cap = s.hardware[int(s.device_hardware[d])].accelerator_memory_gb or 0.0
    return dataclasses.replace(
        s, device_free_memory_gb=_set(s.device_free_memory_gb, d, cap + 100.0)
    )


def _zero_memory_class_on_device(s: ClusterState) -> ClusterState:
    d = int(s.device_offsets[_first_device_node(s)])
    return _hw(s, int(s.device_hardware[d]), accelerator_memory_gb=0.0)


def _zero_memory_class_on_node(s: ClusterState) -> ClusterState:
    i = int(np.flatnonzero(s.accelerators_total > 0)[0])
    return _hw(s, int(s.node_hardware[i]), accelerator_memory_gb=0.0)


def _counts_disagree(s: ClusterState) -> ClusterState:
    i = _first_device_node(s)
    return _node(s, "accelerators_total", i, int(s.accelerators_total[i]) + 1)


def _free_disagree(s: ClusterState) -> ClusterState:
    i = _first_device_node(s)
    share = np.array(s.device_free_share, copy=True)
    a, b = int(s.device_offsets[i]), int(s.device_offsets[i + 1])
    share[a:b] = 0.5  # none wholly free, the node still says some are
    s = dataclasses.replace(s, device_free_share=frozen_array(share, np.float32))
    return _node(s, "accelerators_free", i, max(int(s.accelerators_free[i]), 1))


def _label(s: ClusterState, i: int, label: str) -> ClusterState:
    return dataclasses.replace(s, labels=_tuple_set(s.labels, i, s.labels[i] | {label}))


def _no_options(r: MirrorRequest) -> MirrorRequest:
    return _o(
        r,
        node_offsets=frozen_array([0], np.int64),
        node_index=frozen_array([], np.int32),
        accelerators=frozen_array([], np.int32),
        option_ids=(),
        device_offsets=frozen_array([], np.int64),
        device_index=frozen_array([], np.int32),
    )


def _empty_option(r: MirrorRequest) -> MirrorRequest:
    """Option 1 covers no node: its nodes move to option 0 (sizes stay consistent)."""
    o = np.array(r.options.node_offsets, copy=True)
    o[1] = o[2]
    return _o(r, node_offsets=frozen_array(o, np.int64))


def _backward_option(r: MirrorRequest) -> MirrorRequest:
    o = np.array(r.options.node_offsets, copy=True)
    o[1] = o[2] + 1 if len(o) > 3 else o[2]
    return _o(r, node_offsets=frozen_array(o, np.int64))


def _wide_option(r: MirrorRequest) -> MirrorRequest:
    """Option 0 spans two nodes (gang_size 1 allows one)."""
    o = r.options
    return _o(
        _w(r, gang_size=1),
        node_offsets=frozen_array([0, 2, *(o.node_offsets[1:] + 1).tolist()], np.int64)[
            : o.n_options + 1
        ]
        if False
        else frozen_array([0, 2, *(o.node_offsets[2:]).tolist()], np.int64),
    )


def _named_without_devices(r: MirrorRequest) -> MirrorRequest:
    return dataclasses.replace(r, state=_plain_state(r.state))


def _named_backward(r: MirrorRequest) -> MirrorRequest:
    o = np.array(r.options.device_offsets, copy=True)
    k = int(np.flatnonzero(np.diff(o) > 0)[0]) + 1
    o[k] = o[k - 1] - 1
    return _o(r, device_offsets=frozen_array(o, np.int64))


def _named_out_of_range(r: MirrorRequest) -> MirrorRequest:
    return _o(r, device_index=_set(r.options.device_index, 0, len(r.state.device_hardware)))


def _named_wrong_node(r: MirrorRequest) -> MirrorRequest:
    s, o = r.state, r.options
    d = int(o.device_index[0])
    node = int(np.searchsorted(s.device_offsets, d, side="right") - 1)
    other = next(
        int(s.device_offsets[k])
        for k in range(s.n_nodes)
        if k != node and s.device_offsets[k + 1] > s.device_offsets[k]
    )
    return _o(r, device_index=_set(o.device_index, 0, other))


def _names(r: MirrorRequest) -> bool:
    return r.options.names_devices and len(r.options.device_index) > 0


def _probs(r: MirrorRequest, values: list[float], defer: float | None = 0.0) -> MirrorRequest:
    return _p(r, probabilities=tuple(values), defer_probability=defer)


def _uniform(r: MirrorRequest) -> list[float]:
    assert r.production is not None and r.production.probabilities is not None
    return list(r.production.probabilities)


def _sum_off(r: MirrorRequest) -> MirrorRequest:
    """Half the mass of the first option that has some (or of defer) goes missing."""
    assert r.production is not None
    p, defer = _uniform(r), r.production.defer_probability
    positive = np.flatnonzero(np.array(p) > 0)
    if len(positive):
        p[int(positive[0])] *= 0.5
    else:
        defer = (defer or 0.0) * 0.5
    return _probs(r, p, defer)


def _chosen_zero(r: MirrorRequest) -> MirrorRequest:
    assert r.production is not None
    n = r.options.n_options
    o = r.production.option
    if o == -1:
        return _p(
            r, propensity=None, probabilities=(1.0,) + (0.0,) * (n - 1), defer_probability=0.0
        )
    other = (o + 1) % n
    probs = [0.0] * n
    probs[other] = 1.0
    return _p(r, propensity=None, probabilities=tuple(probs), defer_probability=0.0)


def _propensity_disagrees(r: MirrorRequest) -> MirrorRequest:
    assert r.production is not None
    chosen = (
        r.production.defer_probability
        if r.production.option == -1
        else _uniform(r)[r.production.option]
    )
    return _p(r, propensity=0.5 if abs((chosen or 0) - 0.5) > 0.1 else 0.9)


def _infeasible_mass(r: MirrorRequest) -> MirrorRequest:
    """All mass on option 0, made infeasible by a draining node (state untouched:
    anti-affinity on a label of option 0's first node)."""
    first = int(r.options.node_index[0])
    label = sorted(r.state.labels[first])[0]
    n = r.options.n_options
    r = _w(r, anti_affinity=frozenset({label}))
    return _p(
        r, option=0, propensity=1.0, probabilities=(1.0,) + (0.0,) * (n - 1), defer_probability=0.0
    )


def _has_probs(r: MirrorRequest) -> bool:
    return r.production is not None and r.production.probabilities is not None


def _labelled_first(r: MirrorRequest) -> bool:
    return bool(r.state.labels[int(r.options.node_index[0])])


@dataclass(frozen=True)
class Mutation:
    """One fault: on the snapshot (`state`, applied to every request sharing it) or on
    the request (`request`); `fits` says which requests it applies to; `limits`
    replaces the default limits for the batch; `schema` is the batch's schema."""

    name: str
    state: Callable[[ClusterState], ClusterState] | None = None
    request: Callable[[MirrorRequest], MirrorRequest] | None = None
    fits: Callable[[MirrorRequest], bool] = lambda r: True
    limits: RequestLimits = LIMITS
    schema: int = 2


def _devices(r: MirrorRequest) -> bool:
    return r.state.has_devices and len(r.state.device_hardware) > 0


def _ids(r: MirrorRequest) -> bool:
    return _devices(r) and bool(r.state.device_ids)


def _nodes2(r: MirrorRequest) -> bool:
    return r.state.n_nodes >= 2


def _opts3(r: MirrorRequest) -> bool:
    return r.options.n_options >= 3 and bool((r.options.nodes_per_option == 1).all())


def _plain_r(r: MirrorRequest) -> bool:
    return not r.state.has_devices


def _no_share(r: MirrorRequest) -> bool:
    return r.workload.accelerator_share is None


def _accel(r: MirrorRequest) -> bool:
    return bool((r.state.accelerators_total > 0).any()) and not r.state.has_devices


def _option_ids(r: MirrorRequest) -> bool:
    return bool(r.options.option_ids)


NAN, INF = math.nan, math.inf
CTRL = "bad\x07id"
LONG = "x" * 257
MS = (  # (state mutations)
    Mutation("no nodes", state=_empty_state),
    Mutation(
        "too many nodes",
        state=lambda s: s,
        limits=RequestLimits(max_nodes=3),
        fits=lambda r: r.state.n_nodes > 3,
    ),
    Mutation(
        "duplicate node id",
        state=lambda s: dataclasses.replace(
            s, node_ids=_tuple_set(s.node_ids, _last(s), s.node_ids[0])
        ),
        fits=_nodes2,
    ),
    Mutation(
        "empty node id",
        state=lambda s: dataclasses.replace(s, node_ids=_tuple_set(s.node_ids, 1, "")),
    ),
    Mutation("no hardware", state=lambda s: dataclasses.replace(s, hardware=())),
    Mutation("hardware name empty", state=lambda s: _hw(s, 0, name="")),
    Mutation("hardware name blank", state=lambda s: _hw(s, len(s.hardware) - 1, name=" \u00a0")),
    Mutation("hardware nan", state=lambda s: _hw(s, 0, peak_dense_tflops=NAN)),
    Mutation(
        "hardware negative", state=lambda s: _hw(s, len(s.hardware) - 1, interconnect_gbps=-1.0)
    ),
    Mutation("hardware too big", state=lambda s: _hw(s, 0, memory_bandwidth_gbps=2e12)),
    Mutation("node_hardware negative", state=lambda s: _node(s, "node_hardware", _last(s), -1)),
    Mutation("node_hardware beyond", state=lambda s: _node(s, "node_hardware", 1, len(s.hardware))),
    Mutation(
        "accelerators_free negative", state=lambda s: _node(s, "accelerators_free", _last(s), -1)
    ),
    Mutation("accelerators_total negative", state=lambda s: _node(s, "accelerators_total", 1, -2)),
    Mutation("cpu_free nan", state=lambda s: _node(s, "cpu_free", _last(s), NAN)),
    Mutation("cpu_free negative", state=lambda s: _node(s, "cpu_free", 1, -1.0)),
    Mutation("cpu_total inf", state=lambda s: _node(s, "cpu_total", 0, INF)),
    Mutation("cpu_total negative", state=lambda s: _node(s, "cpu_total", _last(s), -3.0)),
    Mutation("memory_free nan", state=lambda s: _node(s, "memory_free_gb", 1, NAN)),
    Mutation("memory_free negative", state=lambda s: _node(s, "memory_free_gb", 0, -0.5)),
    Mutation("memory_total inf", state=lambda s: _node(s, "memory_total_gb", _last(s), -INF)),
    Mutation("memory_total negative", state=lambda s: _node(s, "memory_total_gb", 1, -1.0)),
    Mutation("queue negative", state=lambda s: _node(s, "queue_length", _last(s), -1)),
    Mutation("utilisation nan", state=lambda s: _node(s, "utilisation", 1, NAN)),
    Mutation("utilisation negative", state=lambda s: _node(s, "utilisation", 0, -0.1)),
    Mutation("utilisation over 1", state=lambda s: _node(s, "utilisation", _last(s), 1.5)),
    Mutation(
        "accelerators free > total",
        state=lambda s: _node(s, "accelerators_free", 1, int(s.accelerators_total[1]) + 1),
        fits=_plain_r,
    ),
    Mutation(
        "cpu free > total",
        state=lambda s: _node(s, "cpu_free", _last(s), float(s.cpu_total[-1]) + 1),
    ),
    Mutation(
        "memory free > total",
        state=lambda s: _node(s, "memory_free_gb", 0, float(s.memory_total_gb[0]) + 1),
    ),
    Mutation(
        "too many devices", state=lambda s: s, fits=_devices, limits=RequestLimits(max_devices=2)
    ),
    Mutation(
        "too many accelerators", state=lambda s: s, fits=_accel, limits=RequestLimits(max_devices=1)
    ),
    Mutation("device offsets backwards", state=_backward_devices, fits=_devices),
    Mutation(
        "device hardware beyond",
        state=lambda s: dataclasses.replace(
            s, device_hardware=_set(s.device_hardware, len(s.device_hardware) - 1, len(s.hardware))
        ),
        fits=_devices,
    ),
    Mutation(
        "device hardware negative",
        state=lambda s: dataclasses.replace(s, device_hardware=_set(s.device_hardware, 0, -1)),
        fits=_devices,
    ),
    Mutation(
        "device share nan",
        state=lambda s: dataclasses.replace(s, device_free_share=_set(s.device_free_share, 1, NAN)),
        fits=_devices,
    ),
    Mutation(
        "device share over 1",
        state=lambda s: dataclasses.replace(
            s, device_free_share=_set(s.device_free_share, 0, 1.25)
        ),
        fits=_devices,
    ),
    Mutation(
        "device memory negative",
        state=lambda s: dataclasses.replace(
            s, device_free_memory_gb=_set(s.device_free_memory_gb, 1, -1.0)
        ),
        fits=_devices,
    ),
    Mutation("device memory over class", state=_device_memory_over, fits=_devices),
    Mutation("device class is a CPU pool", state=_zero_memory_class_on_device, fits=_devices),
    Mutation("accelerators_total vs devices", state=_counts_disagree, fits=_devices),
    Mutation("accelerators_free vs devices", state=_free_disagree, fits=_devices),
    Mutation(
        "device id too long",
        state=lambda s: dataclasses.replace(s, device_ids=_tuple_set(s.device_ids, 2, "é" * 257)),
        fits=_ids,
    ),
    Mutation(
        "device id control",
        state=lambda s: dataclasses.replace(s, device_ids=_tuple_set(s.device_ids, 1, CTRL)),
        fits=_ids,
    ),
    Mutation("node class is a CPU pool", state=_zero_memory_class_on_node, fits=_accel),
    Mutation(
        "node id control",
        state=lambda s: dataclasses.replace(s, node_ids=_tuple_set(s.node_ids, _last(s), "n\nx")),
    ),
    Mutation(
        "hardware name control", state=lambda s: _hw(s, len(s.hardware) - 1, name="H\x1b[31m")
    ),
    Mutation(
        "zone control", state=lambda s: dataclasses.replace(s, zone=_tuple_set(s.zone, 1, "z\x00"))
    ),
    Mutation(
        "locality control",
        state=lambda s: dataclasses.replace(s, locality=_tuple_set(s.locality, _last(s), "\track")),
    ),
    Mutation("label control", state=lambda s: _label(s, 1, "k=\x1fv")),
)
MR = (  # (request mutations)
    Mutation("request id empty", request=lambda r: dataclasses.replace(r, request_id="")),
    Mutation("request id too long", request=lambda r: dataclasses.replace(r, request_id="é" * 257)),
    Mutation("request id control", request=lambda r: dataclasses.replace(r, request_id=CTRL)),
    Mutation("request time nan", request=lambda r: dataclasses.replace(r, request_time=NAN)),
    Mutation("request time zero", request=lambda r: dataclasses.replace(r, request_time=0.0)),
    Mutation("request time late", request=lambda r: dataclasses.replace(r, request_time=3e11)),
    Mutation("workload id empty", request=lambda r: _w(r, workload_id="")),
    Mutation("workload id too long", request=lambda r: _w(r, workload_id=LONG)),
    Mutation("workload id control", request=lambda r: _w(r, workload_id=CTRL)),
    Mutation("tenant control", request=lambda r: _w(r, tenant="t\x01")),
    Mutation("model family control", request=lambda r: _w(r, model_family="LM\r\n")),
    Mutation("model size nan", request=lambda r: _w(r, model_size_b=NAN)),
    Mutation("accelerator memory negative", request=lambda r: _w(r, accelerator_memory_gb=-1.0)),
    Mutation("cpu per node too big", request=lambda r: _w(r, cpu_per_node=5e12)),
    Mutation("memory per node inf", request=lambda r: _w(r, memory_per_node_gb=INF)),
    Mutation("accelerators negative", request=lambda r: _w(r, accelerators=-1), fits=_no_share),
    Mutation("kind empty", request=lambda r: _w(r, kind="")),
    Mutation("kind too long", request=lambda r: _w(r, kind="é" * 65)),
    Mutation("kind control", request=lambda r: _w(r, kind="tr\x02ain")),
    Mutation("qos too long", request=lambda r: _w(r, qos_class="q" * 65)),
    Mutation("qos control", request=lambda r: _w(r, qos_class="L\x7fS\x03")),
    Mutation("share zero", request=lambda r: _w(r, accelerator_share=0.0, accelerators=0)),
    Mutation("share over 1", request=lambda r: _w(r, accelerator_share=1.5, accelerators=0)),
    Mutation(
        "share with accelerators", request=lambda r: _w(r, accelerator_share=0.5, accelerators=2)
    ),
    Mutation("gang size zero", request=lambda r: _w(r, gang_size=0)),
    Mutation("slo negative", request=lambda r: _w(r, slo_seconds=-5.0)),
    Mutation("slo too big", request=lambda r: _w(r, slo_seconds=2e12)),
    Mutation("work units inf", request=lambda r: _w(r, work_units=INF)),
    Mutation("no options", request=_no_options),
    Mutation(
        "too many options",
        request=lambda r: r,
        limits=RequestLimits(max_options=3),
        fits=lambda r: r.options.n_options > 3,
    ),
    Mutation("option with no node", request=_empty_option, fits=_opts3),
    Mutation("option stepping back", request=_backward_option, fits=_opts3),
    Mutation(
        "option too wide",
        request=lambda r: r,
        limits=RequestLimits(max_nodes_per_option=1),
        fits=lambda r: r.workload.gang_size >= 2 and bool((r.options.nodes_per_option > 1).any()),
    ),
    Mutation(
        "option wider than gang",
        request=lambda r: _w(r, gang_size=1),
        fits=lambda r: bool((r.options.nodes_per_option > 1).any()),
    ),
    Mutation(
        "node index negative",
        request=lambda r: _o(
            r, node_index=_set(r.options.node_index, len(r.options.node_index) - 1, -1)
        ),
    ),
    Mutation(
        "node index beyond",
        request=lambda r: _o(r, node_index=_set(r.options.node_index, 1, r.state.n_nodes)),
    ),
    Mutation(
        "entry accelerators negative",
        request=lambda r: _o(r, accelerators=_set(r.options.accelerators, 2, -1)),
    ),
    Mutation("named devices, state sends none", request=_named_without_devices, fits=_names),
    Mutation("named device offsets backwards", request=_named_backward, fits=_names),
    Mutation("named device beyond", request=_named_out_of_range, fits=_names),
    Mutation("named device on another node", request=_named_wrong_node, fits=_names),
    Mutation("production option beyond", request=lambda r: _p(r, option=r.options.n_options)),
    Mutation("production option below defer", request=lambda r: _p(r, option=-2)),
    Mutation("propensity zero", request=lambda r: _p(r, propensity=0.0)),
    Mutation("propensity inf", request=lambda r: _p(r, propensity=INF)),
    Mutation(
        "defer without probabilities",
        request=lambda r: _p(r, probabilities=None, defer_probability=0.0),
    ),
    Mutation(
        "probabilities wrong length",
        request=lambda r: _probs(r, [*_uniform(r), 0.0]),
        fits=_has_probs,
    ),
    Mutation(
        "probability nan", request=lambda r: _probs(r, [*_uniform(r)[:-1], NAN]), fits=_has_probs
    ),
    Mutation(
        "probability negative",
        request=lambda r: _probs(r, [-0.1, *_uniform(r)[1:]]),
        fits=_has_probs,
    ),
    Mutation(
        "defer probability over 1", request=lambda r: _probs(r, _uniform(r), 1.5), fits=_has_probs
    ),
    Mutation("probabilities do not sum to 1", request=_sum_off, fits=_has_probs),
    Mutation("chosen has probability 0", request=_chosen_zero, fits=_has_probs),
    Mutation("propensity disagrees", request=_propensity_disagrees, fits=_has_probs),
    Mutation("quota negative", request=lambda r: dataclasses.replace(r, quota_remaining=-1.0)),
    Mutation("quota inf", request=lambda r: dataclasses.replace(r, quota_remaining=INF)),
    Mutation(
        "option id control",
        request=lambda r: _o(r, option_ids=_tuple_set(r.options.option_ids, 1, "o\x0b")),
        fits=_option_ids,
    ),
    Mutation(
        "allowed hardware control",
        request=lambda r: _w(r, allowed_hardware=r.workload.allowed_hardware | {"A\x00", "B\x01"}),
    ),
    Mutation("affinity control", request=lambda r: _w(r, affinity=frozenset({"k=\x05"}))),
    Mutation(
        "anti-affinity control", request=lambda r: _w(r, anti_affinity=frozenset({"\x10=v", "a=b"}))
    ),
    Mutation(
        "probability on an infeasible option",
        request=_infeasible_mass,
        fits=lambda r: _has_probs(r) and _labelled_first(r),
    ),
)
M1 = (  # (schema-1 mutations: a schema-1 request may set no schema-2 field)
    Mutation("v1 devices", request=lambda r: v2.with_devices(r), schema=1),
    Mutation(
        "v1 unknown capability",
        request=lambda r: dataclasses.replace(r, state=_hw(r.state, 0, interconnect_gbps=None)),
        schema=1,
    ),
    Mutation("v1 open kind", request=lambda r: _w(r, kind="serve"), schema=1),
    Mutation("v1 share", request=lambda r: _w(r, accelerator_share=0.5, accelerators=0), schema=1),
    Mutation("v1 qos", request=lambda r: _w(r, qos_class="LS"), schema=1),
    Mutation("v1 names devices", request=lambda r: v2.naming_devices(r), schema=1),
    Mutation(
        "v1 probabilities",
        request=lambda r: _probs(r, [1.0] + [0.0] * (r.options.n_options - 1), None),
        schema=1,
    ),
    Mutation("v1 defer probability", request=lambda r: _p(r, defer_probability=0.0), schema=1),
    Mutation("v1 gang rule does not apply", request=lambda r: r, schema=1),
)
CATALOGUE = MS + MR + M1


def _apply(requests: list[MirrorRequest], i: int, m: Mutation) -> list[MirrorRequest]:
    """`m` at request i: a state mutation replaces the snapshot of every request sharing it."""
    out = list(requests)
    if m.state is not None:
        old = requests[i].state
        new = m.state(old)
        for k, r in enumerate(out):
            if r.state is old:
                out[k] = dataclasses.replace(r, state=new)
    else:
        assert m.request is not None
        r = m.request(requests[i])
        if r.state is not requests[i].state:  # a request mutation that changed the state:
            r = dataclasses.replace(r, state=r.state)  # its own snapshot (not shared)
        out[i] = r
    return out


def _targets(requests: list[MirrorRequest], m: Mutation, rng: random.Random) -> list[int]:
    fitting = [i for i, r in enumerate(requests) if m.fits(r)]
    return rng.sample(fitting, min(2, len(fitting)))


def _base(m: Mutation) -> list[MirrorRequest]:
    return shared_batch(0, m.schema)


@functools.cache
def _catalogue_cases() -> list[tuple[Mutation, list[MirrorRequest], list[int]]]:
    rng = random.Random(24)
    cases = []
    for m in CATALOGUE:
        base = _base(m)
        targets = _targets(base, m, rng)
        assert targets, f"no request of the base batch fits {m.name!r}"
        requests = base
        for t in targets:
            requests = _apply(requests, t, m)
        cases.append((m, requests, targets))
    return cases


_ALWAYS_VALID = {"v1 gang rule does not apply"}  # a rule that must NOT fire


def test_every_mutation_trips_validate_request() -> None:
    """The catalogue is meaningful: each mutation makes validate_request refuse the
    requests it touched (and their snapshot-mates, for a snapshot fault)."""
    for m, requests, targets in _catalogue_cases():
        want = expected(requests, m.limits)
        for t in targets:
            if m.name in _ALWAYS_VALID:
                assert want[t] is None, m.name
            else:
                assert want[t] is not None, m.name


# Every field path validate_request can name (digits as N), and the outcome ones.
REQUEST_FIELDS = {
    "schema_version",
    "request_id",
    "request_time",
    "quota_remaining",
    "state.node_ids",
    "state.node_ids[N]",
    "state.hardware",
    "state.hardware[N].name",
    "state.hardware[N].accelerator_memory_gb",
    "state.hardware[N].peak_dense_tflops",
    "state.hardware[N].memory_bandwidth_gbps",
    "state.hardware[N].interconnect_gbps",
    "state.node_hardware[N]",
    "state.accelerators_free[N]",
    "state.accelerators_total[N]",
    "state.accelerators_total",
    "state.cpu_free[N]",
    "state.cpu_total[N]",
    "state.memory_free_gb[N]",
    "state.memory_total_gb[N]",
    "state.queue_length[N]",
    "state.utilisation[N]",
    "state.device_offsets",
    "state.device_offsets[N]",
    "state.device_hardware",
    "state.device_hardware[N]",
    "state.device_free_share[N]",
    "state.device_free_memory_gb[N]",
    "state.device_ids[N]",
    "state.zone[N]",
    "state.locality[N]",
    "state.labels",
    "workload.workload_id",
    "workload.tenant",
    "workload.model_family",
    "workload.model_size_b",
    "workload.accelerator_memory_gb",
    "workload.cpu_per_node",
    "workload.memory_per_node_gb",
    "workload.accelerators",
    "workload.kind",
    "workload.qos_class",
    "workload.accelerator_share",
    "workload.gang_size",
    "workload.slo_seconds",
    "workload.work_units",
    "workload.allowed_hardware",
    "workload.affinity",
    "workload.anti_affinity",
    "options",
    "options[N]",
    "options.node_index[N]",
    "options.accelerators[N]",
    "options.device_offsets",
    "options.device_offsets[N]",
    "options.device_index[N]",
    "options.option_ids[N]",
    "production.option",
    "production.propensity",
    "production.probabilities",
    "production.probabilities[N]",
    "production.defer_probability",
}


def _pattern(field: str) -> str:
    return re.sub(r"\[\d+\]", "[N]", field)


def test_catalogue_covers_every_field() -> None:
    named = set()
    for m, requests, _ in _catalogue_cases():
        for w in expected(requests, m.limits):
            if w is not None:
                named.add(_pattern(w.field))
    named.add("schema_version")  # test_unsupported_schema_version
    missing = REQUEST_FIELDS - named
    assert not missing, sorted(missing)
    assert named <= REQUEST_FIELDS, sorted(named - REQUEST_FIELDS)


@pytest.mark.parametrize("m", CATALOGUE, ids=[m.name for m in CATALOGUE])
def test_mutation(m: Mutation) -> None:
    case = next(c for c in _catalogue_cases() if c[0] is m)
    _, requests, targets = case
    verdict, want = assert_same_verdicts(requests, m.limits)
    refused = {i for i, w in enumerate(want) if w is not None}
    if m.name in _ALWAYS_VALID:
        assert not refused
        return
    assert set(targets) <= refused
    if m.state is not None and m.limits == LIMITS:  # every request on a faulty snapshot
        states = {id(requests[t].state) for t in targets}
        assert refused == {i for i, r in enumerate(requests) if id(r.state) in states}
        by_state: dict[int, set[tuple[str, str]]] = {}
        for f in verdict.refusals:
            by_state.setdefault(id(requests[f.index].state), set()).add((f.field, f.message))
        assert all(len(v) == 1 for v in by_state.values())
    elif m.limits == LIMITS:
        assert refused == set(targets)


def test_unsupported_schema_version() -> None:
    requests = [dataclasses.replace(r, schema_version=3) for r in shared_batch(0)[:4]]
    assert_same_verdicts(requests)


# ---------------------------------------------------------------------------
# (3) randomised multi-fault batches


def test_random_multi_fault_batches() -> None:
    """A few hundred batches, each with several faults at random requests: the
    accepted and refused sets equal validate_request's (and, where the first fault
    validate_request meets is also the batch's, the field: checked throughout)."""
    rng = random.Random(2024)
    bases = {schema: shared_batch(seed, schema) for seed, schema in ((1, 2), (2, 1))}
    pools = {
        2: [m for m in CATALOGUE if m.schema == 2 and m.limits == LIMITS],
        1: [m for m in CATALOGUE if m.schema == 1] + [m for m in MS if m.limits == LIMITS],
    }
    checked = 0
    for trial in range(240):
        schema = 1 if trial % 4 == 3 else 2
        requests = list(bases[schema])
        if trial % 3 == 0:  # a smaller batch: fewer requests, snapshots of one
            requests = requests[rng.randrange(0, 32) :][: rng.randrange(1, 20)]
        if trial % 2:  # a snapshot's requests need not be neighbours
            rng.shuffle(requests)
        for _ in range(rng.randrange(1, 7)):
            m = rng.choice(pools[schema])
            fitting = [i for i, r in enumerate(requests) if m.fits(r)]
            if not fitting:
                continue
            try:
                requests = _apply(requests, rng.choice(fitting), m)
            except (IndexError, ValueError, StopIteration, AssertionError):
                continue  # a mutation that does not apply to an already mutated request
        try:
            batch = RequestBatch.from_requests(requests)
            check_layout(batch)
        except (InvalidInput, ValueError):
            continue
        assert_same_verdicts(requests, LIMITS, fields=True)
        checked += 1
    assert checked > 200


# ---------------------------------------------------------------------------
# (4) outcomes


def _outcome_mutations() -> list[Callable[[Outcome], Outcome]]:
    def prod(o: Outcome, **c: Any) -> Outcome:
        p = o.production or ProductionDecision(0, 0.5)
        return dataclasses.replace(o, production=dataclasses.replace(p, **c))

    return [
        lambda o: dataclasses.replace(o, request_id=""),
        lambda o: dataclasses.replace(o, request_id="é" * 257),
        lambda o: dataclasses.replace(o, request_id="r\x00"),
        lambda o: dataclasses.replace(o, observed_at=NAN),
        lambda o: dataclasses.replace(o, observed_at=-1.0),
        lambda o: dataclasses.replace(o, queue_delay_s=-1.0),
        lambda o: dataclasses.replace(o, throughput=INF),
        lambda o: dataclasses.replace(o, completion_time_s=-INF),
        lambda o: prod(o, option=-3),
        lambda o: prod(o, option=2**31 - 1),
        lambda o: prod(o, propensity=1.5),
        lambda o: prod(o, propensity=None, probabilities=None, defer_probability=0.5),
        lambda o: prod(
            o, option=0, propensity=None, probabilities=(0.5, NAN), defer_probability=None
        ),
        lambda o: prod(
            o, option=0, propensity=None, probabilities=(0.5, 0.25), defer_probability=0.0
        ),
        lambda o: prod(o, option=0, propensity=None, probabilities=(1.0,), defer_probability=2.0),
        lambda o: prod(
            o, option=3, propensity=None, probabilities=(0.5, 0.5), defer_probability=None
        ),
        lambda o: prod(
            o, option=1, propensity=None, probabilities=(1.0, 0.0), defer_probability=None
        ),
        lambda o: prod(
            o, option=-1, propensity=0.5, probabilities=(0.5,), defer_probability=0.5 + 1e-3
        ),
        lambda o: prod(
            o, option=0, propensity=0.25, probabilities=(0.5, 0.5), defer_probability=None
        ),
    ]


def _assert_outcomes(outcomes: list[Outcome], fields: bool = True) -> BatchVerdict:
    cols = OutcomeColumns.from_outcomes(outcomes)
    verdict = validate_outcome_batch(cols, LIMITS)
    want: list[InvalidInput | None] = []
    for o in cols.outcomes():
        try:
            validate_outcome(o, LIMITS)
        except InvalidInput as exc:
            want.append(exc)
        else:
            want.append(None)
    assert verdict.ok.tolist() == [w is None for w in want]
    got = {r.index: r for r in verdict.refusals}
    for i, w in enumerate(want):
        if w is not None and fields:
            assert (got[i].field, got[i].message) == (w.field, w.problem), (i, got[i], w)
    return verdict


def test_outcomes_valid_and_single_faults() -> None:
    outcomes = list(_outcomes())[:64]
    assert _assert_outcomes(outcomes).ok.all()
    for k, mutate in enumerate(_outcome_mutations()):
        mutated = list(outcomes)
        for i in (k % 64, (k * 7 + 3) % 64):
            mutated[i] = mutate(mutated[i])
        verdict = _assert_outcomes(mutated)
        assert not verdict.ok[k % 64], k


def test_outcomes_random_multi_fault() -> None:
    rng = random.Random(7)
    outcomes = list(_outcomes())[:40]
    mutations = _outcome_mutations()
    for _ in range(150):
        mutated = list(outcomes)
        for _ in range(rng.randrange(1, 8)):
            i = rng.randrange(len(mutated))
            mutated[i] = rng.choice(mutations)(mutated[i])
        _assert_outcomes(mutated)


def test_outcome_unknown_failure_code_is_refused_by_index() -> None:
    outcomes = list(_outcomes())[:4]
    cols = OutcomeColumns.from_outcomes(outcomes)
    failure = np.array(cols.failure, copy=True)
    failure[2] = 9
    verdict = validate_outcome_batch(dataclasses.replace(cols, failure=failure), LIMITS)
    assert verdict.ok.tolist() == [True, True, False, True]
    assert verdict.refusals[0].field == "failure"
    assert FailureKind.NONE in {o.failure for o in outcomes}


# ---------------------------------------------------------------------------
# whole-batch faults


def test_unreadable_columns_refuse_the_whole_batch() -> None:
    batch = RequestBatch.from_requests(shared_batch(0)[:8])
    short = dataclasses.replace(
        batch, states=dataclasses.replace(batch.states, cpu_free=batch.states.cpu_free[:-1])
    )
    with pytest.raises(InvalidInput, match=r"states\.cpu_free"):
        validate_batch(short, LIMITS)
    bad_index = dataclasses.replace(batch, state_index=np.full(8, 5, np.int64))
    with pytest.raises(InvalidInput, match="state_index"):
        validate_batch(bad_index, LIMITS)


def test_hardware_class_is_data() -> None:  # the fixture's unknown class is accepted
    r = v2.unknown_capabilities(_simulated("shared", 0, 1)[0])
    assert any(h == HardwareClass("X-NEW", None, None, None, None) for h in r.state.hardware)
    assert validate_batch(RequestBatch.from_requests([r]), LIMITS).ok.all()


# ---------------------------------------------------------------------------
# the support rule's feasibility, joined from the columns


def _affinity(r: MirrorRequest, long: bool = False) -> MirrorRequest:
    """`r` whose nodes carry rack labels (long ones: past the padded-compare width) and
    whose workload needs one rack and forbids a class label."""
    s = r.state
    pad = "x" * 70 if long else ""
    labels = tuple(ls | {f"rack=r{i % 2}{pad}"} for i, ls in enumerate(s.labels))
    w = dataclasses.replace(
        r.workload,
        affinity=frozenset({f"rack=r0{pad}"}),
        anti_affinity=frozenset({"class=K80", "gone=1"}),
    )
    return dataclasses.replace(r, state=dataclasses.replace(s, labels=labels), workload=w)


def test_joined_feasibility_equals_check_feasibility() -> None:
    """The columns the support rule evaluates give, request by request, the mask and
    signals `check_feasibility` gives on the request objects."""
    from service.contract.batch.validation import joined_feasibility
    from service.contract.feasibility import check_feasibility, feasibility_of_joined
    from service.policies.synthetic import random_requests

    base = list(_simulated("shared", 0, 1))[:24] + list(_simulated("degraded", 2, 1))[:8]
    requests = [VARIANTS[i % len(VARIANTS)](r) for i, r in enumerate(base)]
    requests += [_affinity(r, long=i % 2 == 1) for i, r in enumerate(base[:8])]
    requests += [dataclasses.replace(r, quota_remaining=0.5) for r in base[8:12]]
    requests += [v2.sharing(r, share=0.3) for r in base[12:16]]
    requests += random_requests(3, 24, n_nodes=16, max_options=12)
    batch = RequestBatch.from_requests(requests)
    which = np.arange(len(requests), dtype=np.int64)[::-1].copy()  # any order, any subset
    got = feasibility_of_joined(joined_feasibility(batch, which))
    rows = 0
    for r in which.tolist():
        one = batch.requests([r])[0]
        want = check_feasibility(one.state, one.workload, one.options, one.quota_remaining)
        n = one.options.n_options
        assert got.violations[rows : rows + n].tolist() == want.violations.tolist(), r
        rows += n
    assert rows == len(got.mask)
    assert not got.mask.all() and got.mask.any()  # the cases are not all one way
    assert got.violations.any(axis=0)[[6, 7, 8]].all()  # affinity, anti-affinity, quota fired


def test_requests_the_batch_form_cannot_carry_refuse_their_batch_whole() -> None:
    """A column of the wrong length (which validate_request names, e.g. `state.cpu_free`,
    `options.accelerators`, `options.option_ids`) cannot be read into a batch's
    requests: the batch is refused whole, naming the column (invariant 3)."""
    requests = shared_batch(0)[:16]
    r = requests[3]
    short_state = dataclasses.replace(r.state, cpu_free=r.state.cpu_free[:-1])
    short_options = _o(r, accelerators=r.options.accelerators[:-1])
    few_ids = _o(_with_option_ids(r), option_ids=("a",))
    for bad, field in (
        (dataclasses.replace(r, state=short_state), r"states\.cpu_free"),
        (short_options, r"options\.accelerators"),
        (few_ids, r"options\.option_ids"),
    ):
        with pytest.raises(InvalidInput):
            validate_request(bad, LIMITS)
        batch = RequestBatch.from_requests([*requests[:3], bad, *requests[4:]])
        with pytest.raises(InvalidInput, match=field):
            validate_batch(batch, LIMITS)


def test_sums_at_the_tolerance_edge_agree() -> None:
    """Distributions summing to 1 +- about SUM_TOLERANCE: the batch decides each as
    `math.fsum` does (validate_outcome's sum), many values on either side."""
    base = _outcomes()[0]
    outcomes = []
    for k, d in enumerate([*np.linspace(-1.5e-6, 1.5e-6, 61).tolist(), 1e-6, -1e-6]):
        ps = (0.1,) * 7 + (0.3 + d,)
        option = k % 8
        outcomes.append(
            dataclasses.replace(
                base,
                production=ProductionDecision(option, None, ps, None),
            )
        )
    verdict = _assert_outcomes(outcomes)
    assert verdict.ok.any() and not verdict.ok.all()


def _thue_morse(n: int) -> str:
    return "".join("ab"[bin(i).count("1") % 2] for i in range(n))


def test_node_ids_that_collide_in_the_hash_are_not_duplicates() -> None:
    """Two distinct node ids with the same 64-bit polynomial hash (Thue-Morse strings
    and their complement collide for every odd base modulo 2**64): the snapshot is
    accepted; a real duplicate in another snapshot of the batch is still refused."""
    a = _thue_morse(2048)
    b = a.translate(str.maketrans("ab", "ba"))
    requests = shared_batch(0)[:16]
    s = requests[0].state
    colliding = dataclasses.replace(s, node_ids=(a, b, *s.node_ids[2:]))
    requests = [dataclasses.replace(r, state=colliding) if r.state is s else r for r in requests]
    assert_same_verdicts(requests)
    assert validate_batch(RequestBatch.from_requests(requests), LIMITS).ok.all()
    dup = shared_batch(0)[8:16]
    d = dup[0].state
    twice = dataclasses.replace(d, node_ids=(d.node_ids[1], *d.node_ids[1:]))
    dup = [dataclasses.replace(r, state=twice) for r in dup]
    verdict, _ = assert_same_verdicts(requests[:8] + dup)
    assert verdict.ok.tolist() == [True] * 8 + [False] * 8
