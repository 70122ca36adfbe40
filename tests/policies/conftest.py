"""Sample batches built from contract objects: a small, realistic K80/P100/V100 cluster.

Twelve nodes in two zones: four K80 servers (8 GPUs), four P100 (4 GPUs),
four V100 (8 GPUs). One K80 drains, one P100 is unhealthy, one V100 is in a
reserved pool. Requests cover a 1-GPU job, a 4-GPU job, an 8-GPU gang with
two-node options, an anti-affinity rule with a quota, a job nothing can hold,
and a request mirrored before Runtime decided (no production decision).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from service.contract import (
    KNOWN_HARDWARE,
    SCHEMA_VERSION,
    ClusterState,
    MirrorRequest,
    PlacementOptions,
    ProductionDecision,
    Workload,
    WorkloadKind,
    validate_request,
)
from service.learning.build_models.gavel import isolated_csv_path
from service.policies.base import ScoringBatch
from service.policies.batching import make_batch
from service.policies.registry import Registry, load_registry
from service.policies.synthetic import random_requests

REPO_ROOT = Path(__file__).resolve().parents[2]
POLICIES_DIR = REPO_ROOT / "policies"

#            id        class   total free  util  queue healthy drain  zone  rack  labels
NODES = [
    ("k80-0", "K80", 8, 8, 0.10, 0, True, False, "a", "r1", "pool=shared"),
    ("k80-1", "K80", 8, 4, 0.55, 2, True, False, "a", "r1", "pool=shared"),
    ("k80-2", "K80", 8, 2, 0.80, 5, True, False, "a", "r2", "pool=shared"),
    ("k80-3", "K80", 8, 8, 0.00, 0, True, True, "a", "r2", "pool=shared"),
    ("p100-0", "P100", 4, 4, 0.20, 1, True, False, "b", "r3", "pool=shared"),
    ("p100-1", "P100", 4, 4, 0.05, 0, True, False, "b", "r3", "pool=shared"),
    ("p100-2", "P100", 4, 4, 0.00, 0, False, False, "b", "r3", "pool=shared"),
    ("p100-3", "P100", 4, 1, 0.90, 3, True, False, "b", "r4", "pool=shared"),
    ("v100-0", "V100", 8, 8, 0.30, 1, True, False, "b", "r4", "pool=shared"),
    ("v100-1", "V100", 8, 6, 0.40, 0, True, False, "b", "r4", "pool=shared"),
    ("v100-2", "V100", 8, 3, 0.70, 4, True, False, "a", "r1", "pool=shared"),
    ("v100-3", "V100", 8, 8, 0.00, 0, True, False, "b", "r4", "pool=reserved"),
]
NODE_INDEX = {n[0]: i for i, n in enumerate(NODES)}


def make_cluster() -> ClusterState:
    """The twelve-node cluster of the module docstring."""
    classes = ("K80", "P100", "V100")
    n = len(NODES)
    return ClusterState(
        node_ids=tuple(r[0] for r in NODES),
        hardware=tuple(KNOWN_HARDWARE[c] for c in classes),
        node_hardware=np.array([classes.index(r[1]) for r in NODES], dtype=np.int32),
        accelerators_free=np.array([r[3] for r in NODES], dtype=np.int32),
        accelerators_total=np.array([r[2] for r in NODES], dtype=np.int32),
        cpu_free=np.full(n, 48.0, dtype=np.float32),
        cpu_total=np.full(n, 64.0, dtype=np.float32),
        memory_free_gb=np.full(n, 400.0, dtype=np.float32),
        memory_total_gb=np.full(n, 512.0, dtype=np.float32),
        utilisation=np.array([r[4] for r in NODES], dtype=np.float32),
        queue_length=np.array([r[5] for r in NODES], dtype=np.int32),
        healthy=np.array([r[6] for r in NODES], dtype=bool),
        draining=np.array([r[7] for r in NODES], dtype=bool),
        zone=tuple(f"zone-{r[8]}" for r in NODES),
        locality=tuple(r[9] for r in NODES),
        labels=tuple(frozenset({r[10]}) for r in NODES),
    )


def options(*placements: tuple[tuple[str, int], ...]) -> PlacementOptions:
    """Options from ``((node id, accelerators), ...)`` groups, one group per option."""
    sizes = [len(p) for p in placements]
    return PlacementOptions(
        node_offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        node_index=np.array([NODE_INDEX[n] for p in placements for n, _ in p], dtype=np.int32),
        accelerators=np.array([a for p in placements for _, a in p], dtype=np.int32),
        option_ids=tuple(f"opt-{i}" for i in range(len(placements))),
    )


def workload(job: str, accelerators: int, memory_gb: float, **kw: object) -> Workload:
    """A training workload named the Gavel way (``"LM (batch size 20)"``)."""
    fields: dict[str, object] = {
        "workload_id": f"w-{job}-{accelerators}",
        "kind": WorkloadKind.TRAIN,
        "model_family": job,
        "model_size_b": 0.03,
        "accelerators": accelerators,
        "accelerator_memory_gb": memory_gb,
        "cpu_per_node": 4.0,
        "memory_per_node_gb": 32.0,
        "gang_size": 1,
        "priority": 5,
        "tenant": "team-a",
        "work_units": 50_000.0,
    }
    fields.update(kw)
    return Workload(**fields)  # type: ignore[arg-type]


def request(
    rid: str,
    w: Workload,
    opts: PlacementOptions,
    production: int | None = 0,
    quota: float | None = None,
) -> MirrorRequest:
    """A validated request on the shared cluster."""
    r = MirrorRequest(
        schema_version=SCHEMA_VERSION,
        request_id=rid,
        request_time=1_750_000_000.0,
        state=CLUSTER,
        workload=w,
        options=opts,
        production=None if production is None else ProductionDecision(production, 0.5),
        quota_remaining=quota,
    )
    validate_request(r)
    return r


CLUSTER = make_cluster()
SINGLE = tuple(((n[0], 1),) for n in NODES)


def sample_requests() -> list[MirrorRequest]:
    """Six requests: capacity, drain, health, memory and anti-affinity all fire somewhere."""
    return [
        request("r-resnet50", workload("ResNet-50 (batch size 64)", 1, 8.0), options(*SINGLE), 8),
        request(
            "r-transformer",
            workload("Transformer (batch size 128)", 4, 10.0),
            options(*(((n[0], 4),) for n in NODES)),
            9,
        ),
        request(
            "r-lm-gang",
            workload("LM (batch size 20)", 8, 6.0, gang_size=2),
            options(
                (("v100-0", 8),),
                (("k80-0", 8),),
                (("k80-3", 8),),
                (("v100-1", 4), ("v100-2", 4)),
                (("p100-0", 4), ("p100-1", 4)),
                (("k80-0", 4), ("v100-0", 4)),
            ),
            0,
        ),
        request(
            "r-recommendation",
            workload(
                "Recommendation (batch size 2048)",
                1,
                4.0,
                anti_affinity=frozenset({"pool=reserved"}),
            ),
            options(*SINGLE),
            4,
            quota=2.0,
        ),
        request("r-too-big", workload("ResNet-18 (batch size 256)", 1, 40.0), options(*SINGLE), -1),
        request("r-before", workload("CycleGAN", 1, 6.0), options(*SINGLE[:6]), None),
    ]


@pytest.fixture(scope="session")
def requests() -> list[MirrorRequest]:
    """The six sample requests."""
    return sample_requests()


@pytest.fixture(scope="session")
def batch(requests: list[MirrorRequest]) -> ScoringBatch:
    """The sample requests as one scoring batch."""
    return make_batch(requests)


@pytest.fixture(scope="session")
def decided_batch(requests: list[MirrorRequest]) -> ScoringBatch:
    """Sample requests that all carry a production decision (for conformance checks)."""
    return make_batch([r for r in requests if r.production is not None])


@pytest.fixture(scope="session")
def large_batch() -> ScoringBatch:
    """16 requests x 50 options each, synthetic: the latency benchmark's shape."""
    return make_batch(random_requests(seed=7, n_requests=16, n_nodes=64, max_options=50))


@pytest.fixture(scope="session")
def gavel_csv() -> Iterator[Path]:
    """The shared Gavel CSV; tests that need it skip where the data is not mounted."""
    path = isolated_csv_path()
    if not path.exists():
        pytest.skip(f"Gavel data not found at {path} (set UNDERSTUDY_SHARED_DATA)")
    yield path


def replace_workload(r: MirrorRequest, **changes: object) -> MirrorRequest:
    """`r` with its workload fields changed."""
    return dataclasses.replace(r, workload=dataclasses.replace(r.workload, **changes))  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def registry() -> Registry:
    """The committed policies, loaded the way the service loads them."""
    return load_registry(POLICIES_DIR)
