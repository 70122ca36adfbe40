"""Gang-shape training rows for the Gavel predictor, from the measured placement table.

Why: Gavel measured one consolidated and one spread rate per (job type, GPU
count, class), so a predictor fitted on it alone cannot tell ``4`` from ``22``
from ``1111`` (measured on Pollux's testbed: spread is slower for all six
models, ``22`` slower than ``1111``, and at 8 GPUs ``44`` slower than
``2222``). The simulator runs a gang at Gavel's consolidated rate times
`service.environment.sharing.gang_factor`; these rows are the same product, so
the predictor learns the shapes the simulator offers:

    factor = shape_factor(type, shape, L) x min(1, g / shape_factor(type, 1...1, 1))

with ``g`` Gavel's measured unconsolidated / consolidated ratio for the same
(job type, GPUs, class) (1 where Gavel has no spread row), i.e. Pollux's
loss per shape, plus Gavel's extra loss where Gavel measured a larger one
for its own spread placement on that class.

Rows, per Gavel *consolidated* row of 2 or more GPUs (job type, class, GPUs
``g``): the row itself, and one per multi-server shape of ``g`` GPUs (every
partition of ``g`` into 2 .. g servers, at most `MAX_SERVERS`), in one
locality and across two. The factor charges a locality crossing once, so
``L = 2`` stands for any ``L >= 2`` (the feature is a bit,
`predictor_features.cross_locality`). Gavel's unconsolidated rows enter
through ``g``, not as rows of their own: their shape is not recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations_with_replacement

import numpy as np

from service.contract import KNOWN_HARDWARE
from service.learning.build_models.gavel import GavelTable, gavel_features
from service.policies.predictor_features import parse_job_type

MAX_SERVERS = 8
"""Most servers a derived shape spans (a Gavel job has at most 8 GPUs)."""
SHAPE_SOURCE = (
    "plus gang-shape rows: Gavel consolidated rate x environment.shapes.shape_factor (Pollux"
    " placements, petuum/adaptdl c793c70, Apache-2.0) for every multi-server shape, one and two"
    " localities; Gavel unconsolidated rows (shape unrecorded) not fitted"
)

ShapeFactor = Callable[[str, tuple[int, ...], int], float]


def shapes_of(gpus: int, max_servers: int = MAX_SERVERS) -> list[tuple[int, ...]]:
    """Every partition of `gpus` over 2 .. `max_servers` servers, descending per server."""
    out: list[tuple[int, ...]] = []
    for parts in range(2, min(gpus, max_servers) + 1):
        for combo in combinations_with_replacement(range(1, gpus + 1), parts):
            if sum(combo) == gpus:
                out.append(tuple(sorted(combo, reverse=True)))
    return sorted(set(out), key=lambda s: (len(s), [-x for x in s]))


def default_shape_factor() -> ShapeFactor:
    """`service.environment.shapes.shape_factor` (imported late: the build needs it, tests pass
    their own)."""
    from service.environment.shapes import shape_factor

    return shape_factor


def gavel_spread_ratio(table: GavelTable) -> dict[tuple[str, str, int], float]:
    """Gavel's unconsolidated / consolidated throughput per (job type, class, GPUs)."""
    rates: dict[tuple[str, str, int, bool], float] = {}
    for jt, hw, g, cons, v in zip(
        table.job_type,
        table.hardware,
        table.scale,
        table.consolidated,
        table.throughput,
        strict=True,
    ):
        rates[(str(jt), str(hw), int(g), bool(cons))] = float(v)
    return {
        (jt, hw, g): v / rates[(jt, hw, g, True)]
        for (jt, hw, g, cons), v in rates.items()
        if not cons and (jt, hw, g, True) in rates
    }


def with_shape_rows(table: GavelTable, factor: ShapeFactor | None = None) -> GavelTable:
    """`table`'s consolidated rows plus the derived shape rows (module docstring)."""
    factor = factor or default_shape_factor()
    spread = gavel_spread_ratio(table)
    keep = table.consolidated | (table.scale == 1)
    jobs, hw, scale, cons, thr, phys, factors = [], [], [], [], [], [], []
    per_node: list[tuple[int, ...]] = []
    localities: list[int] = []
    for i in np.flatnonzero(keep):
        g, job = int(table.scale[i]), str(table.job_type[i])
        rows: list[tuple[tuple[int, ...], int, float]] = [((g,), 1, 1.0)]
        if g > 1:
            measured = spread.get((job, str(table.hardware[i]), g), 0.0)
            ones = factor(job, (1,) * g, 1)
            extra = min(1.0, measured / ones) if measured > 0 else 1.0
            for shape in shapes_of(g):
                rows += [(shape, loc, factor(job, shape, loc) * extra) for loc in (1, 2)]
        for shape, loc, f in rows:
            jobs.append(str(table.job_type[i]))
            hw.append(str(table.hardware[i]))
            scale.append(g)
            cons.append(len(shape) == 1)
            thr.append(float(table.throughput[i]) * f)
            factors.append(f)
            phys.append(float(table.throughput_physical[i]) if len(shape) == 1 else np.nan)
            per_node.append(shape)
            localities.append(loc)
    parsed = [parse_job_type(j) for j in jobs]
    return GavelTable(
        job_type=np.array(jobs),
        family=np.array([j.family for j in parsed]),
        hardware=np.array(hw),
        scale=np.array(scale, dtype=np.int64),
        consolidated=np.array(cons, dtype=bool),
        throughput=np.array(thr, dtype=np.float64),
        throughput_physical=np.array(phys, dtype=np.float64),
        features=gavel_features(
            parsed, [KNOWN_HARDWARE[h] for h in hw], scale, cons, per_node, localities
        ),
        log_shape_factor=np.log(np.array(factors, dtype=np.float64)),
        per_node=tuple(per_node),
        localities=tuple(localities),
    )
