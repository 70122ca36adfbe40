"""The sealer loop: every `interval_s`, seal new decisions into the chain and anchor them.

Runs on its own thread, far from the ack path: sealing reads decisions the
writer already committed and never blocks it (it takes no lock the writer
waits on). The sealing itself lives in storage (``service.storage.chain.seal``);
this loop knows it only as `Sealing`, and reports through `SealObserver`
(the composition root plugs in the Prometheus metrics). A failed seal (the
database down, the anchor file unwritable) is counted and retried at the
next tick; nothing is lost, since the next seal starts from the stored cursor.

A seal *refused* (the anchor, its witness or the chain tables do not match the
signed heads: signing would launder a tamper) is not an outage: it is counted
apart, logged with its reason, and makes the service unready (`status`) until
a seal succeeds again — which it will not do by itself while the tamper stands.
"""

from __future__ import annotations

import logging
from typing import Protocol

from service.metrics import ServiceMetrics
from service.storage.periodic import PeriodicThread

log = logging.getLogger(__name__)


class SealOutcome(Protocol):
    """What the loop reads from one seal."""

    @property
    def rows(self) -> int:
        """Decisions chained by this seal."""
        ...

    @property
    def oldest_unsealed_s(self) -> float | None:
        """Age of the oldest decision still unsealed after it (None: none)."""
        ...


class Sealing(Protocol):
    """One seal (``ChainSealer.seal``)."""

    def seal(self) -> SealOutcome:
        """Seal what is safe to seal now and anchor it."""
        ...


class SealObserver(Protocol):
    """Where the loop reports (``ChainMetrics`` in the composition root)."""

    def sealed(self, rows: int, lag_s: float) -> None:
        """A seal succeeded: rows chained, and the seal lag after it."""
        ...

    def failed(self) -> None:
        """A seal failed."""
        ...

    def refused(self) -> None:
        """A seal was refused: what it would sign does not extend the signed chain."""
        ...


class SealerLoop:
    """Calls `sealing.seal()` every `interval_s` on a daemon thread until stopped.

    Args:
        sealing: one seal.
        observer: where results go.
        interval_s: seconds between seals.
        refusals: the exception types that mean "refused" (storage's ``SealRefused``;
            this loop does not import storage).
    """

    def __init__(
        self,
        sealing: Sealing,
        observer: SealObserver,
        interval_s: float,
        refusals: tuple[type[BaseException], ...] = (),
    ) -> None:
        self._sealing = sealing
        self._observer = observer
        self._refusals = refusals
        self._refusal: str | None = None
        self._thread = PeriodicThread("chain-sealer", interval_s, self.tick)

    def status(self) -> tuple[bool, str]:
        """Readiness: (False, why) while the last seal was refused; never blocks."""
        refusal = self._refusal
        return (refusal is None, refusal or "sealing")

    def tick(self) -> None:
        """One seal, reported; never raises (the loop must outlive a bad seal)."""
        try:
            outcome = self._sealing.seal()
        except self._refusals as exc:
            log.error("sealing the decision chain refused: %s", exc)
            self._refusal = f"sealing refused: {exc}"
            self._observer.refused()
            return
        except Exception:
            log.exception("sealing the decision chain failed")
            self._observer.failed()
            return
        self._refusal = None
        self._observer.sealed(outcome.rows, outcome.oldest_unsealed_s or 0.0)

    def start(self) -> None:
        """Start the thread."""
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the current seal and seal once more, so a clean stop leaves nothing behind."""
        if self._thread.running:
            self._thread.stop(timeout_s)
            self.tick()


class SealMetrics:
    """`SealObserver` on the service's Prometheus metrics."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self._metrics = metrics

    def sealed(self, rows: int, lag_s: float) -> None:
        """Count the rows, set the lag."""
        self._metrics.chain_sealed_rows.inc(rows)
        self._metrics.chain_seal_lag.set(lag_s)

    def failed(self) -> None:
        """Count the failure."""
        self._metrics.chain_seal_errors.inc()

    def refused(self) -> None:
        """Count the refusal."""
        self._metrics.chain_seal_refusals.inc()
