"""Multi-server gangs: which shapes a request is offered, and how fast each runs.

A whole-GPU job of ``k >= 2`` GPUs is offered, next to every single server that
could hold it, gangs over several servers of one class (`gang_options`), so
one-node, packed, spread and cross-domain placements compete in one request.
A gang runs at Gavel's consolidated rate times `gang_factor`, which combines
the two measured sources: Pollux's placement shapes
(`service.environment.shapes`) and Gavel's own unconsolidated figure.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from service.environment.shapes import shape_factor
from service.environment.sim_state import SimState
from service.environment.world import EpisodeJobs, World

Gang = tuple[int, list[tuple[int, int]]]
"""(class, [(server, GPUs taken), ...])."""


def gang_factor(
    world: World, type_idx: int, sf: int, c: int, per_node: tuple[int, ...], localities: int
) -> float:
    """Rate of a gang on class `c` / the consolidated rate: how the two sources combine.

    ``shape_factor(type, per_node, localities) x min(1, g / shape_factor(type, 1...1))``
    with ``g`` Gavel's measured unconsolidated / consolidated ratio for (type,
    GPUs, class). Pollux's measured shapes (T4) give the loss of each shape;
    where Gavel measured a larger loss for its own spread placement (taken as
    one GPU per server) on this class — faster GPUs lose more to the same
    network — that extra loss is kept, so Gavel's figure stays what it is for
    that placement. Where Gavel measured a smaller loss (or none), Pollux's
    shape loss stands: a gang is never as fast as one server. Cached per world.
    """
    key = (type_idx, sf, c, tuple(sorted(per_node, reverse=True)), localities)
    cache: dict[tuple[int, int, int, tuple[int, ...], int], float] = world._gang_factors
    out = cache.get(key)
    if out is None:
        job_type = world.table.job_types[type_idx]
        base = shape_factor(job_type, key[3], localities)
        g = float(world.gavel_spread_ratio[type_idx, sf, c])
        ones = shape_factor(job_type, (1,) * sum(per_node), 1)
        extra = min(1.0, g / ones) if math.isfinite(g) and g > 0 else 1.0
        out = cache[key] = base * extra
    return out


def gang_options(
    world: World, state: SimState, jobs: EpisodeJobs, sf: NDArray[np.int64], j: int, c: int, k: int
) -> list[Gang]:
    """Multi-server gangs of `k` GPUs on class `c`, offered next to the single servers.

    - *packed*: the fewest servers, most idle first (spanning >= 2 servers);
    - *spread*: ``k / m`` GPUs on each of ``m`` servers, ``m`` in 2, 4, 8
      dividing ``k``: once inside one interconnect domain (the domain with the
      most idle GPUs that has ``m`` servers) and once across domains (the most
      idle server of each domain in turn), where the class has them.

    Servers are chosen among the class's servers that are up; where they lack
    idle GPUs the gang over-asks (the capacity constraint fires), room is never
    invented. Duplicates are dropped. None when the class has fewer than two
    servers up, fewer GPUs than `k`, or no consolidated rate to scale.
    """
    w, idle = world, state.idle
    up = w.class_nodes_up[c]
    if len(up) < 2 or int(w.node_gpus[up].sum()) < k:
        return []
    if not w.cons_rate[jobs.type_idx[j], sf[j], c] > 0:
        return []
    order = up[np.lexsort((up, -idle[up]))]  # most idle first
    out: list[list[tuple[int, int]]] = []
    packed = _fill(world, idle, order, k)
    if len(packed) >= 2:
        out.append(packed)
    loc = w.node_locality
    domains = [order[loc[order] == d] for d in dict.fromkeys(int(x) for x in loc[order])]
    for m in (2, 4, 8):
        if k % m or m > len(up):
            continue
        inside = [d for d in domains if len(d) >= m]
        if inside:
            best = max(inside, key=lambda d: int(idle[d[:m]].sum()))
            out.append([(int(n), k // m) for n in best[:m]])
        if len(domains) >= 2:
            depth = max(len(d) for d in domains)
            rr = [d[i] for i in range(depth) for d in domains if i < len(d)]
            out.append([(int(n), k // m) for n in rr[:m]])
    seen: set[tuple[tuple[int, int], ...]] = set()
    gangs: list[Gang] = []
    for g in out:
        if any(t > int(w.node_gpus[n]) for n, t in g):
            continue  # a server too small for its share: never offered
        key = tuple(sorted(g))
        if key not in seen:
            seen.add(key)
            gangs.append((c, g))
    return gangs


def _fill(
    world: World, idle: NDArray[np.int64], order: NDArray[np.int64], k: int
) -> list[tuple[int, int]]:
    """`k` GPUs over servers in `order`: idle ones first, then over-ask up to capacity."""
    take = {int(n): 0 for n in order}
    left = k
    for n in order:
        t = min(int(idle[n]), left)
        take[int(n)], left = t, left - t
    for n in order:  # not enough idle GPUs: over-ask (capacity fires), never invent room
        if left == 0:
            break
        t = min(int(world.node_gpus[n]) - take[int(n)], left)
        take[int(n)], left = take[int(n)] + t, left - t
    return [(n, t) for n, t in take.items() if t > 0]
