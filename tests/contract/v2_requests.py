"""Contract-v2 variants of a valid request, for the wire and bad-input tests.

Built from a valid request by `dataclasses.replace`, so each variant differs
from a request the suite already trusts only in the v2 fields it exercises.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from service.contract import HardwareClass, MirrorRequest, ProductionDecision
from service.contract.devices import node_devices
from service.contract.state import frozen_array


def with_devices(request: MirrorRequest) -> MirrorRequest:
    """`request` with per-device data: the shortcut's devices, but every taken device
    partly free (share 0.25, a quarter of its memory) and named ``gpu<k>``; the node
    counts still agree (a partly free device is not wholly free)."""
    s = request.state
    d = node_devices(s)
    taken = d.free_share < 1.0
    memory = np.array([s.hardware[h].accelerator_memory_gb or 0.0 for h in d.hardware])
    share = np.where(taken, 0.25, 1.0)
    free_memory = np.where(taken, memory / 4, memory)
    rank = np.arange(d.n_devices) - d.offsets[:-1][d.node]
    state = dataclasses.replace(
        s,
        device_offsets=frozen_array(d.offsets, np.int64),
        device_hardware=frozen_array(d.hardware, np.int32),
        device_free_share=frozen_array(share, np.float32),
        device_free_memory_gb=frozen_array(free_memory, np.float32),
        device_ids=tuple(f"gpu{k}" for k in rank),
    )
    return dataclasses.replace(request, state=state)


def naming_devices(request: MirrorRequest) -> MirrorRequest:
    """`with_devices(request)` whose options name, per entry, the first devices of its node
    (as many as the entry takes, at most the node's devices)."""
    r = with_devices(request)
    s, o = r.state, r.options
    offsets, index = [0], []
    for node, k in zip(o.node_index.tolist(), o.accelerators.tolist(), strict=True):
        start, end = int(s.device_offsets[node]), int(s.device_offsets[node + 1])
        index.extend(range(start, min(end, start + k)))
        offsets.append(len(index))
    options = dataclasses.replace(
        o,
        device_offsets=frozen_array(offsets, np.int64),
        device_index=frozen_array(index, np.int32),
    )
    return dataclasses.replace(r, options=options)


def sharing(request: MirrorRequest, share: float = 0.44, kind: str = "serve") -> MirrorRequest:
    """`request` as a share job (no whole devices), with a QoS class and (by default) an
    open kind."""
    w = dataclasses.replace(
        request.workload, accelerators=0, accelerator_share=share, qos_class="LS", kind=kind
    )
    options = dataclasses.replace(
        request.options,
        accelerators=frozen_array(np.zeros_like(request.options.accelerators), np.int32),
    )
    return dataclasses.replace(request, workload=w, options=options)


def unknown_capabilities(request: MirrorRequest) -> MirrorRequest:
    """`request` with every capability but memory unknown on its first class, and a new
    class (memory unknown too) that no node uses."""
    s = request.state
    first = s.hardware[0]
    hardware = (
        HardwareClass(first.name, first.accelerator_memory_gb, None, None, None),
        *s.hardware[1:],
        HardwareClass("X-NEW", None, None, None, None),
    )
    return dataclasses.replace(request, state=dataclasses.replace(s, hardware=hardware))


def with_distribution(request: MirrorRequest) -> MirrorRequest:
    """`request` with production's whole distribution: all mass on its chosen option
    (or on defer), which agrees with a propensity of 1."""
    assert request.production is not None
    n = request.options.n_options
    chosen = request.production.option
    probabilities = tuple(1.0 if i == chosen else 0.0 for i in range(n))
    production = ProductionDecision(
        option=chosen,
        propensity=1.0,
        probabilities=probabilities,
        defer_probability=1.0 if chosen < 0 else 0.0,
    )
    return dataclasses.replace(request, production=production)


def spread(request: MirrorRequest, gang_size: int = 2) -> MirrorRequest:
    """`request` with one more option, a gang over its first two nodes (one accelerator
    on each), and `workload.gang_size` set to `gang_size` (2 admits the gang)."""
    o = request.options
    options = dataclasses.replace(
        o,
        node_offsets=frozen_array([*o.node_offsets.tolist(), len(o.node_index) + 2], np.int64),
        node_index=frozen_array([*o.node_index.tolist(), 0, 1], np.int32),
        accelerators=frozen_array([*o.accelerators.tolist(), 1, 1], np.int32),
        option_ids=(*o.option_ids, "spread-0-1") if o.option_ids else (),
    )
    w = dataclasses.replace(request.workload, gang_size=gang_size)
    return dataclasses.replace(request, workload=w, options=options)


def as_schema_1(request: MirrorRequest) -> MirrorRequest:
    """`request` declared as schema version 1 (it must use no v2 field)."""
    return dataclasses.replace(request, schema_version=1)


def assert_same(a: Any, b: Any, path: str = "request") -> None:
    """Deep equality for the contract dataclasses, arrays bit for bit with dtype and flags."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), path
        assert a.dtype == b.dtype, (path, a.dtype, b.dtype)
        assert a.flags.writeable == b.flags.writeable, path
        assert a.tobytes() == b.tobytes(), (path, a, b)
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, str):  # a known kind may be built as the WorkloadKind member
        assert isinstance(b, str) and str(a) == str(b), (path, a, b)
    else:
        assert type(a) is type(b) and a == b, (path, a, b)
