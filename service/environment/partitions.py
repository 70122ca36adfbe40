"""MIG-style partitions: a GPU cut into slices, each slice a device of its own class.

Only NVIDIA's published profile figures are used (A100 80 GB MIG user guide):
a profile ``<c>g.<m>gb`` has ``c`` of the GPU's 7 compute slices, ``m`` GB of
memory (a share of its 8 memory slices, hence of its bandwidth), and a most
number of instances per GPU. A slice's capability numbers are the parent
class's datasheet numbers scaled by those fractions; a slice has no NVLink of
its own, so its interconnect number is unknown (None), not 0.

Gavel measured no A100 and no partition, so no simulated job is *allowed* on
a partition class (its rates are unmeasured; the contract's
``hardware_compatibility`` masks it): the partitioned node is in every request,
as in a real fleet, and no number is made up for how fast a job would run there.
A whole known class Gavel did not measure (A100, H100, ...) is rated instead
by `scale_from_v100`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from service.contract import KNOWN_HARDWARE, HardwareClass
from service.environment.data import GAVEL_WORKER_TYPES


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile of a parent class (published figures)."""

    compute_slices: int
    memory_slices: int
    memory_gb: float
    per_gpu: int


MIG_PROFILES: Mapping[tuple[str, str], MigProfile] = MappingProxyType(
    {
        ("A100-80GB", "1g.10gb"): MigProfile(1, 1, 10.0, 7),
        ("A100-80GB", "2g.20gb"): MigProfile(2, 2, 20.0, 3),
        ("A100-80GB", "3g.40gb"): MigProfile(3, 4, 40.0, 2),
        ("A100-80GB", "7g.80gb"): MigProfile(7, 8, 80.0, 1),
    }
)
"""(parent class, profile) -> its slices; the GPU has 7 compute and 8 memory slices."""


def partition_class(hardware: str, profile: str) -> HardwareClass:
    """The class of one slice: ``"<hardware>-<profile>"`` with scaled datasheet numbers."""
    parent = KNOWN_HARDWARE[hardware]
    p = MIG_PROFILES[(hardware, profile)]
    tflops = parent.peak_dense_tflops
    bandwidth = parent.memory_bandwidth_gbps
    return HardwareClass(
        f"{hardware}-{profile}",
        p.memory_gb,
        None if tflops is None else tflops * p.compute_slices / 7.0,
        None if bandwidth is None else bandwidth * p.memory_slices / 8.0,
        None,
    )


def scale_from_v100(cls: HardwareClass) -> float:
    """Rate multiplier from V100 for a class Gavel never measured (documented rule).

    ``min(peak_dense_tflops / V100's, memory_bandwidth_gbps / V100's)``: the
    slower of the two datasheet ratios (training steps of these models are
    bound by one or the other; the smaller is the cautious guess). V100 is
    Gavel's fastest measured class and the nearest by generation to every newer
    one. NaN where the class states neither number, and for a partition (a
    class outside `KNOWN_HARDWARE`): a slice's isolation and memory-slice
    effects on step time are not in any data, so it has no rate and stays
    masked (``hardware_compatibility``), as the demo shows. Measured: 1 (unused).
    """
    if cls.name in GAVEL_WORKER_TYPES:
        return 1.0
    if cls.name not in KNOWN_HARDWARE:
        return float("nan")
    v100 = KNOWN_HARDWARE["V100"]
    ratios = [
        a / b
        for a, b in (
            (cls.peak_dense_tflops, v100.peak_dense_tflops),
            (cls.memory_bandwidth_gbps, v100.memory_bandwidth_gbps),
        )
        if a is not None and b is not None and a > 0
    ]
    return min(ratios) if ratios else float("nan")
