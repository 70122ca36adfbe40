"""All Prometheus metrics of the service, owned by one object.

`ServiceMetrics(registry)` is built by the composition root and passed to
whatever records; tests build their own `CollectorRegistry` and read values
back with `get_sample_value`, so no global state needs cleaning.

Label values are bounded: every label comes from a fixed set (code literals,
configured policies, protocol criteria). Rejection fields are normalised
(indices dropped: ``state.node_ids[3]`` -> ``state.node_ids[]``) and kept only
when they are a field of the wire schema; anything else (an unknown JSON key a
client made up) is counted as ``other``, so hostile input cannot create series.
The error response still names the actual field.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.wire.field_paths import KNOWN_FIELD_PATHS

_INDEX = re.compile(r"\[\d+\]")
OTHER_FIELD = "other"
"""The `field` label of a rejection naming no field of the schema (an unknown key)."""

ACK_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def field_label(field: str) -> str:
    """A bounded-cardinality label for a field path: a known path, indices dropped, or `other`."""
    label = _INDEX.sub("[]", field)
    return label if label in KNOWN_FIELD_PATHS else OTHER_FIELD


class ServiceMetrics:
    """The service's metrics, registered on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.ingest = Counter(
            "understudy_ingest",
            "Mirrored requests and outcomes received, by result (accepted, shed, rejected).",
            ["transport", "kind", "result"],
            registry=registry,
        )
        self.rejections = Counter(
            "understudy_ingest_rejections",
            "Rejected inputs by the field that was wrong.",
            ["transport", "kind", "field"],
            registry=registry,
        )
        self.sheds = Counter(
            "understudy_ingest_sheds",
            "Shed inputs by reason: journal_full (at the journal's bound), disk_full (no space "
            "on the journal's disk), journal_error (any other journal write failure).",
            ["transport", "kind", "reason"],
            registry=registry,
        )
        self.auth_failures = Counter(
            "understudy_auth_failures",
            "Calls refused for missing/unknown credentials or a role without permission.",
            ["transport", "reason"],
            registry=registry,
        )
        self.ingest_batch_requests = Histogram(
            "understudy_ingest_batch_requests",
            "Requests (or outcomes) per batch message received (MirrorMany, ReportOutcomes, "
            "their streams, the HTTP batch endpoints), whatever became of them.",
            ["transport", "kind"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096),
            registry=registry,
        )
        self.ack_latency = Histogram(
            "understudy_ack_latency_seconds",
            "Time from receiving a mirrored message to its ack being ready.",
            ["transport"],
            buckets=ACK_BUCKETS,
            registry=registry,
        )
        self.grpc_streams_open = Gauge(
            "understudy_grpc_streams_open",
            "gRPC streams open now (mirror, outcome, health watch, reflection).",
            registry=registry,
        )
        self.grpc_streams_refused = Counter(
            "understudy_grpc_streams_refused",
            "gRPC streams refused RESOURCE_EXHAUSTED, by the limit reached: connection, "
            "principal or total.",
            ["reason"],
            registry=registry,
        )
        self.grpc_streams_idle_closed = Counter(
            "understudy_grpc_streams_idle_closed",
            "gRPC streams closed because the client sent nothing for the idle timeout.",
            registry=registry,
        )
        self.grpc_streams_unread_closed = Counter(
            "understudy_grpc_streams_unread_closed",
            "gRPC streams cancelled because the client kept sending but read none of the "
            "acks waiting for it for the idle timeout (the server stops reading first).",
            registry=registry,
        )
        self.grpc_stream_refusals = Counter(
            "understudy_grpc_stream_refusals",
            "Stream messages acked REJECTED or REPEATED_SEQUENCE, by kind and the ack's reason "
            "code (the allow-list of service.contract.rejections; docs/ingest.md).",
            ["kind", "reason"],
            registry=registry,
        )
        self.journal_depth_records = Gauge(
            "understudy_journal_depth_records",
            "Records appended but not yet checkpointed by the slowest consumer.",
            registry=registry,
        )
        self.journal_depth_bytes = Gauge(
            "understudy_journal_depth_bytes",
            "Bytes appended but not yet checkpointed by the slowest consumer.",
            registry=registry,
        )
        self.journal_capacity_bytes = Gauge(
            "understudy_journal_capacity_bytes",
            "Bound on unconsumed journal bytes; at it, mirrored work is shed.",
            registry=registry,
        )
        self.journal_head_seq = Gauge(
            "understudy_journal_head_sequence",
            "Sequence number of the last appended journal record.",
            registry=registry,
        )
        self.batch_size = Histogram(
            "understudy_scorer_batch_size",
            "Requests per scoring micro-batch (adapts to load).",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=registry,
        )
        self.policy_latency = Histogram(
            "understudy_policy_batch_latency_seconds",
            "Wall time of one policy on one micro-batch.",
            ["policy"],
            buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0),
            registry=registry,
        )
        self.decisions = Counter(
            "understudy_decisions",
            "Counterfactual decisions by policy and status (ok, all_infeasible, infeasible_choice, "
            "error, timeout).",
            ["policy", "status"],
            registry=registry,
        )
        self.agreement = Counter(
            "understudy_production_agreement",
            "Decisions compared with production's, by policy and whether they agree.",
            ["policy", "agrees"],
            registry=registry,
        )
        self.raw_favourite_infeasible = Counter(
            "understudy_raw_favourite_infeasible",
            "Decisions whose highest raw score was on an infeasible option, by policy.",
            ["policy"],
            registry=registry,
        )
        self.db_writes = Counter(
            "understudy_db_write_batches",
            "Decision-log write attempts by result (ok, error).",
            ["result"],
            registry=registry,
        )
        self.db_write_latency = Histogram(
            "understudy_db_write_latency_seconds",
            "Time to commit one batch to the decision log.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
            registry=registry,
        )
        self.db_rows = Counter(
            "understudy_db_rows_inserted",
            "Rows inserted into the decision log, by table (duplicates excluded).",
            ["table"],
            registry=registry,
        )
        self.db_duplicates = Counter(
            "understudy_db_duplicates",
            "Rows skipped as already logged (journal replays after a crash or outage).",
            registry=registry,
        )
        self.request_conflicts = Counter(
            "understudy_request_conflicts",
            "Requests reusing a request_id with other content, by where they were caught: "
            "ingest (refused in the ack) or writer (kept out of the log, recorded in "
            "`conflicts` once per distinct content).",
            ["stage"],
            registry=registry,
        )
        self.ingest_duplicates = Counter(
            "understudy_ingest_duplicates",
            "Requests re-sent with the same request_id and content: acked, not journaled again.",
            ["transport"],
            registry=registry,
        )
        self.outcomes = Counter(
            "understudy_outcomes",
            "Outcomes by join event: joined_on_arrival, parked (request not seen yet), "
            "joined_from_parked (its request arrived later).",
            ["state"],
            registry=registry,
        )
        self.outcome_delay = Histogram(
            "understudy_outcome_delay_seconds",
            "Runtime's observed_at minus request_time of outcomes as they are joined.",
            buckets=(1, 10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400),
            registry=registry,
        )
        self.db_lag_records = Gauge(
            "understudy_db_lag_records",
            "Journal records not yet committed to the decision log (a batch record counts once).",
            registry=registry,
        )
        self.db_lag_requests = Gauge(
            "understudy_db_lag_requests",
            "Requests and outcome reports in journal records not yet committed to the decision "
            "log (a batch record counts its accepted rows).",
            registry=registry,
        )
        self.db_lag_seconds = Gauge(
            "understudy_db_lag_seconds",
            "Age of the oldest journal record not yet committed to the decision log (0: none).",
            registry=registry,
        )
        self.db_up = Gauge(
            "understudy_db_up",
            "1 when the bounded database health probe answered in its last round, 0 when it "
            "failed or did not answer in time (write health: readiness `decision_log`).",
            registry=registry,
        )
        self.embedded_db_restarts = Counter(
            "understudy_embedded_db_restarts",
            "Attempts to restart the embedded PostgreSQL after its postmaster died, by result "
            "(ok, failed).",
            ["result"],
            registry=registry,
        )
        self.dead_letters = Counter(
            "understudy_dead_letters",
            "Journal records the decision log refused alone, set aside in the dead-letter "
            "directory (by kind).",
            ["kind"],
            registry=registry,
        )
        self.quarantine_events = Counter(
            "understudy_policy_quarantine_events",
            "Policy quarantine transitions by policy and event (quarantined, released, "
            "retry_failed).",
            ["policy", "event"],
            registry=registry,
        )
        self.quarantined = Gauge(
            "understudy_policy_quarantined",
            "1 while the policy is quarantined (not scored), 0 otherwise.",
            ["policy"],
            registry=registry,
        )
        ec = ["experiment", "criterion"]
        self.experiment_criterion_value = Gauge(
            "understudy_experiment_criterion_value",
            "Latest estimate per experiment and criterion, in the metric's units (for baseline "
            "criteria the difference candidate minus baseline).",
            ec,
            registry=registry,
        )
        self.experiment_criterion_bound = Gauge(
            "understudy_experiment_criterion_bound",
            "The anytime-valid bound each criterion compares with its threshold.",
            ec,
            registry=registry,
        )
        self.experiment_criterion_threshold = Gauge(
            "understudy_experiment_criterion_threshold",
            "Each criterion's threshold, signed, in the metric's units.",
            ec,
            registry=registry,
        )
        self.experiment_criterion_samples = Gauge(
            "understudy_experiment_criterion_samples",
            "Samples behind each criterion's latest evaluation.",
            ec,
            registry=registry,
        )
        self.experiment_criterion_status = Gauge(
            "understudy_experiment_criterion_status",
            "1 for each criterion's current status (insufficient, pending, fired, passed, failed, "
            "not_identifiable, unavailable), 0 for the others.",
            [*ec, "status"],
            registry=registry,
        )
        self.experiment_transitions = Counter(
            "understudy_experiment_transitions",
            "Verdicts the evaluator applied, by experiment, action and criterion.",
            ["experiment", "action", "criterion"],
            registry=registry,
        )
        self.experiment_rollback_signalled = Gauge(
            "understudy_experiment_rollback_signalled",
            "1 once the evaluator signalled rollback of an online experiment (a signal for "
            "Runtime and Safety; Understudy never acts).",
            ["experiment"],
            registry=registry,
        )
        self.evaluator_leader = Gauge(
            "understudy_evaluator_leader",
            "1 while this replica holds the evaluator lease.",
            registry=registry,
        )
        self.evaluator_lease_generation = Gauge(
            "understudy_evaluator_lease_generation",
            "Fencing generation of the lease this replica holds (0 when it does not).",
            registry=registry,
        )
        self.evaluator_ticks = Counter(
            "understudy_evaluator_ticks",
            "Evaluator loop iterations by result (evaluated, follower, error).",
            ["result"],
            registry=registry,
        )
        self.evaluator_tick_seconds = Histogram(
            "understudy_evaluator_tick_seconds",
            "Wall time of one evaluator tick.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=registry,
        )
        self.evaluator_refused = Counter(
            "understudy_evaluator_refused",
            "Verdicts or evaluation writes refused, by reason (lease: the lease moved; "
            "conflict: the protocol moved).",
            ["reason"],
            registry=registry,
        )
        self.calibration_coverage = Gauge(
            "understudy_calibration_coverage",
            "Observed coverage of each predictor policy's central interval at nominal level "
            "(0.5, 0.8, 0.9) over the outcomes of the last window (NaN before any).",
            ["policy", "level"],
            registry=registry,
        )
        self.calibration_flagged = Gauge(
            "understudy_calibration_flagged",
            "1 if the last calibration window of the predictor policy was flagged, else 0.",
            ["policy"],
            registry=registry,
        )
        self.calibration_outcomes = Gauge(
            "understudy_calibration_outcomes",
            "Joined outcomes matched to the policy's prediction in the last window.",
            ["policy"],
            registry=registry,
        )
        self.reviewer_queries = Counter(
            "understudy_reviewer_queries",
            "Reviewer API queries by endpoint and result (ok, rejected, not_found, denied, "
            "unavailable, timeout, failed); each is also a row of the reviewer_access_log "
            "table.",
            ["endpoint", "result"],
            registry=registry,
        )
        self.reviewer_sessions_ended = Counter(
            "understudy_reviewer_sessions_ended",
            "Direct understudy_reviewer database sessions the reviewer guard ended, by reason "
            "(transaction: open past the limit; idle: idle in a transaction past the limit).",
            ["reason"],
            registry=registry,
        )
        for reason in ("transaction", "idle"):
            self.reviewer_sessions_ended.labels(reason)
        self.reviewer_role_settings_restored = Counter(
            "understudy_reviewer_role_settings_restored",
            "Times the reviewer guard found understudy_reviewer's role defaults changed "
            "(ALTER ROLE by the role itself) and put them back.",
            registry=registry,
        )
        self.reviewer_guard_failures = Counter(
            "understudy_reviewer_guard_failures",
            "Reviewer guard sweeps that failed (the database unreachable); retried next tick.",
            registry=registry,
        )
        self.chain_sealed_rows = Counter(
            "understudy_chain_sealed_rows",
            "Decisions hashed into the tamper-evident chain and anchored by this replica.",
            registry=registry,
        )
        self.chain_seal_lag = Gauge(
            "understudy_chain_seal_lag_seconds",
            "Age (by scored_at) of the oldest decision not yet sealed after the last seal; "
            "0 when everything is sealed.",
            registry=registry,
        )
        self.chain_seal_errors = Counter(
            "understudy_chain_seal_errors",
            "Seals that failed (database unreachable, anchor file unwritable); retried.",
            registry=registry,
        )
        self.chain_seal_refusals = Counter(
            "understudy_chain_seal_refusals",
            "Seals refused because the anchor, its witness or the chain tables no longer match "
            "the signed heads (tampering: nothing is signed until it is resolved; "
            "docs/tamper_evidence.md).",
            registry=registry,
        )
        self.drift_psi_max = Gauge(
            "understudy_drift_psi_max",
            "Largest per-feature PSI against the policy's training summary in the last closed "
            "drift window (docs/drift.md).",
            ["policy"],
            registry=registry,
        )
        self.drift_flagged = Gauge(
            "understudy_drift_flagged",
            "1 if the policy's last closed drift window was flagged, else 0.",
            ["policy"],
            registry=registry,
        )
        self.drift_windows = Counter(
            "understudy_drift_windows",
            "Closed drift windows per policy, by flagged (true, false).",
            ["policy", "flagged"],
            registry=registry,
        )
        self.drift_arrival_shift = Gauge(
            "understudy_drift_arrival_shift",
            "Arrival statistic of the policy's last closed drift window minus its training "
            "median, log units; negative when requests come faster (docs/drift.md).",
            ["policy"],
            registry=registry,
        )
        self.scorer_process_restarts = Counter(
            "understudy_scorer_process_restarts",
            "Scorer processes restarted after the previous one died (scorer_mode=process); "
            "the batch in flight is resent, nothing acked is lost.",
            registry=registry,
        )
        self.drift_outcome_flagged = Gauge(
            "understudy_drift_outcome_flagged",
            "1 if the outcomes received in the last window ran faster or slower than in the "
            "policy's training episodes on some hardware class (docs/drift.md), else 0.",
            ["policy"],
            registry=registry,
        )
        self.drift_outcome_shift = Gauge(
            "understudy_drift_outcome_shift",
            "Median log throughput of the window's placed jobs on a hardware class minus the "
            "training median of their cell; -0.69 is half speed; NaN: too few outcomes.",
            ["policy", "hardware"],
            registry=registry,
        )
        self.drift_outcome_residuals = Gauge(
            "understudy_drift_outcome_residuals",
            "Outcomes in the last outcome-drift window that had a training reference.",
            ["policy"],
            registry=registry,
        )
        self.drift_out_of_support = Counter(
            "understudy_drift_out_of_support_decisions",
            "Decisions made on an input outside the policy's training support.",
            ["policy"],
            registry=registry,
        )
        self.unseen_vocabulary = Counter(
            "understudy_unseen_vocabulary",
            "Scored requests whose kind, QoS class or hardware is outside the documented"
            " vocabulary, by field.",
            ["field"],
            registry=registry,
        )
        self.ready = Gauge(
            "understudy_ready",
            "1 when the service can accept mirrored work, 0 otherwise.",
            registry=registry,
        )

    def watch_journal(
        self,
        depth_records: Callable[[], float],
        depth_bytes: Callable[[], float],
        capacity_bytes: Callable[[], float],
        head_seq: Callable[[], float],
    ) -> None:
        """Read the journal gauges at scrape time instead of on the ack path."""
        self.journal_depth_records.set_function(depth_records)
        self.journal_depth_bytes.set_function(depth_bytes)
        self.journal_capacity_bytes.set_function(capacity_bytes)
        self.journal_head_seq.set_function(head_seq)
