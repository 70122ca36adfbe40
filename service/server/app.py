"""The composition root: builds every part from `Settings` and wires them.

Nothing else constructs settings, registries, journals, engines or servers;
tests call `build_service` with their own settings (free ports, temp dirs,
their own database) and get the same wiring as production.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from functools import partial

from prometheus_client import CollectorRegistry

from service.auth import TokenAuthority
from service.contract import DEFAULT_FEATURES, RequestLimits
from service.evaluator.drift_monitor import DriftMonitor
from service.evaluator.loop import EvaluatorConfig
from service.metrics import ServiceMetrics
from service.pipeline.ingest import Ingest
from service.pipeline.journal import FsyncMode, IngestJournal, JournalConfig
from service.pipeline.log_lag import LogLag
from service.pipeline.request_index import RequestIndex, fill_from_journal
from service.pipeline.scorer import Scorer, ScorerLoop
from service.pipeline.scorer_metrics import ScorerMetrics
from service.pipeline.scorer_process import ProcessScorer
from service.policies.registry import Registry, load_registry
from service.protocols import ProtocolDesk
from service.readiness import Readiness
from service.server.database_wiring import wire_database_health
from service.server.decision_log import DecisionLogSink
from service.server.evaluator_wiring import candidate_gate, wire_evaluator
from service.server.policy_refs import policy_refs
from service.server.reviewer_wiring import wire_reviewer_guard
from service.server.runtime import Service, bind_socket
from service.server.scorer_wiring import (
    ScorerChildSpec,
    ScorerPlacement,
    dead_letter_box,
    loaded,
    make_quarantine,
    resolve_scorer_mode,
    scorer_config,
)
from service.settings import Settings
from service.storage import (
    DecisionLogWriter,
    ProtocolStore,
    make_engine,
    open_database,
    upgrade,
)
from service.storage.chain.anchor import Anchor, SealRefused, load_key
from service.storage.chain.seal import ChainSealer
from service.storage.chain.sealer import SealerLoop, SealMetrics
from service.storage.reviewer.audit import ReviewerAccess
from service.transport.grpc.server import build_grpc_server
from service.transport.grpc.servicer import ShadowEvaluationServicer
from service.transport.grpc.stream_limits import StreamLimits
from service.transport.http.app import create_http_app
from service.transport.http.protocols import protocol_router
from service.transport.http.reviewer import reviewer_router

log = logging.getLogger(__name__)

JOURNAL_CONSUMERS = ("scorer",)

__all__ = ["Service", "build_service", "serve"]


def _journal(settings: Settings, placement: ScorerPlacement) -> IngestJournal:
    config = JournalConfig(
        directory=settings.resolved_journal_dir,
        segment_bytes=settings.journal_segment_bytes,
        max_bytes=settings.journal_max_bytes,
        fsync_mode=FsyncMode(settings.journal_fsync),
        fsync_interval_s=settings.journal_fsync_interval_s,
    )
    if placement.mode == "process":  # ingest's decoded objects help only a local scorer
        config = dataclasses.replace(config, decoded_cache_records=0)
    return IngestJournal(config, consumers=JOURNAL_CONSUMERS)


def _tls(settings: Settings) -> tuple[bytes, bytes] | None:
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    return settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes()


def _policy_check(registry: Registry, held: dict[str, str]) -> tuple[bool, str]:
    refused = ", ".join(f"{name} ({err.problem})" for name, err in registry.refused.items())
    loaded = ", ".join(sorted(set(registry.policies) - set(held)))
    detail = f"scoring {loaded or 'nothing'}" + (f"; refused: {refused}" if refused else "")
    if held:
        detail += "; quarantined: " + ", ".join(f"{n} ({e})" for n, e in sorted(held.items()))
    return len(held) < len(registry.policies), detail


def build_service(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    policies: Registry | None = None,
    policy_factory: Callable[[], Registry] | None = None,
) -> Service:
    """Wire the service from settings; nothing is started (the database is migrated).

    `policies` is the registry to score (default: loaded from `settings.policies_dir`).
    In process mode the scorer process builds its own: with `policy_factory` (a
    picklable callable) when given, else from the given registry if it pickles, else
    from the directory. The mode is resolved first (`settings.scorer_mode`, `auto` by
    default: `service.server.scorer_wiring.resolve_scorer_mode`); `auto` given a
    registry that does not pickle scores on a thread instead, with a warning.
    """
    placement = _placement(settings, policies, policy_factory)
    metrics = ServiceMetrics(registry or CollectorRegistry())
    journal = _journal(settings, placement)
    metrics.watch_journal(
        depth_records=lambda: journal.depth_records(),
        depth_bytes=lambda: journal.depth_bytes,
        capacity_bytes=lambda: journal.capacity_bytes,
        head_seq=lambda: journal.head_seq,
    )
    metrics.db_lag_records.set_function(lambda: journal.depth_records("scorer"))
    lag = LogLag(journal, "scorer")  # the same lag in requests and seconds: a batch is one record
    metrics.db_lag_requests.set_function(lag.requests)
    metrics.db_lag_seconds.set_function(lag.oldest_age_s)
    readiness = Readiness(
        interval_s=settings.readiness_interval_s, timeout_s=settings.readiness_check_timeout_s
    )
    if not settings.scoring_enabled:  # no database here: no db_up to page on
        metrics.registry.unregister(metrics.db_up)
    readiness.register("journal", journal.health)  # lock-free; a failing write shows here
    service = Service(
        settings=settings,
        metrics=metrics,
        journal=journal,
        readiness=readiness,
        scorer_placement=placement,
    )
    if settings.scoring_enabled:
        _wire_scoring(service, policies, policy_factory)
    ingest = Ingest(
        journal,
        metrics,
        RequestLimits(max_options=settings.max_options, max_nodes=settings.max_nodes),
        RequestIndex(settings.request_index_size),
    )
    # Recent ids back from the journal, off the startup path (the writer catches what it misses).
    threading.Thread(
        target=fill_from_journal, args=(ingest.index, journal), name="request-index", daemon=True
    ).start()
    authority = TokenAuthority(settings.auth_tokens)
    servicer = ShadowEvaluationServicer(
        ingest,
        authority,
        metrics,
        settings.max_request_bytes,
        stream_limits=StreamLimits(
            total=settings.grpc_max_streams,
            per_principal=settings.grpc_max_streams_per_principal,
            per_connection=settings.grpc_max_streams_per_connection,
            idle_timeout_s=settings.grpc_stream_idle_timeout_s,
        ),
    )
    service.grpc_server, service.grpc_port, service.health = build_grpc_server(
        servicer,
        settings.grpc_host,
        settings.grpc_port,
        settings.grpc_max_workers,
        settings.max_request_bytes,
        tls=_tls(settings),
    )
    service.http_app = create_http_app(
        ingest,
        authority,
        metrics,
        readiness,
        settings.max_request_bytes,
        offload_appends=settings.journal_fsync == "always",
    )
    if service.engine is not None:
        service.http_app.include_router(
            protocol_router(
                _protocol_desk(service),
                authority.identify,
                max_body_bytes=settings.max_request_bytes,
            )
        )
        service.http_app.include_router(
            reviewer_router(
                ReviewerAccess(
                    service.engine,
                    statement_timeout_ms=round(settings.reviewer_statement_timeout_s * 1000),
                ),
                authority,
                metrics,
            )
        )
    service.http_socket = bind_socket(settings.http_host, settings.http_port)
    return service


def _protocol_desk(service: Service) -> ProtocolDesk:
    """Protocols live beside the decision log; checks use the loaded policies and its logs."""
    assert service.engine is not None
    store = ProtocolStore(service.engine)
    loaded = service.policies
    return ProtocolDesk(
        store,
        policies=lambda: None if loaded is None else policy_refs(loaded),
        logging=store.logging_profile,
    )


def _unsendable(given: Registry | None, factory: Callable[[], Registry] | None) -> str | None:
    """Why the policies given to build_service cannot reach a scorer process; None if they can."""
    if factory is not None or given is None:
        return None  # the child calls the factory, or loads the directory itself
    try:
        pickle.dumps(given)
    except Exception as exc:
        return (
            "the policy registry given to build_service cannot be sent to the scorer "
            f"process ({type(exc).__name__}: {exc}); pass `policy_factory`"
        )
    return None


def _placement(
    settings: Settings, given: Registry | None, factory: Callable[[], Registry] | None
) -> ScorerPlacement:
    """The scorer mode this service runs (`resolve_scorer_mode`), logged once at build."""
    if not settings.scoring_enabled:  # no scorer: ingest only, the journal as in thread mode
        return ScorerPlacement("thread", "scoring disabled: no scorer runs")
    unsendable = _unsendable(given, factory) if settings.scorer_mode != "thread" else None
    placement = resolve_scorer_mode(settings.scorer_mode, unsendable)
    log.log(
        logging.WARNING if placement.fell_back else logging.INFO,
        "scorer mode: %s",
        placement.describe(),
    )
    return placement


def _policy_source(
    settings: Settings, given: Registry | None, factory: Callable[[], Registry] | None
) -> Callable[[], Registry]:
    """How the scorer process gets its policies: the factory, the given registry, or the dir.

    Only called once `_placement` chose the process, so a given registry pickles.
    """
    if factory is not None:
        return factory
    if given is None:
        return partial(load_registry, settings.policies_dir.resolve())
    return partial(loaded, given)


def _wire_scoring(
    service: Service, policies: Registry | None, policy_factory: Callable[[], Registry] | None
) -> None:
    """Database, migrations, policy registry, decision-log sink and the scorer."""
    settings = service.settings
    url, service.embedded_db = open_database(settings.database_url, settings.data_dir)
    upgrade(url)
    engine = make_engine(url)
    service.engine = engine
    if policies is None and policy_factory is not None:
        policies = policy_factory()  # the same set the scorer process builds
    registry = policies or load_registry(settings.policies_dir)
    service.policies = registry
    gate = candidate_gate(service)  # a candidate the evaluator stopped is not scored
    held: Callable[[], dict[str, str]]
    placement = service.scorer_placement
    service.readiness.register("scorer_mode", lambda: (True, placement.describe()))
    if placement.mode == "process":  # docs/capacity.md, "The scorer process"
        spec = ScorerChildSpec(settings, url, _policy_source(settings, policies, policy_factory))
        handler = ProcessScorer(
            spec,
            service.metrics,
            halted=gate.halted,
            cooldown_s=settings.quarantine_cooldown_s,
        )
        scorer: ScorerLoop = ScorerLoop(service.journal, handler, scorer_config(settings, registry))
        held = handler.quarantine.quarantined
        service.readiness.register("scorer_process", handler.health)
    else:
        observer = ScorerMetrics(service.metrics)
        quarantine = make_quarantine(settings, observer)
        thread_scorer = Scorer(
            service.journal,
            gate.active(lambda: list(registry.policies.values())),
            DecisionLogSink(DecisionLogWriter(engine), registry.manifests),
            observer,
            DEFAULT_FEATURES,
            scorer_config(settings, registry),
            quarantine,
            dead_letter_box(settings),
        )
        if registry.training_summaries:  # docs/drift.md
            drift = DriftMonitor(
                registry.training_summaries, settings.drift_window_requests, service.metrics
            )
            thread_scorer.on_scored = drift.observe
        scorer, held = thread_scorer, quarantine.quarantined
    service.scorer = scorer
    if settings.chain_seal_interval_s > 0:  # docs/tamper_evidence.md
        key_file, anchor_file = settings.resolved_chain_files
        anchor = Anchor(anchor_file, load_key(key_file), settings.resolved_chain_witness)
        sealer = ChainSealer(engine, anchor, block_rows=settings.chain_block_rows)
        service.sealer = SealerLoop(
            sealer, SealMetrics(service.metrics), settings.chain_seal_interval_s, (SealRefused,)
        )
        service.readiness.register("decision_chain", service.sealer.status)
    wire_reviewer_guard(service)  # direct reviewer sessions: limits they cannot lift
    wire_database_health(service, url)  # bounded probe, db_up, embedded restarts
    service.readiness.register(
        "decision_log",
        lambda: (scorer.sink_healthy, scorer.sink_error or "writes succeeding"),
    )
    service.readiness.register("policies", lambda: _policy_check(registry, held()))
    if settings.evaluator_enabled:
        service.evaluator = wire_evaluator(
            service,
            EvaluatorConfig(
                interval_s=settings.evaluator_interval_s,
                lease_ttl_s=settings.evaluator_lease_ttl_s,
                join_grace_s=settings.evaluator_join_grace_s,
            ),
            gate=gate,
        )


def tune_garbage_collector() -> None:
    """Collect less often, and never scan what start-up allocated.

    The pipeline allocates many short-lived objects per request; CPython's
    default generation-0 threshold (700) runs a collection every few requests
    and the long-lived start-up heap (models, registry, settings) is rescanned
    in every full collection. Measured on the scorer path: 6-15% less CPU per
    request with these thresholds (docs/capacity.md). Process-wide, so only the
    real server calls it, not services started inside tests.
    """
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def serve(settings: Settings) -> None:
    """Run until SIGINT/SIGTERM; print one JSON line with the bound ports when ready."""
    service = build_service(settings)
    tune_garbage_collector()  # before start: a scorer process copies the thresholds
    service.start()
    service.wait_started()
    print(
        json.dumps(
            {
                "event": "listening",
                "grpc_port": service.grpc_port,
                "http_port": service.http_port,
                "journal": str(settings.resolved_journal_dir),
                "scorer_mode": service.scorer_placement.mode,
            }
        ),
        flush=True,
    )
    stop = threading.Event()

    def on_signal(signum: int, _: object) -> None:
        log.info("signal %s: shutting down", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(1.0):
        service.update_health()
    service.stop()
    sys.stdout.flush()
