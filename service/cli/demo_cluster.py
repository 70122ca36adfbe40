"""What the demo's simulated cluster looks like in contract v2: devices, shares, partitions.

Printed before the traffic so a newcomer sees that the requests carry
per-device state (shared GPUs partly taken, a MIG-style partition class with
its own capability numbers) and how many ask for a share of one GPU.
"""

from __future__ import annotations

import numpy as np

from service.contract import MirrorRequest, Outcome


def cluster_lines(events: list[MirrorRequest | Outcome]) -> list[str]:
    """Lines describing the devices and share requests of the demo's traffic."""
    requests = [e for e in events if isinstance(e, MirrorRequest)]
    if not requests:
        return []
    share = sum(r.workload.is_share for r in requests)
    first = requests[0].state
    partly = [
        int(((r.state.device_free_share > 0) & (r.state.device_free_share < 1)).sum())
        for r in requests
        if r.state.has_devices
    ]
    lines = [
        f"cluster: {first.n_nodes} nodes, {len(first.device_hardware)} devices "
        f"(schema v{requests[0].schema_version}); {share} of {len(requests)} requests "
        "are share requests (a share of one GPU, accelerators = 0)",
        f"shared devices: up to {max(partly, default=0)} partly taken at once "
        f"(mean {np.mean(partly) if partly else 0:.1f} per request)",
    ]
    classes = np.unique(np.asarray(first.device_hardware))
    for c in classes:
        h = first.hardware[int(c)]
        n = int((np.asarray(first.device_hardware) == c).sum())
        numbers = ", ".join(
            f"{k} {'unknown' if v is None else f'{v:g}'}"
            for k, v in (
                ("memory GB", h.accelerator_memory_gb),
                ("TFLOP/s", h.peak_dense_tflops),
                ("GB/s", h.memory_bandwidth_gbps),
                ("link GB/s", h.interconnect_gbps),
            )
        )
        lines.append(f"  {n:3d} x {h.name}: {numbers}")
    return lines
