"""Hardware classes as data, not an enum.

A node's hardware is described by capability numbers, so a class Understudy has
never seen (a new accelerator generation, a new CPU pool) is accepted, can be
featurised like any other, and is flagged as unknown for drift reports rather
than refused.

Capability numbers of the known classes are vendor datasheet figures per
accelerator: dense tensor throughput at the best precision the part supports
for training (FP16/BF16; FP32 for K80, which has no tensor cores), memory
bandwidth, and the accelerator-to-accelerator link inside one node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from service.contract.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class HardwareClass:
    """Capabilities of one accelerator of a class (or of the host, for CPU pools).

    A capability number Runtime does not know (unpublished hardware, a new
    partition profile) is None, never zero: zero would turn an accelerator
    into a CPU pool. Features carry an explicit "unknown" indicator and a
    documented imputation (docs/contract.md, "Unknown capabilities").

    Attributes:
        name: Runtime's name for the class, e.g. ``"A100-80GB"``; a partition
            (MIG-style slice) is its own class, e.g. ``"A100-80GB-3g.40gb"``.
        accelerator_memory_gb: memory per accelerator in GB; 0 for CPU-only pools;
            None = unknown.
        peak_dense_tflops: peak dense throughput per accelerator, TFLOP/s; None = unknown.
        memory_bandwidth_gbps: accelerator memory bandwidth, GB/s; None = unknown.
        interconnect_gbps: accelerator-to-accelerator bandwidth within a node, GB/s;
            None = unknown.
    """

    name: str
    accelerator_memory_gb: float | None
    peak_dense_tflops: float | None
    memory_bandwidth_gbps: float | None
    interconnect_gbps: float | None

    def validate(self, where: str) -> None:
        """Raise `InvalidInput` naming `where` unless every known capability is finite and >= 0."""
        if not self.name or not self.name.strip():
            raise InvalidInput(f"{where}.name", "must be a non-empty string")
        for attr in (
            "accelerator_memory_gb",
            "peak_dense_tflops",
            "memory_bandwidth_gbps",
            "interconnect_gbps",
        ):
            value = getattr(self, attr)
            if value is None:
                continue
            if not math.isfinite(value):
                raise InvalidInput(f"{where}.{attr}", f"must be finite, got {value}")
            if value < 0:
                raise InvalidInput(f"{where}.{attr}", f"must be >= 0, got {value}")

    @property
    def has_accelerators(self) -> bool:
        """Whether the class offers accelerators at all (CPU pools, memory 0, do not).

        Unknown memory counts as an accelerator class: only a stated 0 makes a CPU pool.
        """
        return self.accelerator_memory_gb is None or self.accelerator_memory_gb > 0

    @property
    def unknown_capabilities(self) -> tuple[str, ...]:
        """Names of the capability numbers that are None (unknown)."""
        return tuple(a for a in CAPABILITIES if getattr(self, a) is None)


CAPABILITIES: tuple[str, ...] = (
    "accelerator_memory_gb",
    "peak_dense_tflops",
    "memory_bandwidth_gbps",
    "interconnect_gbps",
)
"""The capability numbers of a class, in wire order."""

_KNOWN = (
    HardwareClass("H100-SXM", 80.0, 989.0, 3350.0, 900.0),
    HardwareClass("A100-80GB", 80.0, 312.0, 2039.0, 600.0),
    HardwareClass("A100-40GB", 40.0, 312.0, 1555.0, 600.0),
    HardwareClass("V100-32GB", 32.0, 125.0, 900.0, 300.0),
    HardwareClass("V100", 16.0, 125.0, 900.0, 300.0),
    HardwareClass("P100", 16.0, 18.7, 732.0, 160.0),
    HardwareClass("T4", 16.0, 65.0, 320.0, 32.0),
    HardwareClass("K80", 12.0, 4.4, 240.0, 16.0),
    HardwareClass("CPU", 0.0, 3.0, 200.0, 0.0),
)

KNOWN_HARDWARE: Mapping[str, HardwareClass] = MappingProxyType({h.name: h for h in _KNOWN})
"""Classes the shipped policies were designed around; others are accepted and flagged."""


def is_known_class(hardware: HardwareClass) -> bool:
    """True when `hardware` matches a known class by name and capabilities.

    A known name with different capability numbers counts as unknown: the
    numbers, not the name, are what features and policies consume.
    """
    return KNOWN_HARDWARE.get(hardware.name) == hardware
