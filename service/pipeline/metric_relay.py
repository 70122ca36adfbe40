"""Metric updates made in another process, recorded there and replayed on `ServiceMetrics` here.

The scorer process (`service.pipeline.scorer_process`) runs the same
observers as the scorer thread — `ScorerMetrics`, the drift monitor — but
Prometheus is scraped from the ingest process. Rather than a second registry
to merge, the child's observers write to a `MetricRelay`, which looks like
`ServiceMetrics` to them (``metrics.<family>.labels(...).inc(n)``) and only
records each update as a small tuple; the parent replays the tuples on its
real `ServiceMetrics` after every batch. Every existing hook keeps its code
and its meaning; a batch costs a few dozen tuples on the pipe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.metrics import ServiceMetrics

Op = tuple[str, tuple[str, ...], str, float]
"""(metric attribute of `ServiceMetrics`, label values, method, value)."""

METHODS = frozenset({"inc", "set", "observe", "touch"})
"""What a relayed update may do; ``touch`` only creates the labelled series."""


class _Series:
    """One relayed series: its updates are appended to the relay's list."""

    def __init__(self, ops: list[Op], family: str, labels: tuple[str, ...]) -> None:
        self._ops = ops
        self._family = family
        self._labels = labels

    def inc(self, amount: float = 1.0) -> None:
        """Record ``inc(amount)``."""
        self._ops.append((self._family, self._labels, "inc", float(amount)))

    def set(self, value: float) -> None:
        """Record ``set(value)``."""
        self._ops.append((self._family, self._labels, "set", float(value)))

    def observe(self, value: float) -> None:
        """Record ``observe(value)``."""
        self._ops.append((self._family, self._labels, "observe", float(value)))


class _Family(_Series):
    """A relayed metric: unlabelled updates directly, labelled ones through `labels`."""

    def labels(self, *values: Any) -> _Series:
        """The series for `values`; recording it alone creates it (``touch``)."""
        labels = tuple(str(v) for v in values)
        self._ops.append((self._family, labels, "touch", 0.0))
        return _Series(self._ops, self._family, labels)


class MetricRelay:
    """Stands in for `ServiceMetrics` in the scorer process; `take` hands over the updates."""

    def __init__(self) -> None:
        self._ops: list[Op] = []

    def __getattr__(self, family: str) -> _Family:
        if family.startswith("_"):
            raise AttributeError(family)
        return _Family(self._ops, family, ())

    def take(self) -> list[Op]:
        """The updates recorded since the last call, in order."""
        ops = list(self._ops)
        self._ops.clear()  # series handed out earlier keep appending to this list
        return ops

    def as_metrics(self) -> ServiceMetrics:
        """This relay, typed as what the observers expect (they use only the shape above)."""
        return self  # type: ignore[return-value]


def replay(ops: list[Op], metrics: ServiceMetrics) -> None:
    """Apply relayed updates to the real metrics, in the order they were made.

    Raises:
        ValueError: an update names a method other than `METHODS` (a bug in the child).
    """
    for family, labels, method, value in ops:
        if method not in METHODS:
            raise ValueError(f"relayed metric update `{method}` on `{family}` is not allowed")
        metric = getattr(metrics, family)
        series = metric.labels(*labels) if labels else metric
        if method != "touch":
            getattr(series, method)(value)
