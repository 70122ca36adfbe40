"""Reviewer access: a read-only database role, documented views, the reviewer access log.

Written by hand, like 0001-0003, because the guarantees live in PostgreSQL
(``service/storage/reviewer/tables.py`` mirrors the access log as SQLAlchemy
Core; a test compares the two). docs/reviewer.md documents every view.

- ``understudy_reviewer``: a LOGIN role with SELECT on every table and view
  of the schema and nothing else (no INSERT / UPDATE / DELETE / TRUNCATE, no
  CREATE). Sessions start read-only (``default_transaction_read_only``) and
  with a statement timeout, but the privileges are the guarantee: a reviewer
  who turns read-only off still cannot write. Roles are cluster-wide, so the
  role is created only if missing; on the embedded server it logs in over the
  trust socket without a password. Elsewhere: ``ALTER ROLE understudy_reviewer
  PASSWORD '...'`` (or create it beforehand with one: the migration keeps it).
- ``ALTER DEFAULT PRIVILEGES``: tables the migrating role creates later (the
  day partitions ``understudy_ensure_partitions`` makes at runtime, later
  migrations' tables) are readable by the reviewer too. Default privileges
  belong to the creating role: if the service runs as another role than the
  migrations, run the same statement ``FOR ROLE <service role>``.
- The service's role may ``SET ROLE understudy_reviewer``: the reviewer API
  runs its reads under the reviewer's privileges (a superuser may anyway; any
  other migrating role is granted it here, PostgreSQL 16+ syntax).
- Views: ``reviewer_decisions`` (a decision with its request and outcome),
  ``reviewer_disagreements`` (those that disagree with production),
  ``reviewer_experiments`` (protocol versions with their window and
  approval) and ``reviewer_protocol_events`` (every transition).
- ``reviewer_access_log``: every reviewer API query (principal, endpoint,
  parameters, rows returned, time); append-only (UPDATE, DELETE and TRUNCATE
  refused by the triggers of 0002's ``understudy_refuse_edit``).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

ROLE = "understudy_reviewer"
STATEMENT_TIMEOUT = "60s"
OUTCOMES = "('ok', 'rejected', 'not_found', 'denied', 'error')"

VIEWS = [
    """
    CREATE VIEW reviewer_decisions AS
    SELECT d.request_id, d.request_time, r.received_at, r.workload_id, r.workload_kind,
           r.tenant, r.model_family, r.accelerators_requested, r.priority, r.n_options,
           r.n_nodes, r.feature_version, r.feature_hash,
           r.production_option, r.production_propensity, r.production_source,
           d.policy_name, d.policy_version, d.status, d.chosen_option,
           d.chosen_option = -1 AS deferred,
           d.chosen_probability, d.production_probability, d.defer_probability,
           d.agrees_with_production, d.raw_favourite_infeasible, d.predicted,
           d.latency_us, d.error, d.scored_at,
           octet_length(d.scores_f32) / 4 AS n_scores,
           o.observed_at AS outcome_observed_at, o.queue_delay_s, o.throughput,
           o.completion_time_s, o.slo_met, o.failure, o.join_state
      FROM decisions d
      JOIN requests r ON r.request_id = d.request_id AND r.request_time = d.request_time
      LEFT JOIN outcomes o ON o.request_id = d.request_id AND o.request_time = d.request_time
    """,
    """
    CREATE VIEW reviewer_disagreements AS
    SELECT * FROM reviewer_decisions WHERE agrees_with_production IS FALSE
    """,
    """
    CREATE VIEW reviewer_experiments AS
    SELECT v.protocol_id, v.version, v.state, v.mode, v.candidate_policy,
           v.candidate_version, v.candidate_sha256, v.content_sha256, v.owners,
           v.submitted_by, v.recorded_at, v.started_at,
           (SELECT min(e.at) FROM protocol_events e
             WHERE e.protocol_id = v.protocol_id AND e.version = v.version
               AND e.to_state IN ('stopped', 'completed', 'inconclusive')) AS ended_at,
           (SELECT e.actor FROM protocol_events e
             WHERE e.protocol_id = v.protocol_id AND e.version = v.version
               AND e.action = 'approve' ORDER BY e.seq LIMIT 1) AS approved_by,
           (SELECT e.at FROM protocol_events e
             WHERE e.protocol_id = v.protocol_id AND e.version = v.version
               AND e.action = 'approve' ORDER BY e.seq LIMIT 1) AS approved_at,
           v.seq AS n_events, v.updated_at
      FROM protocol_versions v
    """,
    """
    CREATE VIEW reviewer_protocol_events AS
    SELECT e.protocol_id, e.version, e.seq, e.at, e.action, e.from_state, e.to_state,
           e.actor, e.actor_role, e.reason, e.criterion, e.content_sha256, e.evidence,
           v.mode, v.candidate_policy, v.candidate_version
      FROM protocol_events e
      JOIN protocol_versions v ON v.protocol_id = e.protocol_id AND v.version = e.version
    """,
]

UPGRADE = [
    f"""
    DO $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{ROLE}') THEN
            CREATE ROLE {ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
                NOBYPASSRLS;
        END IF;
    EXCEPTION WHEN duplicate_object THEN
        NULL;  -- created concurrently by another database's migration
    END
    $$
    """,
    # Role settings and membership need rights over the role; where a DBA created it and
    # the migrating role has none, say what to run instead of failing the migration.
    f"""
    DO $$
    BEGIN
        ALTER ROLE {ROLE} SET default_transaction_read_only = on;
        ALTER ROLE {ROLE} SET statement_timeout = '{STATEMENT_TIMEOUT}';
        IF NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) THEN
            EXECUTE format('GRANT {ROLE} TO %I WITH INHERIT FALSE, SET TRUE', current_user);
        END IF;
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE WARNING 'could not configure {ROLE} (%); see docs/reviewer.md', SQLERRM;
    END
    $$
    """,
    f"""
    CREATE TABLE reviewer_access_log (
        access_id     bigint GENERATED ALWAYS AS IDENTITY,
        at            timestamptz NOT NULL DEFAULT now(),
        principal     text        NOT NULL,
        role          text        NOT NULL,
        endpoint      text        NOT NULL,
        parameters    jsonb       NOT NULL,
        rows_returned integer     NOT NULL,
        outcome       text        NOT NULL,
        detail        text,
        CONSTRAINT reviewer_access_log_pkey PRIMARY KEY (access_id),
        CONSTRAINT reviewer_access_log_rows CHECK (rows_returned >= 0),
        CONSTRAINT reviewer_access_log_outcome CHECK (outcome IN {OUTCOMES})
    )
    """,
    "CREATE INDEX reviewer_access_log_at ON reviewer_access_log (at)",
    """
    CREATE TRIGGER reviewer_access_log_append_only BEFORE UPDATE OR DELETE ON reviewer_access_log
        FOR EACH ROW EXECUTE FUNCTION understudy_refuse_edit()
    """,
    """
    CREATE TRIGGER reviewer_access_log_no_truncate BEFORE TRUNCATE ON reviewer_access_log
        FOR EACH STATEMENT EXECUTE FUNCTION understudy_refuse_edit()
    """,
    *VIEWS,
    f"GRANT USAGE ON SCHEMA public TO {ROLE}",
    # Tables, partitions and views that exist now, then whatever this role creates later.
    f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {ROLE}",
    f"ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO {ROLE}",
]

DOWNGRADE = [
    f"ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE SELECT ON TABLES FROM {ROLE}",
    f"REVOKE SELECT ON ALL TABLES IN SCHEMA public FROM {ROLE}",
    f"REVOKE USAGE ON SCHEMA public FROM {ROLE}",
    "DROP VIEW reviewer_protocol_events",
    "DROP VIEW reviewer_experiments",
    "DROP VIEW reviewer_disagreements",
    "DROP VIEW reviewer_decisions",
    "DROP TABLE reviewer_access_log",
    # The role is cluster-wide: other databases (e.g. clones of a migrated template)
    # may still grant it something, and then it stays.
    f"""
    DO $$
    BEGIN
        DROP ROLE {ROLE};
    EXCEPTION WHEN dependent_objects_still_exist OR object_in_use OR insufficient_privilege THEN
        RAISE NOTICE '{ROLE} kept: other databases still refer to it';
    END
    $$
    """,
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
