"""The workload Runtime is placing."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


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
