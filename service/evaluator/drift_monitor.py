"""Live drift: each policy's scored inputs against its training summary, per window.

Windows are counted in requests, not time: every `window_requests`
consecutive scored requests close one window per policy with a summary. The
flag rule's false-flag rate is calibrated for a number of requests
(`service.checks.drift`), so a count window keeps that guarantee whatever the
traffic rate; a time window would not (a quiet hour is a small, noisy window).

The scorer hands over what it computed anyway — the batch's feature matrix,
offsets and requests, and every policy's decisions — once per micro-batch.
The work is histogram counts against the reference's bin edges (one
``searchsorted`` per feature and one ``bincount``), a support check over the
rows, and one small set of hardware class names per request; no per-row
Python. The arrival check reads each request's ``request_time`` (Runtime's
clock): the positive gaps between consecutive requests of a window
(`service.checks.drift.arrival_statistic`), exported as
``understudy_drift_arrival_shift`` (log units against the training median).
It runs on the scorer thread, after scoring; a failure here is logged
and never stops scoring.

Open vocabularies (issue 22): besides each policy's novelty check (a kind,
QoS class or hardware class its training never saw flags the window), every
scored request whose kind is not a documented `WorkloadKind`, whose QoS class
is set and not in `KNOWN_QOS_CLASSES`, or whose option nodes include a class
that is not a known one is counted once per field in
``understudy_unseen_vocabulary_total{field}`` (field = kind, qos_class,
hardware), whatever the policies; field = model_family counts requests whose
model family (without its batch size) is in no monitored policy's training
families (the manifests' ``training_data.model_families``), while some policy
lists families.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from service.checks.drift import (
    NO_DECISION,
    Categories,
    FlagRule,
    WindowAccumulator,
    WindowDrift,
    request_categories,
    select_rule,
)
from service.contract import MirrorRequest, is_known_class
from service.contract.workload import KNOWN_QOS_CLASSES
from service.metrics import ServiceMetrics
from service.pipeline.scoring import ScoredDecision
from service.policies.base import ScoringBatch
from service.policies.training_summary import TrainingReference

log = logging.getLogger(__name__)

VOCABULARY_FIELDS = ("kind", "qos_class", "hardware", "model_family")
"""Label values of ``understudy_unseen_vocabulary_total``."""


class DriftMonitor:
    """Per policy with a summary: an open window, closed every `window_requests` requests."""

    def __init__(
        self,
        summaries: Mapping[str, TrainingReference],
        window_requests: int,
        metrics: ServiceMetrics,
    ) -> None:
        self.window_requests = window_requests
        self._metrics = metrics
        self._lock = threading.Lock()
        self._windows: dict[str, WindowAccumulator] = {}
        self.rules: dict[str, FlagRule] = {}
        self.last: dict[str, WindowDrift] = {}
        for name, summary in summaries.items():
            try:
                rule = select_rule(summary.rules, window_requests)
            except ValueError as exc:
                log.error("no drift for %s: %s", name, exc)
                continue
            self.rules[name] = rule
            self._windows[name] = WindowAccumulator(summary.reference, rule, window_requests)
            # every series exists before the first window closes
            metrics.drift_psi_max.labels(name).set(0)
            metrics.drift_flagged.labels(name).set(0)
            for flagged in ("true", "false"):
                metrics.drift_windows.labels(name, flagged)
            metrics.drift_out_of_support.labels(name)
            if rule.arrival_center is not None:  # no arrival process in training: no series
                metrics.drift_arrival_shift.labels(name).set(0)
        for vocabulary in VOCABULARY_FIELDS:
            metrics.unseen_vocabulary.labels(vocabulary)
        known = [w.reference.model_families for w in self._windows.values()]
        self._families: frozenset[str] | None = (
            frozenset().union(*(f for f in known if f is not None))
            if any(f is not None for f in known)
            else None
        )  # families some monitored policy was trained on; None: no policy lists any

    @property
    def policies(self) -> tuple[str, ...]:
        """Policies monitored."""
        return tuple(self._windows)

    def observe(self, batch: ScoringBatch, decisions: Sequence[ScoredDecision]) -> None:
        """Count one scored batch into every policy's open window; never raises."""
        if not self._windows or batch.n_requests == 0:
            return
        try:
            self._observe(batch, decisions)
        except Exception:  # drift is a diagnostic: it must never stop scoring
            log.exception("drift monitor failed on a batch; skipped")

    def _observe(self, batch: ScoringBatch, decisions: Sequence[ScoredDecision]) -> None:
        categories = [request_categories(r) for r in batch.requests]
        self._count_vocabulary(batch.requests, categories)
        times = np.fromiter((r.request_time for r in batch.requests), np.float64, batch.n_requests)
        index = {r.request_id: i for i, r in enumerate(batch.requests)}  # fallback only
        with self._lock:
            for name, window in self._windows.items():
                mine = [d for d in decisions if d.policy == name]
                if len(mine) == batch.n_requests:  # one per request, in request order
                    chosen = np.fromiter((d.chosen for d in mine), np.int64, len(mine))
                else:
                    chosen = np.full(batch.n_requests, NO_DECISION, dtype=np.int64)
                    for d in mine:
                        chosen[index[d.request_id]] = d.chosen
                before = window.out_of_support_decisions
                closed = window.feed(
                    batch.features, batch.offsets, categories, chosen if mine else None, times
                )
                new = window.out_of_support_decisions - before
                new += sum(w.out_of_support_decisions for w in closed)
                if new:
                    self._metrics.drift_out_of_support.labels(name).inc(new)
                for w in closed:
                    self._record(name, w)

    def _count_vocabulary(
        self, requests: Sequence[MirrorRequest], categories: Sequence[Categories]
    ) -> None:
        """Count requests with values outside the documented vocabularies, per field."""
        counts = dict.fromkeys(VOCABULARY_FIELDS, 0)
        if self._families is not None:
            counts["model_family"] = sum(c.family not in self._families for c in categories)
        for r in requests:
            counts["kind"] += not r.workload.kind_known
            qos = r.workload.qos_class
            counts["qos_class"] += bool(qos) and qos not in KNOWN_QOS_CLASSES
            state = r.state
            used = np.unique(state.node_hardware[r.options.node_index])
            counts["hardware"] += not all(is_known_class(state.hardware[int(i)]) for i in used)
        for vocabulary, n in counts.items():
            if n:
                self._metrics.unseen_vocabulary.labels(vocabulary).inc(n)

    def _record(self, name: str, w: WindowDrift) -> None:
        m = self._metrics
        m.drift_psi_max.labels(name).set(w.psi_max)
        m.drift_flagged.labels(name).set(1 if w.flagged else 0)
        m.drift_windows.labels(name, str(w.flagged).lower()).inc()
        if self.rules[name].arrival_center is not None:
            m.drift_arrival_shift.labels(name).set(w.arrival_shift)
        self.last[name] = w
        if w.flagged:
            top = int(np.nanargmax(w.psi / self.rules[name].scale))
            log.warning(
                "drift window flagged for %s: T=%.2f vs %.2f (top feature %s PSI %.3f);"
                " unseen hardware %s, kinds %s, QoS %s, model families %s;"
                " arrival shift %.2f (flagged: %s)",
                name,
                w.statistic,
                w.threshold,
                self._windows[name].reference.names[top],
                w.psi[top],
                list(w.unseen_hardware),
                list(w.unseen_kinds),
                list(w.unseen_qos),
                list(w.unseen_families),
                w.arrival_shift,
                w.arrival_flagged,
            )
