"""Rows the decision-log writer accepts, and what it reports back.

Plain frozen dataclasses of Python scalars and ``bytes``: the scorer builds
them (with the helpers in :mod:`service.storage.log.convert`), the writer COPYs
them, and nothing here knows about SQL. Times are Unix seconds (floats) as in
the contract; PostgreSQL stores them as ``timestamptz`` (converted in SQL by
``to_timestamp``, one conversion path, so a request and its decisions always
carry the identical partition key).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class PolicyRow:
    """A policy (or predictor) version as registered; one row per (name, version).

    Attributes:
        name, version: the registry identity; decisions refer to it.
        kind: e.g. ``"policy"``, ``"predictor"``, ``"baseline"``.
        sha256: hex digest of the artifact; None for code baselines.
        feature_version, feature_hash: the feature definition it consumes.
        registered_at: Unix seconds.
    """

    name: str
    version: str
    kind: str
    sha256: str | None
    feature_version: str
    feature_hash: str
    registered_at: float


@dataclass(frozen=True, slots=True)
class SnapshotRow:
    """A cluster-state snapshot, stored once per content hash.

    Attributes:
        snapshot_hash: sha256 (32 bytes) of ``state`` bytes before compression.
        state_zstd: zstd-compressed protobuf ``understudy.v1.ClusterState``.
        n_nodes: nodes in the snapshot.
        raw_bytes: uncompressed size.
    """

    snapshot_hash: bytes
    state_zstd: bytes
    n_nodes: int
    raw_bytes: int


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One mirrored request; one per ``request_id`` (``request_identities``).

    ``payload_zstd`` is the journal payload (a serialized
    ``understudy.v1.MirrorRequest``) with the ``state`` field cut out at byte
    ``state_offset`` when ``snapshot_hash`` is set (the state lives in
    ``cluster_snapshots``), or the whole payload when both are None.
    `service.storage.reads.log.load_raw_request` puts it back together byte for byte.
    """

    request_id: str
    request_time: float
    received_at: float
    journal_seq: int
    schema_version: int
    workload_id: str
    workload_kind: str
    tenant: str
    model_family: str
    accelerators_requested: int
    priority: int
    n_options: int
    n_nodes: int
    snapshot_hash: bytes | None
    state_offset: int | None
    payload_zstd: bytes
    feature_version: str
    feature_hash: str
    production_option: int | None
    production_propensity: float | None
    feasibility_version: str | None = None
    """The feasibility function's version the bits were computed with (None: not logged)."""
    feasibility_bits: bytes | None = None
    """Little-endian uint16 per option, bit i set when that version's signal i fired."""
    qos_class: str = ""
    """Runtime's QoS class (open vocabulary); '' when not given."""
    production_probabilities_f64: bytes | None = None
    """Production's whole distribution when Runtime sent it: float64 LE, one per
    option, then defer (`service.storage.log.convert.pack_production_distribution`)."""
    content_sha256: bytes | None = None
    """`service.contract.identity.content_sha256` of the request: what makes a
    re-send the same request (``request_identities``, migration 0011)."""


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """One policy's decision on one request; unique on (request, policy, version, time).

    Attributes:
        chosen_option: option index within the request, or -1 (`DEFER`).
        chosen_probability: probability the policy gave its choice (None if unknown).
        production_probability: probability the policy gave production's option;
            None when production's decision was not known at scoring time (it
            can be read later from ``probabilities_f64``).
        defer_probability: probability of deferring.
        scores_f32: raw scores, little-endian float32, one per option.
        probabilities_f64: probabilities, little-endian float64, one per option
            (float64 so logged propensities equal the replayed ones exactly).
        predicted: predicted outcome of the chosen option, name -> value
            (e.g. ``{"throughput_q50": ..., "throughput_q10": ...}``), or None.
        status: a `service.policies.base.DecisionStatus` value.
        agrees_with_production: chosen == production's option; None if unknown.
        latency_us: scoring latency attributed to this decision.
        error: message when status is error or timeout.
        scored_at: Unix seconds.
    """

    request_id: str
    request_time: float
    policy_name: str
    policy_version: str
    status: str
    chosen_option: int
    chosen_probability: float | None
    production_probability: float | None
    defer_probability: float | None
    scores_f32: bytes
    probabilities_f64: bytes
    predicted: Mapping[str, float] | None
    raw_favourite_infeasible: bool
    agrees_with_production: bool | None
    latency_us: int
    error: str | None
    scored_at: float


@dataclass(frozen=True, slots=True)
class OutcomeRow:
    """An outcome as Runtime reported it; joined to its request by ``request_id``.

    ``production_option``/``production_propensity`` are set when Runtime
    mirrored before deciding and sends its decision with the outcome.
    """

    request_id: str
    observed_at: float
    received_at: float
    queue_delay_s: float | None
    throughput: float | None
    completion_time_s: float | None
    slo_met: bool | None
    failure: str
    production_option: int | None
    production_propensity: float | None
    journal_seq: int | None = None


@dataclass(frozen=True, slots=True)
class LogBatch:
    """Everything one writer transaction commits; any list may be empty."""

    requests: Sequence[RequestRow] = ()
    snapshots: Sequence[SnapshotRow] = ()
    decisions: Sequence[DecisionRow] = ()
    outcomes: Sequence[OutcomeRow] = ()
    policies: Sequence[PolicyRow] = ()

    def __len__(self) -> int:
        return (
            len(self.requests)
            + len(self.snapshots)
            + len(self.decisions)
            + len(self.outcomes)
            + len(self.policies)
        )


@dataclass(frozen=True, slots=True)
class Counts:
    """Rows offered to one table: how many were new and how many already there."""

    inserted: int = 0
    duplicates: int = 0


@dataclass(frozen=True, slots=True)
class OutcomeCounts:
    """What happened to the outcomes of a batch (see docs/storage.md, "Outcome join").

    Attributes:
        joined: outcomes whose request was already logged; now in ``outcomes``.
        pending: outcomes whose request was not seen; kept in ``pending_outcomes``.
        joined_from_pending: earlier pending outcomes joined because their
            request arrived in this batch.
        duplicates: outcomes for a request that already had one (first wins);
            includes repeats within the batch and journal replays.
        conflicting: duplicates whose content differed; each is recorded in
            ``conflicts`` (a subset of ``duplicates``).
        production_filled: requests whose production option/propensity was
            filled from an outcome.
        production_conflicts: outcomes whose production decision contradicted
            the one already recorded (recorded in ``conflicts``, not applied).
        outcome_delays_s: ``observed_at - request_time`` (both Runtime's clock)
            of every outcome joined in this batch.
    """

    joined: int = 0
    pending: int = 0
    joined_from_pending: int = 0
    duplicates: int = 0
    conflicting: int = 0
    production_filled: int = 0
    production_conflicts: int = 0
    outcome_delays_s: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class WriteResult:
    """The outcome of one `DecisionLogWriter.write` (one committed transaction)."""

    policies: Counts = field(default_factory=Counts)
    snapshots: Counts = field(default_factory=Counts)
    requests: Counts = field(default_factory=Counts)
    decisions: Counts = field(default_factory=Counts)
    outcomes: OutcomeCounts = field(default_factory=OutcomeCounts)
    elapsed_s: float = 0.0
    request_conflicts: int = 0
    """Skipped requests whose content contradicts the logged one, newly put in ``conflicts``."""
