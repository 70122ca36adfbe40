"""The scorer's vectorised steps give, bit for bit, what the per-request forms give.

A micro-batch is featurised, checked for feasibility and split into decisions
in one numpy pass per step. Each step here is compared with a straightforward
per-request reference — the per-request functions the definition hashes
cover (`_request_features`, `placement_columns`, `check_feasibility`) and a
plain loop over requests for the decisions — byte for byte, on varied
requests: node counts from 1 to 200, 1 to 5 hardware classes (known,
renamed, never seen), gangs, options nothing can hold, labels with affinity
rules, hardware allow-lists, quotas, unknown model families, with and
without work units and production's decision.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence

import numpy as np
import pytest
from numpy.typing import NDArray

from service.contract import (
    DEFAULT_FEATURES,
    DEFER,
    KNOWN_HARDWARE,
    SIGNALS,
    ClusterState,
    ConstraintSignal,
    HardwareClass,
    MirrorRequest,
    PlacementOptions,
    ProductionDecision,
    Workload,
    WorkloadKind,
    check_feasibility,
    single_node_options,
    validate_request,
)
from service.contract.feasibility import check_feasibility_batch
from service.contract.state import frozen_array
from service.pipeline.scoring import (
    ScoredDecision,
    _draw,
    _per_request,
    decision_uniform,
    score_requests,
)
from service.policies.base import DecisionStatus, Policy, ScoringBatch
from service.policies.batching import make_batch
from service.policies.outcome_features import (
    N_OUTCOME_FEATURES,
    OUTCOME_FEATURES,
    OutcomeFeatureFunction,
    placement_columns,
)
from service.policies.predictor_features import (
    GAVEL_FAMILIES,
    N_PREDICTOR_FEATURES,
    PREDICTOR_FEATURES,
    PredictorFeatureFunction,
    _request_features,
)
from service.policies.registry import Registry
from service.policies.runner import PolicyRun, decide_all, policy_rng
from service.policies.synthetic import random_requests
from tests.feasibility_cases import random_cases

FeasibilityItem = tuple[ClusterState, Workload, PlacementOptions, float | None]

FAMILIES = (
    *GAVEL_FAMILIES,
    "ResNet-50 (batch size 64)",
    "resnet-18 (batch size 16)",
    "  Transformer  ",
    "LM (batch size 80)",
    "never-heard-of-it",
    "Mystery (batch size 3)",
)
LABELS = ("pool=gpu", "pool=cpu", "ssd=yes", "old=yes")


def _hardware(rng: np.random.Generator, i: int) -> HardwareClass:
    """A known class, a known name with other numbers, or a class never seen."""
    known = list(KNOWN_HARDWARE.values())
    base = known[int(rng.integers(0, len(known)))]
    pick = int(rng.integers(0, 3))
    if pick == 0:
        return base
    numbers = rng.uniform(0.0, 2000.0, 4)
    numbers[rng.random(4) < 0.15] = 0.0
    # A stated 0 accelerator memory is a CPU pool (refused on nodes with accelerators):
    # an unpublished memory is unknown instead.
    memory, *rest = (float(x) for x in numbers)
    return HardwareClass(
        base.name if pick == 1 else f"future-{i}", memory if memory > 0 else None, *rest
    )


def _request(rng: np.random.Generator, i: int, max_nodes: int = 200) -> MirrorRequest:
    """A valid request of random shape; some options are infeasible for every reason."""
    n = int(rng.integers(1, max_nodes + 1))
    n_hw = int(rng.integers(1, 6))
    hardware = tuple(_hardware(rng, k) for k in range(n_hw))
    total = rng.integers(0, 17, n)
    cpu_total = rng.uniform(0.5, 256.0, n).astype(np.float32)
    mem_total = rng.uniform(1.0, 2048.0, n).astype(np.float32)
    node_hardware = rng.integers(0, n_hw, n)
    free = rng.integers(0, total + 1)
    # A CPU pool (stated accelerator memory 0) has no accelerators (validation refuses it).
    cpu_pool = np.array([not h.has_accelerators for h in hardware])[node_hardware]
    total, free = np.where(cpu_pool, 0, total), np.where(cpu_pool, 0, free)
    state = ClusterState(
        node_ids=tuple(f"n{i}-{k}" for k in range(n)),
        hardware=hardware,
        node_hardware=frozen_array(node_hardware, np.int32),
        accelerators_free=frozen_array(free, np.int32),
        accelerators_total=frozen_array(total, np.int32),
        cpu_free=frozen_array(cpu_total * rng.random(n).astype(np.float32), np.float32),
        cpu_total=frozen_array(cpu_total, np.float32),
        memory_free_gb=frozen_array(mem_total * rng.random(n).astype(np.float32), np.float32),
        memory_total_gb=frozen_array(mem_total, np.float32),
        utilisation=frozen_array(rng.random(n), np.float32),
        queue_length=frozen_array(rng.poisson(2.0, n), np.int32),
        healthy=frozen_array(rng.random(n) > 0.1, np.bool_),
        draining=frozen_array(rng.random(n) < 0.1, np.bool_),
        zone=tuple(f"zone-{z}" for z in rng.integers(0, 3, n)),
        locality=tuple(f"rack-{x}" for x in rng.integers(0, 6, n)),
        labels=tuple(frozenset(lab for lab in LABELS if rng.random() < 0.4) for _ in range(n)),
    )
    n_opt = int(rng.integers(1, 60))
    sizes = np.minimum(np.where(rng.random(n_opt) < 0.3, rng.integers(2, 9, n_opt), 1), n)
    node_index = np.concatenate([rng.choice(n, size=int(s), replace=False) for s in sizes])
    options = PlacementOptions(
        node_offsets=frozen_array(np.concatenate([[0], np.cumsum(sizes)]), np.int64),
        node_index=frozen_array(node_index, np.int32),
        accelerators=frozen_array(rng.integers(0, 9, len(node_index)), np.int32),
        option_ids=(),
    )
    names = [h.name for h in hardware]
    workload = Workload(
        workload_id=f"w{i}",
        kind=list(WorkloadKind)[int(rng.integers(0, len(WorkloadKind)))],
        model_family=FAMILIES[int(rng.integers(0, len(FAMILIES)))],
        model_size_b=float(rng.uniform(0, 100)),
        accelerators=int(rng.integers(0, 17)),
        accelerator_memory_gb=float(rng.uniform(0, 100)),
        cpu_per_node=float(rng.uniform(0, 64)),
        memory_per_node_gb=float(rng.uniform(0, 512)),
        gang_size=int(sizes.max()),  # the most nodes an option may span (contract)
        priority=int(rng.integers(0, 10)),
        tenant="t",
        slo_seconds=None if rng.random() < 0.3 else float(rng.uniform(1, 1e6)),
        work_units=[None, 1e-3, float(rng.uniform(1, 1e6))][int(rng.integers(0, 3))],
        allowed_hardware=(
            frozenset({str(rng.choice(names))}) if rng.random() < 0.2 else frozenset()
        ),
        affinity=frozenset({"pool=gpu"}) if rng.random() < 0.2 else frozenset(),
        anti_affinity=frozenset({"old=yes"}) if rng.random() < 0.2 else frozenset(),
    )
    production = [
        None,
        ProductionDecision(DEFER, 1.0),
        ProductionDecision(int(rng.integers(0, n_opt)), 0.5),
    ][int(rng.integers(0, 3))]
    quota = None if rng.random() < 0.5 else float(rng.integers(0, 20))
    request = MirrorRequest(2, f"r{i}", 1.7e9 + i, state, workload, options, production, quota)
    validate_request(request)
    return request


@pytest.fixture(scope="module")
def pool() -> list[MirrorRequest]:
    rng = np.random.default_rng(20261130)
    return [_request(rng, i) for i in range(300)]


def _batches(pool: Sequence[MirrorRequest]) -> list[tuple[MirrorRequest, ...]]:
    """Consecutive slices of every size, random compositions with repeats, synthetic ones."""
    out = [
        tuple(pool[s : s + size]) for size in (1, 2, 7, 16, 64, 256) for s in range(0, 300, size)
    ]
    rng = np.random.default_rng(3)
    for _ in range(30):
        picks = rng.integers(0, len(pool), int(rng.integers(1, 80)))
        out.append(tuple(pool[int(k)] for k in picks))
    out.append(tuple(random_requests(0, 40)))
    out.append(())
    return out


def assert_same_bytes(got: NDArray[np.generic], expected: NDArray[np.generic], what: str) -> None:
    """Same dtype, shape and bytes (so NaNs and signed zeros count too)."""
    assert got.dtype == expected.dtype, what
    assert got.shape == expected.shape, what
    if got.tobytes() != expected.tobytes():
        index = np.argwhere(got != expected)
        pytest.fail(f"{what}: first difference at {index[0].tolist() if len(index) else '?'}")


def reference_predictor_rows(requests: Sequence[MirrorRequest]) -> NDArray[np.float32]:
    if not requests:
        return np.zeros((0, N_PREDICTOR_FEATURES), dtype=np.float32)
    return np.concatenate([_request_features(r) for r in requests])


def reference_outcome_rows(requests: Sequence[MirrorRequest]) -> NDArray[np.float32]:
    if not requests:
        return np.zeros((0, N_OUTCOME_FEATURES), dtype=np.float32)
    gavel = reference_predictor_rows(requests)
    extra = np.concatenate([placement_columns(r) for r in requests]).astype(np.float32)
    return np.concatenate([gavel, extra], axis=1)


@pytest.fixture(scope="module")
def device_cases() -> list[FeasibilityItem]:
    """Contract-v2 cases: devices sent or derived, shares, named devices (feasibility only)."""
    return random_cases(20261203, 400)


def test_the_pool_covers_what_the_batched_forms_must_handle(
    pool: list[MirrorRequest], device_cases: list[FeasibilityItem]
) -> None:
    """Guard against a generator that stopped producing the hard cases."""
    checks = [check_feasibility(r.state, r.workload, r.options, r.quota_remaining) for r in pool]
    checks += [check_feasibility(*case) for case in device_cases]
    violations = np.concatenate([c.violations for c in checks])
    fired = [bool(violations[:, k].any()) for k in range(len(SIGNALS))]
    assert all(fired), [s for s, hit in zip(SIGNALS, fired, strict=True) if not hit]
    assert any(c.mask.any() for c in checks)
    assert any(r.state.n_nodes == 1 for r in pool)
    assert any((r.options.nodes_per_option > 1).any() for r in pool)
    assert {r.workload.model_family for r in pool} == set(FAMILIES)


def test_predictor_features_match_the_per_request_rows(pool: list[MirrorRequest]) -> None:
    fresh = PredictorFeatureFunction()
    for batch in _batches(pool):
        expected = reference_predictor_rows(batch)
        assert_same_bytes(fresh(list(batch)), expected, f"list of {len(batch)}")
        assert_same_bytes(fresh(batch), expected, f"tuple of {len(batch)}")


def test_outcome_features_match_the_per_request_rows(pool: list[MirrorRequest]) -> None:
    fresh = OutcomeFeatureFunction()
    for batch in _batches(pool):
        expected = reference_outcome_rows(batch)
        assert_same_bytes(fresh(list(batch)), expected, f"list of {len(batch)}")
        assert_same_bytes(fresh(batch), expected, f"tuple of {len(batch)}")


def test_rows_of_one_scorer_batch_are_shared_read_only_and_never_stale(
    pool: list[MirrorRequest],
) -> None:
    batch = tuple(pool[:16])
    first = OUTCOME_FEATURES(batch)
    assert OUTCOME_FEATURES(batch) is first
    assert not first.flags.writeable
    other = tuple(pool[16:32])
    assert_same_bytes(OUTCOME_FEATURES(other), reference_outcome_rows(other), "next batch")
    assert OUTCOME_FEATURES(tuple(pool[:16])) is not first  # equal, but another tuple
    listed = list(pool[:16])  # a list can change in place: never kept
    rows = PREDICTOR_FEATURES(listed)
    assert rows.flags.writeable
    listed[0] = pool[40]
    assert_same_bytes(PREDICTOR_FEATURES(listed), reference_predictor_rows(listed), "edited list")


def _assert_same_feasibility(items: Sequence[FeasibilityItem]) -> None:
    got = check_feasibility_batch(items)
    parts = [check_feasibility(*item) for item in items]
    mask = np.concatenate([p.mask for p in parts]) if parts else np.zeros(0, bool)
    violations = (
        np.concatenate([p.violations for p in parts])
        if parts
        else np.zeros((0, len(SIGNALS)), bool)
    )
    assert_same_bytes(got.mask, mask, "mask")
    assert_same_bytes(got.violations, violations, "violations")


def test_feasibility_matches_the_per_request_check(pool: list[MirrorRequest]) -> None:
    for batch in _batches(pool):
        _assert_same_feasibility(
            [(r.state, r.workload, r.options, r.quota_remaining) for r in batch]
        )


def test_feasibility_with_devices_matches_the_per_request_check(
    pool: list[MirrorRequest], device_cases: list[FeasibilityItem]
) -> None:
    """Devices sent and derived, shares and named devices, mixed with version-1 requests."""
    rng = np.random.default_rng(11)
    v1 = [(r.state, r.workload, r.options, r.quota_remaining) for r in pool]
    for size in (1, 2, 7, 16, 64):
        for start in range(0, len(device_cases), size):
            _assert_same_feasibility(device_cases[start : start + size])
    for _ in range(30):
        picks = rng.integers(0, len(device_cases) + len(v1), int(rng.integers(1, 80)))
        both = [*device_cases, *v1]
        _assert_same_feasibility([both[int(k)] for k in picks])


def test_feasibility_compares_in_each_state_s_own_precision(pool: list[MirrorRequest]) -> None:
    """A need a hair above a float32 value equals it in float32: the option stays feasible."""
    base = pool[1]
    node = int(base.options.node_index[0])
    free = float(base.state.cpu_free[node])
    edge = math.nextafter(free, math.inf)
    assert np.float32(edge) == base.state.cpu_free[node] and edge > free
    tight = dataclasses.replace(
        base.workload,
        cpu_per_node=edge,
        memory_per_node_gb=0.0,
        accelerators=0,
        allowed_hardware=frozenset(),
        affinity=frozenset(),
        anti_affinity=frozenset(),
    )
    one = single_node_options(np.array([node], dtype=np.int32), 0)
    cpu = SIGNALS.index(ConstraintSignal.CPU)
    assert not check_feasibility(base.state, tight, one).violations[0, cpu]
    wide = dataclasses.replace(
        base.state,
        cpu_free=base.state.cpu_free.astype(np.float64),
        memory_free_gb=base.state.memory_free_gb.astype(np.float64),
    )
    assert check_feasibility(wide, tight, one).violations[0, cpu]
    whole = dataclasses.replace(base.state, cpu_free=base.state.cpu_free.astype(np.int64))
    cases: list[list[FeasibilityItem]] = [
        [(base.state, tight, one, None)],
        [(base.state, tight, one, None), (base.state, tight, base.options, 3.0)],
        [(wide, tight, one, None), (base.state, tight, one, 3.0)],
        [(whole, tight, one, None), (base.state, base.workload, base.options, None)],
        [(whole, tight, one, None), (whole, base.workload, base.options, 2.0)],
        [(wide, tight, one, None), (wide, base.workload, base.options, 2.0)],
    ]
    for items in cases:
        _assert_same_feasibility(items)


def reference_decisions(
    batch: ScoringBatch, policy: Policy, run: PolicyRun, latency_us: float
) -> list[ScoredDecision]:
    """One request at a time: the draw, the chosen and production's probabilities."""
    d = run.decisions
    out = []
    for r, request in enumerate(batch.requests):
        start, end = int(batch.offsets[r]), int(batch.offsets[r + 1])
        probs = np.asarray(d.probabilities[start:end], dtype=np.float64)
        defer_p = float(d.defer_probability[r])
        chosen = DEFER
        if d.status[r] != DecisionStatus.ERROR:
            u = decision_uniform(request.request_id, str(policy.name), str(policy.version))
            chosen = _draw(probs, defer_p, u)
        production = request.production
        prod_p: float | None = None
        if production is not None:
            prod_p = defer_p if production.option == DEFER else float(probs[production.option])
        out.append(
            ScoredDecision(
                request_id=request.request_id,
                request_time=request.request_time,
                policy=str(policy.name),
                policy_version=str(policy.version),
                status=d.status[r],
                chosen=chosen,
                chosen_probability=defer_p if chosen == DEFER else float(probs[chosen]),
                production_probability=prod_p,
                defer_probability=defer_p,
                scores=np.asarray(d.scores[start:end], dtype=np.float32),
                probabilities=probs,
                raw_favourite_infeasible=bool(d.raw_favourite_infeasible[r]),
                agrees_with_production=None if production is None else chosen == production.option,
                latency_us=latency_us,
                predictions=(
                    {k: np.asarray(v[start:end], np.float32) for k, v in d.predictions.items()}
                    if d.predictions
                    else None
                ),
                error=run.error,
            )
        )
    return out


def assert_same_decision(got: ScoredDecision, expected: ScoredDecision) -> None:
    """Every field equal: arrays byte for byte, numbers with their Python type."""
    for field in dataclasses.fields(ScoredDecision):
        a, b = getattr(got, field.name), getattr(expected, field.name)
        what = f"{expected.request_id}/{expected.policy}.{field.name}"
        if isinstance(b, np.ndarray):
            assert_same_bytes(a, b, what)
        elif isinstance(b, dict):
            assert a.keys() == b.keys(), what
            for k in b:
                assert_same_bytes(a[k], b[k], f"{what}[{k}]")
        elif isinstance(b, float) and math.isnan(b):
            assert isinstance(a, float) and math.isnan(a), what
        else:
            assert type(a) is type(b) and a == b, what


def test_decisions_match_a_per_request_split(pool: list[MirrorRequest], registry: Registry) -> None:
    """Every policy of the registry (ONNX, planner, baselines) on varied batches."""
    policies = list(registry.policies.values())
    assert len(policies) >= 6
    checked = 0
    unicode_ids = tuple(
        dataclasses.replace(r, request_id=f"ünï-{k}-✓") for k, r in enumerate(pool[:20])
    )
    for requests in [*_batches(pool)[::5], unicode_ids]:
        batch = make_batch(requests, DEFAULT_FEATURES)
        runs = decide_all(policies, batch, seed=0)
        for policy in policies:
            run = runs[str(policy.name)]
            got = _per_request(batch, policy, run, 12.5)
            expected = reference_decisions(batch, policy, run, 12.5)
            assert len(got) == len(expected)
            for g, e in zip(got, expected, strict=True):
                assert_same_decision(g, e)
                checked += 1
    assert checked > 1000


def test_score_requests_logs_what_the_per_request_reference_logs(registry: Registry) -> None:
    """The whole path, features to decisions, on one realistic batch."""
    policies = list(registry.policies.values())
    requests = random_requests(5, 24)
    batch, decisions, runs = score_requests(requests, policies, DEFAULT_FEATURES)
    checks = [
        check_feasibility(r.state, r.workload, r.options, r.quota_remaining) for r in requests
    ]
    assert_same_bytes(batch.mask, np.concatenate([c.mask for c in checks]), "mask")
    by_policy = {r.policy: r for r in runs}
    n = len(requests)
    for i, policy in enumerate(policies):
        run = by_policy[str(policy.name)]
        expected = reference_decisions(batch, policy, run, run.latency_s * 1e6 / n)
        for g, e in zip(decisions[i * n : (i + 1) * n], expected, strict=True):
            assert_same_decision(g, e)


def test_policy_generators_are_the_seeded_streams() -> None:
    for seed in (0, 1, 12345):
        for name in ("gavel-scorer", "random-feasible", "ü"):
            salt = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
            expected = np.random.default_rng([seed, salt]).random(5)
            np.testing.assert_array_equal(policy_rng(seed, name).random(5), expected)
            # a fresh generator every call, not a shared one that has moved on
            np.testing.assert_array_equal(policy_rng(seed, name).random(5), expected)
