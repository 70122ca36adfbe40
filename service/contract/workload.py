"""The workload Runtime is placing."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class WorkloadKind(StrEnum):
    """The workload kinds the shipped policies know; placement trade-offs differ by kind.

    The contract's vocabulary is open (issue 22): `Workload.kind` is any bounded
    string, an unknown one is accepted, featurised as "other", counted and
    flagged by drift as unseen, as unseen hardware already is. These are the
    documented known values.
    """

    TRAIN = "train"
    FINETUNE = "finetune"
    INFER = "infer"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class Workload:
    """One job asking for a placement.

    Attributes:
        workload_id: Runtime's job id.
        kind: open vocabulary; known values in `WorkloadKind` (train / finetune /
            infer / batch); others are accepted and featurised as "other".
        model_family: e.g. ``"ResNet-50"``, ``"Transformer"``, ``"LM"``.
        model_size_b: model parameters, billions.
        accelerators: whole accelerator devices requested in total (across the gang);
            0 for a CPU job or a share job.
        accelerator_memory_gb: memory needed on each accelerator, GB.
        cpu_per_node: host CPU cores needed on every node of the placement.
        memory_per_node_gb: host memory needed on every node of the placement.
        gang_size: the most nodes one option of the job may span (1 = single node
            only); a schema-2 option spanning more is refused (docs/contract.md,
            "Gang size"). Features read the shape from the options, not from this.
        priority: higher is more important; Runtime's scale.
        tenant: owner of the job, for quota and slicing.
        slo_seconds: completion deadline from submission, seconds; None = no SLO.
        work_units: size of the job in its own units (e.g. training steps), if known.
        allowed_hardware: hardware class names the job may run on; empty = any.
        affinity: node labels (``"key=value"``) every node of the placement must carry.
        anti_affinity: node labels no node of the placement may carry.
        accelerator_share: for a job that asks for a *share* of one device (fractional
            GPU sharing, time-slicing), the share of that device's compute, in (0, 1];
            with it, ``accelerators`` is 0 and ``accelerator_memory_gb`` is the memory
            it needs on that device. None = the job asks for whole devices.
        qos_class: Runtime's quality-of-service class (open vocabulary; known values
            in `KNOWN_QOS_CLASSES`); empty = not given.
    """

    workload_id: str
    kind: str
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
    accelerator_share: float | None = None
    qos_class: str = ""

    @property
    def is_share(self) -> bool:
        """Whether the job asks for a share of one device rather than whole devices."""
        return self.accelerator_share is not None

    @property
    def kind_known(self) -> bool:
        """Whether `kind` is one of the documented `WorkloadKind` values."""
        return self.kind in _KNOWN_KINDS


_KNOWN_KINDS = frozenset(k.value for k in WorkloadKind)

KNOWN_QOS_CLASSES: tuple[str, ...] = ("LS", "BE", "Burstable", "Guaranteed", "BestEffort")
"""QoS classes documented in docs/contract.md: Alibaba's latency-sensitive / best-effort and
Kubernetes' pod QoS classes. Others are accepted and featurised as "other"."""


def workload_from_fields(
    src: Any,
    kind: str,
    slo_seconds: float | None,
    work_units: float | None,
    accelerator_share: float | None = None,
    qos_class: str = "",
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
        accelerator_share=accelerator_share,
        qos_class=qos_class,
    )
