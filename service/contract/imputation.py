"""What a feature uses for a capability number Runtime does not know (None).

Contract v2 lets a hardware class leave a capability number unknown (None,
never 0: zero would turn an accelerator into a CPU pool). A feature function
still needs a number, so every one in the project (the contract's
`features-v2`, the Gavel predictor's and the outcome predictor's) imputes the
same value, defined here once, and the contract's features add explicit
"unknown" indicator columns so a learner can tell an imputed number from a
measured one.

The imputed value of each number is the **median over the known accelerator
classes** of `KNOWN_HARDWARE` (every known class with accelerator memory > 0;
the CPU pool is left out because a class whose memory is unknown counts as an
accelerator class, `HardwareClass.has_accelerators`). Why the median: it is a
middle-of-the-fleet accelerator (memory 24 GB, 125 TFLOP/s, 900 GB/s, 300
GB/s link: about a V100), so on that number alone an unknown class looks
neither like the best part (which would attract every policy to untested
hardware) nor like the worst (which would starve it), and unlike the mean it
is not pulled up by one outlier (H100). The values are computed from
`KNOWN_HARDWARE`, and the contract's feature hash covers them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from types import MappingProxyType

from service.contract.hardware import CAPABILITIES, KNOWN_HARDWARE, HardwareClass


def _median_of_known_accelerators() -> dict[str, float]:
    classes = [
        h
        for h in KNOWN_HARDWARE.values()
        if h.accelerator_memory_gb is not None and h.accelerator_memory_gb > 0
    ]
    out: dict[str, float] = {}
    for name in CAPABILITIES:
        values = [getattr(h, name) for h in classes]
        out[name] = float(statistics.median(v for v in values if v is not None))
    return out


IMPUTED_CAPABILITIES: Mapping[str, float] = MappingProxyType(_median_of_known_accelerators())
"""Capability name -> the number used when a class leaves it unknown (module docstring)."""


def capability_numbers(hardware: HardwareClass) -> tuple[float, float, float, float]:
    """(memory GB, peak TFLOP/s, bandwidth GB/s, link GB/s), unknown ones imputed."""
    memory, tflops, bandwidth, link = (
        IMPUTED_CAPABILITIES[name] if value is None else float(value)
        for name, value in ((n, getattr(hardware, n)) for n in CAPABILITIES)
    )
    return memory, tflops, bandwidth, link


__all__ = ["IMPUTED_CAPABILITIES", "capability_numbers"]
