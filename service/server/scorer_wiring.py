"""The scorer's parts, wired the same way on the scorer thread and in the scorer process.

Composition glue, like ``service/server/decision_log.py``: the composition root
(`service.server.app`) builds the thread-mode scorer with these helpers, and the
scorer process (`service.pipeline.scorer_process`) builds its own half with
`ScorerChildSpec` — its own engine to the same database, its own policies,
the same budgets, quarantine, dead-letter box and drift monitor — so the two
modes differ only in where the work runs. `resolve_scorer_mode` decides which
one a service runs (`Settings.scorer_mode`, `auto` by default).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from service.contract import DEFAULT_FEATURES
from service.evaluator.drift_monitor import DriftMonitor
from service.pipeline.dead_letter import DeadLetterBox
from service.pipeline.quarantine import Quarantine
from service.pipeline.scorer import BatchScorer, ScorerConfig, StopSignal
from service.pipeline.scorer_child import ChildLink, ReportingObserver
from service.pipeline.scorer_metrics import ScorerMetrics
from service.policies.registry import Registry
from service.server.decision_log import DecisionLogSink
from service.settings import Settings
from service.storage import DecisionLogWriter, make_engine

log = logging.getLogger(__name__)

ResolvedMode = Literal["thread", "process"]
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
"""cgroup v2's CPU limit of this process's group: `<quota> <period>` in us, or `max ...`."""


@dataclass(frozen=True)
class ScorerPlacement:
    """Where a service scores (`thread` or `process`), and why: shown in readiness and logs."""

    mode: ResolvedMode
    reason: str
    fell_back: bool = False
    """`auto` wanted the process but could not have it (logged as a warning)."""

    def describe(self) -> str:
        """One line for the start-up log and the `scorer_mode` readiness check."""
        return f"{self.mode} ({self.reason})"


def usable_cores() -> int:
    """Whole cores this process may use: its CPU affinity (a cpuset, `taskset`), else all.

    Capped by a cgroup v2 CPU quota (Kubernetes `limits.cpu`, `docker --cpus`),
    rounded down: such limits leave the affinity mask at every host core, so
    a pod limited to one CPU would otherwise count the whole node.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity on this platform
        cores = os.cpu_count() or 1
    quota = _quota_cores()
    return max(1, min(cores, int(quota))) if quota is not None else cores


def _quota_cores() -> float | None:
    """The cgroup v2 CPU quota in cores; None when unlimited or not readable (cgroup v1)."""
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return None


def resolve_scorer_mode(configured: str, unsendable: str | None = None) -> ScorerPlacement:
    """Resolve `Settings.scorer_mode` to the mode a service runs; the one place it is decided.

    Why `auto` prefers the process: ingest acks only after the journal write,
    and in thread mode the ack thread waits for the GIL whenever the scorer
    holds it (docs/capacity.md, "The scorer process"), so ingest should do
    nothing but receive, validate, journal and ack. A child process gives
    scoring its own interpreter — but only pays where there is a second core
    to run it: on one core the two processes take turns on it anyway, and the
    child adds a pipe hop and decodes every request again, so `auto` keeps
    the thread there. The core count is the affinity mask (and a cgroup CPU
    quota), not the machine's count: a container pinned or limited to one CPU
    has one core whatever the host has.

    `unsendable` says why the policy registry given to `build_service` cannot
    reach a child (it does not pickle), or is None when it can: `auto` then
    falls back to the thread, an explicit `process` fails with that reason.
    """
    if configured == "thread":
        return ScorerPlacement("thread", "scorer_mode set to thread")
    if configured == "process":
        if unsendable is not None:
            raise ValueError(f"`scorer_mode` process: {unsendable}")
        return ScorerPlacement("process", "scorer_mode set to process")
    if configured != "auto":
        raise ValueError(f"`scorer_mode` must be auto, thread or process, got {configured!r}")
    cores = usable_cores()
    if cores < 2:
        return ScorerPlacement("thread", "auto: this process may run on one core only")
    if unsendable is not None:
        return ScorerPlacement("thread", f"auto fell back from process: {unsendable}", True)
    return ScorerPlacement("process", f"auto: this process may run on {cores} cores")


def scorer_config(settings: Settings, registry: Registry) -> ScorerConfig:
    """Batch size and per-policy time budgets (manifests' own, else the settings' default)."""
    default_budget = settings.policy_time_budget_ms / 1e3
    budgets = {name: default_budget for name in registry.policies} | registry.time_budgets_s
    return ScorerConfig(max_batch=settings.scorer_max_batch, budgets_s=budgets)


def make_quarantine(settings: Settings, observer: ScorerMetrics) -> Quarantine:
    """The quarantine, its transitions counted and logged."""
    quarantine = Quarantine(
        threshold=settings.quarantine_failures,
        window_s=settings.quarantine_window_s,
        cooldown_s=settings.quarantine_cooldown_s,
    )
    quarantine.subscribe(observer.on_quarantine)
    quarantine.subscribe(lambda e: log.warning("policy %s %s: %s", e.policy, e.event, e.reason))
    return quarantine


def dead_letter_box(settings: Settings) -> DeadLetterBox:
    """Where records the decision log refuses alone are set aside."""
    return DeadLetterBox(settings.data_dir / "dead-letter")


def loaded(registry: Registry) -> Registry:
    """`registry` itself: ``partial(loaded, registry)`` sends a picklable one to the child."""
    return registry


class _BelowError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


@contextmanager
def _echoes_dropped() -> Iterator[None]:
    """In the scorer process, drop records below ERROR while the policies load.

    The parent loaded the same registry from the same source before starting
    the child (`_wire_scoring`: the directory, or the same factory; a given
    registry logs nothing) and logged its warnings — one per ONNX policy that
    asks for a provider this machine lacks — so the child's copies would only
    double every start-up warning. Refusals (ERROR) still show.
    """
    handlers = logging.getLogger().handlers
    muted = _BelowError()
    for handler in handlers:
        handler.addFilter(muted)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(muted)


@dataclass(frozen=True)
class ScorerChildSpec:
    """Everything the scorer process needs to build its scorer; pickled to it (``spawn``).

    Attributes:
        settings: the service's settings.
        database_url: the decision log's URL as the parent resolved it (the
            embedded server's socket, when embedded).
        policies: builds the policy registry in the child (ONNX sessions do not pickle).
    """

    settings: Settings
    database_url: str
    policies: Callable[[], Registry]

    def __call__(self, stop: StopSignal, link: ChildLink) -> BatchScorer:
        """The child's scorer: sink on its own engine, observers reporting through `link`."""
        settings = self.settings
        engine = make_engine(self.database_url)
        link.on_close(engine.dispose)
        with _echoes_dropped():
            registry = self.policies()
        metrics = link.relay.as_metrics()
        observer = ScorerMetrics(metrics)
        quarantine = make_quarantine(settings, observer)
        quarantine.subscribe(link.on_quarantine)
        scorer = BatchScorer(
            link.active(lambda: list(registry.policies.values())),
            DecisionLogSink(DecisionLogWriter(engine), registry.manifests),
            ReportingObserver(observer, link),
            DEFAULT_FEATURES,
            scorer_config(settings, registry),
            quarantine,
            dead_letter_box(settings),
            stop=stop,
        )
        if registry.training_summaries:  # docs/drift.md
            drift = DriftMonitor(
                registry.training_summaries, settings.drift_window_requests, metrics
            )
            scorer.on_scored = drift.observe
        return scorer
