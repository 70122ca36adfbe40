"""Leadership of the evaluator: a lease in PostgreSQL with a fencing generation.

Several replicas run the evaluator loop; exactly one evaluates. Each tick
starts by taking or renewing the lease (``evaluator_leases``, times on the
database's clock): a replica holds it for `ttl_s` after its last renewal,
and a replica that finds it expired takes it over, which increments the
lease's *generation*. Every write the leader makes (evaluations, evidence,
verdicts) carries its generation, and PostgreSQL refuses a write whose
generation is not the current, unexpired one (migration 0003). So a leader
that was paused (SIGSTOP, a long GC, a VM migration) past its lease and
wakes up in the middle of a tick cannot apply what it decided before the
pause: its writes are fenced (Kleppmann 2016, "How to do distributed
locking"), and the sequence-number compare-and-set of the protocol desk
independently refuses a verdict on a state it did not read.

Why not a session advisory lock, as ARCHITECTURE.md first said: a paused
process keeps its PostgreSQL session, hence its advisory lock, for as long as
it is paused, so no other replica could ever take over; a lease expires.

The local clock adds a second, cheaper guard: `Lease.valid` is false once
`ttl_s` (less a safety margin) has passed on this process's monotonic clock
since the renewal was *requested*, so a leader that knows it may have lost
the lease does not even try.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from service.contract.errors import Unavailable

log = logging.getLogger(__name__)

SAFETY = 0.8
"""Share of the TTL after a renewal request during which the local clock trusts the lease."""


class Grant(Protocol):
    """What the store says about the lease after a successful take or renewal."""

    @property
    def holder(self) -> str:
        """Who holds it."""
        ...

    @property
    def generation(self) -> int:
        """The fencing token."""
        ...


class LeaseStore(Protocol):
    """Where the lease lives (``service.storage.stores.evaluation.EvaluationStore``)."""

    def acquire(self, name: str, holder: str, ttl_s: float) -> Grant | None:
        """Take or renew lease `name`; None when another holder has it."""
        ...

    def release(self, name: str, holder: str, generation: int) -> None:
        """Let the lease expire now."""
        ...


@dataclass(frozen=True, slots=True)
class Term:
    """One continuous period of leadership: the fencing generation and a local deadline."""

    holder: str
    generation: int
    deadline: float


def holder_id() -> str:
    """A name unique to this process: host, pid and a random suffix (pids get reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """This process's side of the evaluator lease (module docstring).

    Args:
        store: where the lease is recorded.
        name: the lease's name (one per leadership role).
        holder: this process's id (`holder_id`).
        ttl_s: how long a renewal holds the lease.
        clock: monotonic seconds (tests pass a fake).
    """

    def __init__(
        self,
        store: LeaseStore,
        name: str,
        holder: str,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self.name = name
        self.holder = holder
        self.ttl_s = ttl_s
        self._clock = clock
        self.term: Term | None = None

    def hold(self) -> Term | None:
        """Take or renew the lease; the current term, or None when we are not leader."""
        asked = self._clock()
        try:
            grant = self._store.acquire(self.name, self.holder, self.ttl_s)
        except Unavailable as err:
            if self.term is not None:
                log.warning("evaluator lease not renewed, stepping down: %s", err)
            self.term = None
            return None
        if grant is None or grant.holder != self.holder:
            if self.term is not None:
                log.warning("evaluator lease lost (generation %s)", self.term.generation)
            self.term = None
            return None
        if self.term is None or self.term.generation != grant.generation:
            log.info("evaluator lease taken: %s generation %s", self.holder, grant.generation)
        self.term = Term(self.holder, grant.generation, asked + self.ttl_s * SAFETY)
        return self.term

    def valid(self) -> bool:
        """Whether the local clock still trusts the current term."""
        return self.term is not None and self._clock() < self.term.deadline

    def release(self) -> None:
        """Give the lease up (clean shutdown), so another replica takes over at once."""
        term, self.term = self.term, None
        if term is None:
            return
        try:
            self._store.release(self.name, self.holder, term.generation)
        except Unavailable as err:
            log.warning("evaluator lease not released (it will expire): %s", err)
