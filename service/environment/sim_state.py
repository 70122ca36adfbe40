"""The simulator's state types: keyed randomness, the options of a request, the mutable state.

Job status codes: ``FUTURE`` (not arrived), ``WAITING`` (arrived, not placed),
``RUNNING``, ``DONE``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FUTURE, WAITING, RUNNING, DONE = 0, 1, 2, 3
UNIFORMS_PER_JOB = 16
"""Keyed uniforms per job; decision attempts beyond this reuse them cyclically."""


@dataclass(frozen=True, eq=False)
class Randomness:
    """One world's exogenous randomness for an episode.

    Attributes:
        speed: float64 ``(n_jobs,)``: multiplier on a job's rates, ``1/eps`` with
            ``eps ~ LogNormal(-sigma^2/2, sigma)`` so that E[run time] is the
            measured run time.
        uniform: float64 ``(n_jobs, UNIFORMS_PER_JOB)``: for the emulator's draws.
    """

    speed: NDArray[np.float64]
    uniform: NDArray[np.float64]

    @staticmethod
    def draw(seed: tuple[int, ...], n_jobs: int, sigma: float) -> Randomness:
        """The world of `seed`; same seed, same world."""
        rng = np.random.default_rng(np.random.SeedSequence(list(seed)))
        eps = (
            rng.lognormal(-0.5 * sigma * sigma, sigma, size=n_jobs)
            if sigma > 0
            else np.ones(n_jobs)
        )
        return Randomness(speed=1.0 / eps, uniform=rng.random((n_jobs, UNIFORMS_PER_JOB)))


@dataclass(frozen=True, eq=False)
class Options:
    """The placements offered to one request (CSR over node entries, as the contract's).

    Attributes:
        offsets: int64 ``(n_options + 1,)``.
        node: int32 ``(n_entries,)`` node index per entry.
        take: int32 ``(n_entries,)`` GPUs taken on that node.
        cls: int64 ``(n_options,)`` class of each option.
        spread: bool ``(n_options,)`` True for a multi-server gang.
        free: int64 ``(n_nodes,)`` wholly free GPUs (devices) per node.
        mask: bool ``(n_options,)`` feasibility (equals the contract's, tested).
        device: int64 ``(n_entries,)``: for a share job, the device (global GPU
            index) the entry would use, -1 where the node has none it could use;
            empty for whole-GPU jobs (their options name no device).
        device_free_share: float64 ``(n_devices,)``: the share of each device
            this request could take (see `Simulator.device_free_share`).
        factor: float64 ``(n_options,)``: the option's rate / the consolidated
            rate (`World.gang_factor`; 1 for one server); default all 1.
        localities: int64 ``(n_options,)``: interconnect domains the option
            spans; default all 1.
    """

    offsets: NDArray[np.int64]
    node: NDArray[np.int32]
    take: NDArray[np.int32]
    cls: NDArray[np.int64]
    spread: NDArray[np.bool_]
    free: NDArray[np.int64]
    mask: NDArray[np.bool_]
    device: NDArray[np.int64]
    device_free_share: NDArray[np.float64]
    factor: NDArray[np.float64] | None = None
    localities: NDArray[np.int64] | None = None

    def __post_init__(self) -> None:
        if self.factor is None:
            object.__setattr__(self, "factor", np.ones(self.n))
        if self.localities is None:
            object.__setattr__(self, "localities", np.ones(self.n, dtype=np.int64))

    @property
    def n(self) -> int:
        """Number of options."""
        return len(self.offsets) - 1


@dataclass(eq=False)
class SimState:
    """Everything that changes; `copy` is a fork's cost (a dozen small arrays).

    ``shape_factor`` is a running job's rate / its consolidated rate (its
    placement's `World.gang_factor`; 1 on one server).
    Per device (GPU or partition slice): ``occ`` its (at most two) jobs,
    ``used_share`` the share of its compute they hold (1 for a whole-GPU job)
    and ``used_memory_gb`` the memory share jobs hold (a whole-GPU job holds
    it all; a device with no job is reset to exactly 0).
    """

    time: float
    status: NDArray[np.int8]
    remaining: NDArray[np.float64]
    rate: NDArray[np.float64]
    speed: NDArray[np.float64]
    start: NDArray[np.float64]
    finish: NDArray[np.float64]
    cls_of: NDArray[np.int64]
    spread: NDArray[np.bool_]
    shape_factor: NDArray[np.float64]
    partner: NDArray[np.int64]
    gpus_of: NDArray[np.int64]
    occ: NDArray[np.int64]
    attempts: NDArray[np.int64]
    requests: NDArray[np.int64]
    idle: NDArray[np.int64]
    used_share: NDArray[np.float64]
    used_memory_gb: NDArray[np.float64]
    infeasible_at: NDArray[np.int64]
    next_arrival: int
    completions: int
    queue: list[int]

    def copy(self) -> SimState:
        """A deep copy."""
        return SimState(
            time=self.time,
            status=self.status.copy(),
            remaining=self.remaining.copy(),
            rate=self.rate.copy(),
            speed=self.speed.copy(),
            start=self.start.copy(),
            finish=self.finish.copy(),
            cls_of=self.cls_of.copy(),
            spread=self.spread.copy(),
            shape_factor=self.shape_factor.copy(),
            partner=self.partner.copy(),
            gpus_of=self.gpus_of.copy(),
            occ=self.occ.copy(),
            attempts=self.attempts.copy(),
            requests=self.requests.copy(),
            idle=self.idle.copy(),
            used_share=self.used_share.copy(),
            used_memory_gb=self.used_memory_gb.copy(),
            infeasible_at=self.infeasible_at.copy(),
            next_arrival=self.next_arrival,
            completions=self.completions,
            queue=list(self.queue),
        )
