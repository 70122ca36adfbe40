"""Options beyond one whole server: a share job's devices, and multi-server gangs.

Share jobs on devices: what share and memory each device has free, and a share
job's options (below). Gangs (`gang_options`): a whole-GPU job of ``k >= 2``
GPUs is offered, next to every single server that could hold it, gangs over
several servers of one class, so one-node, packed, spread and cross-domain
placements compete in one request; each runs at `gang_factor` times
the consolidated rate.

The sharing rule (`service.environment.scenario.SharingConfig`): a share job
asks for a share in (1/3, 1/2] of one GPU and its device memory, so a device
holds at most two jobs (Gavel measured pairs, never triples). A whole-GPU job
holds its devices whole (share 1, all memory). Two share jobs on one device
run at the co-located rates (`service.environment.colocation`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from service.environment.shapes import with_gavel
from service.environment.sim_state import Options, SimState
from service.environment.world import EpisodeJobs, World

Gang = tuple[int, list[tuple[int, int]]]
"""(class, [(server, GPUs taken), ...])."""

PairRate = Callable[[int, int, int], float]
"""(job, its co-tenant, class) -> the job's steps/s sharing a GPU (the simulator's)."""


def device_free_share(w: World, jobs: EpisodeJobs, s: SimState, j: int) -> NDArray[np.float64]:
    """Per device, the share of it request `j` could take, shape ``(n_devices,)``.

    ``1 - used share``, except 0 where share job `j` may not join the
    device's tenant: Gavel measured the pair as unable to run together
    (0.0) either way, or packing is off. What *this* request could take,
    as the contract view has always been (a whole-GPU job sees
    ``1 - used share``: 1 on a free device, less on a shared one).
    """
    free = np.clip(1.0 - s.used_share, 0.0, 1.0)
    assert jobs.share is not None
    if jobs.share[j] <= 0:
        return free
    tenant = s.occ[:, 0]
    occupied = tenant >= 0
    if not w.scenario.packing:
        return np.where(occupied, 0.0, free)
    safe = np.where(occupied, tenant, 0)
    t_type, mine = jobs.type_idx[safe], jobs.type_idx[j]
    cls = w.device_class
    refused = occupied & (
        (w.pair_rate[mine, t_type, cls] == 0) | (w.pair_rate[t_type, mine, cls] == 0)
    )
    out: NDArray[np.float64] = np.where(refused, 0.0, free)
    return out


def device_free_memory_gb(w: World, s: SimState) -> NDArray[np.float64]:
    """Per device, free memory: class memory less what share jobs hold; 0 when whole-taken."""
    out: NDArray[np.float64] = np.where(
        s.used_share >= 1.0, 0.0, w.device_memory_gb - s.used_memory_gb
    )
    return out


def share_options(w: World, jobs: EpisodeJobs, s: SimState, j: int, pair_rate: PairRate) -> Options:
    """One option per server for share job `j`, each naming the device it would use.

    The server's allocator (Runtime's, not the policy's) picks the device,
    as the simulator's allocator always has: among those with enough free
    share and memory on an allowed class, a wholly free one first (the job
    runs fastest alone); else the partly taken one whose tenant lets `j` run
    fastest. A server with no such device names none (its option is
    infeasible: the contract finds no device with the share and memory).
    """
    assert jobs.share is not None and jobs.memory_gb is not None
    share, need = float(jobs.share[j]), float(jobs.memory_gb[j])
    free_share = device_free_share(w, jobs, s, j)
    free_memory = device_free_memory_gb(w, s).astype(np.float32)
    allowed = w.allowed[jobs.type_idx[j], 0]
    usable = (
        (free_share.astype(np.float32) >= share)
        & (free_memory >= np.float32(need))
        & allowed[w.device_class]
    )
    nodes = w.nodes_fitting[1]
    device = np.full(len(nodes), -1, dtype=np.int64)
    for e, n in enumerate(nodes):
        lo, hi = int(w.gpu_start[n]), int(w.gpu_start[n + 1])
        cand = np.flatnonzero(usable[lo:hi]) + lo
        if not len(cand):
            continue
        idle = cand[s.occ[cand, 0] < 0]
        if len(idle):
            device[e] = int(idle[0])
        else:
            c = int(w.node_class[n])
            rates = [pair_rate(j, int(s.occ[g, 0]), c) for g in cand]
            device[e] = int(cand[int(np.argmax(rates))])
    cls = w.node_class[nodes]
    mask = (device >= 0) & ~w.node_draining[nodes] & allowed[cls]
    return Options(
        offsets=np.arange(len(nodes) + 1, dtype=np.int64),
        node=nodes.astype(np.int32),
        take=np.zeros(len(nodes), dtype=np.int32),
        cls=cls,
        spread=np.zeros(len(nodes), dtype=bool),
        free=s.idle.copy(),
        mask=mask,
        device=device,
        device_free_share=free_share,
    )


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


def gang_factor(
    world: World, type_idx: int, sf: int, c: int, per_node: tuple[int, ...], localities: int
) -> float:
    """A gang's rate on class `c` / the consolidated rate (`shapes.with_gavel`), cached."""
    key = (type_idx, sf, c, tuple(sorted(per_node, reverse=True)), localities)
    out = world._gang_factors.get(key)
    if out is None:
        ratio = float(world.gavel_spread_ratio[type_idx, sf, c])
        job_type = world.table.job_types[type_idx]
        out = world._gang_factors[key] = with_gavel(job_type, key[3], localities, ratio)
    return out
