"""Service settings: one pydantic-settings class, environment prefix ``UNDERSTUDY_``.

Built once in the composition root (`service.server.app`) and passed down; no module
holds an instance. Every field's docstring is its documentation
(``understudy settings`` prints them).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, get_args

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

Role = Literal["runtime", "reviewer", "safety", "admin"]


class Settings(BaseSettings):
    """Everything an operator can configure."""

    model_config = SettingsConfigDict(
        env_prefix="UNDERSTUDY_",
        use_attribute_docstrings=True,
        extra="forbid",
        hide_input_in_errors=True,  # a misconfigured raw token must not reach the logs
    )

    data_dir: Path = Path("data")
    """Root for local state: the ingest journal and the embedded PostgreSQL."""

    journal_dir: Path | None = None
    """Ingest journal directory; defaults to `<data_dir>/journal`."""

    journal_segment_bytes: int = Field(default=64 * 1024 * 1024, gt=4096)
    """Size at which a journal segment file is closed and a new one started."""

    journal_max_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    """Bound on unconsumed journal bytes; beyond it mirrored requests are shed."""

    journal_fsync: Literal["never", "interval", "always"] = "interval"
    """When journal appends reach the disk: never (OS decides; survives a process
    crash only), interval (batched fsync; loses at most one interval on power loss),
    always (fsync before every ack; slowest)."""

    journal_fsync_interval_s: float = Field(default=0.05, gt=0)
    """Period of the batched fsync when `journal_fsync` is `interval`."""

    grpc_host: str = "127.0.0.1"
    """Address the gRPC server binds."""

    grpc_port: int = Field(default=50051, ge=0, le=65535)
    """gRPC port; 0 picks a free one (tests)."""

    grpc_max_workers: int = Field(default=16, ge=1)
    """Threads kept for unary gRPC calls (and for refusing streams over their limits);
    open streams get threads of their own on top, up to `grpc_max_streams`, so streams
    held open can never take these."""

    grpc_max_streams: int = Field(default=64, ge=1)
    """Most gRPC streams open at once, all clients together; more are refused
    RESOURCE_EXHAUSTED and counted in `understudy_grpc_streams_refused_total`."""

    grpc_max_streams_per_principal: int = Field(default=32, ge=1)
    """Most gRPC streams one principal (token) may hold open; keep it below
    `grpc_max_streams` so one client cannot take them all."""

    grpc_max_streams_per_connection: int = Field(default=8, ge=1)
    """Most gRPC streams open on one client connection (one peer address and port)."""

    grpc_stream_idle_timeout_s: float = Field(default=30.0, gt=0)
    """A mirror or outcome stream whose client sends nothing for this long is closed
    (DEADLINE_EXCEEDED, counted); the client library opens a new one (nothing is lost:
    what was not acked is sent again)."""

    http_host: str = "127.0.0.1"
    """Address the HTTP server binds."""

    http_port: int = Field(default=8080, ge=0, le=65535)
    """HTTP port; 0 picks a free one (tests)."""

    tls_cert_file: Path | None = None
    """PEM certificate chain for TLS on both gRPC and HTTP; unset = plaintext (loopback)."""

    tls_key_file: Path | None = None
    """PEM private key matching `tls_cert_file`."""

    max_request_bytes: int = Field(default=4 * 1024 * 1024, gt=1024)
    """Largest accepted request body (HTTP) or message (gRPC)."""

    max_options: int = Field(default=10_000, ge=1)
    """Most placement options one request may list."""

    max_nodes: int = Field(default=100_000, ge=1)
    """Most nodes one cluster snapshot may list."""

    request_index_size: int = Field(default=100_000, ge=0)
    """Recent request ids ingest remembers to answer re-sends in the ack (docs/ingest.md,
    "Identity"; about 200 bytes each); 0 leaves every identity check to the writer."""

    database_url: str | None = None
    """PostgreSQL URL (SQLAlchemy form, e.g. postgresql+psycopg://...). Unset: the
    embedded PostgreSQL in `<data_dir>/postgres` is started (or reused)."""

    policies_dir: Path = Path("policies")
    """Directory of policy manifests (`*/policy.yaml`) to load and score."""

    scorer_max_batch: int = Field(default=256, ge=1, le=10_000)
    """Most requests (and outcomes) one scoring micro-batch takes, in whole journal records
    (a batch record counts as its accepted rows; at least one record); smaller when idle."""

    scorer_mode: Literal["auto", "thread", "process"] = "auto"
    """Where batches are scored and logged: `thread` (in the ingest process) or `process`
    (a child process fed from the journal, so ingest's acks never wait for a GIL held by
    scoring; docs/capacity.md). `auto`: `process` when this process may run on more than
    one core, `thread` on one core or when the policy registry given to `build_service`
    cannot be sent to a child. `understudy serve --scorer-mode` sets it."""

    drift_window_requests: int = Field(default=4000, ge=250)
    """Scored requests per drift window (docs/drift.md): every this many requests each
    policy with a training summary closes a window, compared with its training data. The
    flag threshold used is the one calibrated for the largest window not above this."""

    policy_time_budget_ms: float = Field(default=100.0, gt=0)
    """Per-batch time budget of policies whose manifest sets none (the baselines)."""

    quarantine_failures: int = Field(default=3, ge=1)
    """Failed batches (error, non-finite output, over budget) that quarantine a policy..."""

    quarantine_window_s: float = Field(default=60.0, gt=0)
    """...when they happen within this many seconds."""

    quarantine_cooldown_s: float = Field(default=300.0, gt=0)
    """How long a quarantined policy is skipped before it is tried again."""

    scoring_enabled: bool = True
    """Run the scorer and decision log; off only for ingest-only deployments and tests."""

    readiness_interval_s: float = Field(default=1.0, gt=0)
    """Seconds between two background rounds of the readiness checks (`/readyz`,
    gRPC health, `understudy_ready`, `understudy_db_up`)."""

    readiness_check_timeout_s: float = Field(default=1.0, gt=0)
    """A readiness check (the database probe among them) that has not answered within
    this many seconds counts as failed: "no answer within 1.0 s"."""

    embedded_db_watch_interval_s: float = Field(default=1.0, ge=0)
    """How often the service looks at the embedded PostgreSQL it owns and restarts its
    postmaster if it died (with backoff); 0 never restarts it. Unused with `database_url`."""

    evaluator_enabled: bool = True
    """Run the evaluator loop (needs scoring): every replica runs it, one leads at a time,
    chosen by a lease in PostgreSQL (docs/evaluator.md)."""

    evaluator_interval_s: float = Field(default=5.0, gt=0)
    """Seconds between two evaluations of every running experiment."""

    evaluator_lease_ttl_s: float = Field(default=15.0, gt=0)
    """How long the evaluator lease holds after a renewal; a leader that stops renewing
    (crashed, paused) is replaced after this long. Must exceed twice the interval."""

    evaluator_join_grace_s: float = Field(default=3600.0, ge=0)
    """Requests younger than this are not yet expected to have an outcome (join-rate criteria)."""

    calibration_window_s: float = Field(default=3600.0, gt=0)
    """Calibration monitor: predictors are checked on the outcomes received in the last
    this many seconds (docs/calibration.md)."""

    calibration_interval_s: float = Field(default=60.0, gt=0)
    """Seconds between two calibration checks (a step of the evaluator loop, so at least
    `evaluator_interval_s` apart)."""

    chain_seal_interval_s: float = Field(default=10.0, ge=0)
    """Seconds between seals of the decision chain (docs/tamper_evidence.md); 0 disables
    the sealer on this replica (seals are serialised by a lock; one replica suffices)."""

    chain_block_rows: int = Field(default=1000, ge=1, le=100_000)
    """Most decisions per chain block: a broken anchored block names at most this many rows."""

    reviewer_guard_interval_s: float = Field(default=5.0, ge=0)
    """Seconds between two sweeps of the reviewer guard (docs/reviewer.md): it ends direct
    `understudy_reviewer` sessions over the limits below and restores the role's defaults;
    0 disables it on this replica (one replica suffices)."""

    reviewer_transaction_limit_s: float = Field(default=300.0, gt=0)
    """Longest a direct reviewer session may keep a transaction open before it is ended."""

    reviewer_idle_limit_s: float = Field(default=60.0, gt=0)
    """Longest a direct reviewer session may sit idle inside a transaction before it is ended."""

    reviewer_statement_timeout_s: float = Field(default=30.0, ge=0.001, le=3600)
    """Statement timeout of each reviewer API read (set per transaction by the service, out of
    the reviewer's reach); a read past it answers 503 and is logged as `timeout`."""

    chain_key_file: Path | None = None
    """HMAC-SHA256 key signing the chain anchor (created 0600 when missing); defaults to
    `<data_dir>/chain.key`. The database never sees it: keep it off the database host."""

    chain_anchor_file: Path | None = None
    """Append-only, signed file of chain heads and retirements; defaults to
    `<data_dir>/chain-anchor.jsonl`."""

    chain_witness_file: Path | None = None
    """Second, append-only sink every anchor line is also written to (``O_APPEND``), in
    another directory, so a cut anchor shows (docs/tamper_evidence.md); defaults to
    `<data_dir>/chain-witness/chain-anchor.jsonl`. Put it where whoever can write the
    anchor cannot cut it (``chattr +a``, another mount, a log shipper's spool)."""

    auth_tokens: dict[str, str] = Field(default_factory=dict, repr=False)
    """Bearer tokens, stored as sha256 hex digest -> "role" or "role:principal"
    (JSON in the environment), e.g. {"<digest>": "safety:dave"}. The principal is
    matched against protocol owners (an owner cannot approve). Make a digest with
    `understudy token-hash`. No entry for a role means nobody has it."""

    @field_validator("auth_tokens")
    @classmethod
    def _digests_only(cls, tokens: dict[str, str]) -> dict[str, str]:
        for digest, entry in tokens.items():
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(
                    "auth_tokens keys must be sha256 hex digests (64 lowercase hex "
                    "characters), never raw tokens"
                )
            role, _, principal = entry.partition(":")
            if role not in get_args(Role):
                raise ValueError(f"auth_tokens role must be one of {get_args(Role)}, got {role!r}")
            if principal and not re.match(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$", principal):
                raise ValueError(f"auth_tokens principal {principal!r} is not a valid name")
        return tokens

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file must be set together")
        return self

    @model_validator(mode="after")
    def _lease_outlives_ticks(self) -> Settings:
        if self.evaluator_lease_ttl_s <= 2 * self.evaluator_interval_s:
            raise ValueError("evaluator_lease_ttl_s must exceed twice evaluator_interval_s")
        return self

    @property
    def resolved_journal_dir(self) -> Path:
        """The journal directory after applying the default."""
        return self.journal_dir or self.data_dir / "journal"

    @property
    def resolved_chain_files(self) -> tuple[Path, Path]:
        """The chain's (key file, anchor file) after applying the defaults."""
        return (
            self.chain_key_file or self.data_dir / "chain.key",
            self.chain_anchor_file or self.data_dir / "chain-anchor.jsonl",
        )

    @property
    def resolved_chain_witness(self) -> Path:
        """The anchor's witness file after applying the default."""
        return self.chain_witness_file or self.data_dir / "chain-witness" / "chain-anchor.jsonl"
