"""The workload Runtime is placing."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class WorkloadKind(StrEnum):
    """What the job does; placement trade-offs differ by kind."""

    TRAIN = "train"
    FINETUNE = "finetune"
    INFER = "infer"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class Workload:
    """One job asking for a placement.

    Attributes:
        workload_id: Runtime's job id.
        kind: train / finetune / infer / batch.
        model_family: e.g. ``"ResNet-50"``, ``"Transformer"``, ``"LM"``.
        model_size_b: model parameters, billions.
        accelerators: accelerators requested in total (across the gang).
        accelerator_memory_gb: memory needed on each accelerator, GB.
        cpu_per_node: host CPU cores needed on every node of the placement.
        memory_per_node_gb: host memory needed on every node of the placement.
        gang_size: nodes the job spans when spread (1 = single node).
        priority: higher is more important; Runtime's scale.
        tenant: owner of the job, for quota and slicing.
        slo_seconds: completion deadline from submission, seconds; None = no SLO.
        work_units: size of the job in its own units (e.g. training steps), if known.
        allowed_hardware: hardware class names the job may run on; empty = any.
        affinity: node labels (``"key=value"``) every node of the placement must carry.
        anti_affinity: node labels no node of the placement may carry.
    """

    workload_id: str
    kind: WorkloadKind
    model_family: str
    model_size_b: float
    accelerators: int
    accelerator_memory_gb: float
    cpu_per_node: float
    memory_per_node_gb: float
    gang_size: int
    priority: int
    tenant: str
    slo_seconds: float | None = None
    work_units: float | None = None
    allowed_hardware: frozenset[str] = field(default_factory=frozenset)
    affinity: frozenset[str] = field(default_factory=frozenset)
    anti_affinity: frozenset[str] = field(default_factory=frozenset)


def workload_from_fields(
    src: Any, kind: WorkloadKind, slo_seconds: float | None, work_units: float | None
) -> Workload:
    """A `Workload` from either wire form; the caller decodes the kind and optional fields,
    whose encodings differ (a protobuf enum and presence bits, JSON strings and nulls)."""
    return Workload(
        workload_id=src.workload_id,
        kind=kind,
        model_family=src.model_family,
        model_size_b=src.model_size_b,
        accelerators=src.accelerators,
        accelerator_memory_gb=src.accelerator_memory_gb,
        cpu_per_node=src.cpu_per_node,
        memory_per_node_gb=src.memory_per_node_gb,
        gang_size=src.gang_size,
        priority=src.priority,
        tenant=src.tenant,
        slo_seconds=slo_seconds,
        work_units=work_units,
        allowed_hardware=frozenset(src.allowed_hardware),
        affinity=frozenset(src.affinity),
        anti_affinity=frozenset(src.anti_affinity),
    )
