"""The evaluator: its lease with a fencing generation, evaluations, evidence snapshots.

Written by hand, like 0001 and 0002, because the guarantees live in PostgreSQL
(``service/storage/stores/evaluation.py`` mirrors the tables as SQLAlchemy
Core; a test compares the two):

- ``evaluator_leases``: one row per lease (``evaluator``). Taking over an
  expired lease increments ``generation``: the fencing token (Kleppmann,
  "How to do distributed locking", 2016). Times are the database's clock.
- Fencing: a verdict (an event whose ``actor_role`` is ``system``), an
  evaluation row and an evidence snapshot are refused unless they carry the
  holder and generation of the lease as it is now and the lease has not
  expired. A verdict locks the lease row (FOR SHARE) until it commits, so a
  takeover waits for it instead of racing it; such a transaction gets a 5 s
  idle-in-transaction timeout, so a writer frozen mid-transaction (SIGSTOP)
  cannot hold the lease row for ever. While no lease row exists (no evaluator
  has ever run, e.g. the protocol tests) verdicts are not fenced.
- ``evaluations`` and ``evidence_snapshots`` are append-only (UPDATE, DELETE
  and TRUNCATE refused), like ``protocol_events``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-05-20
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

STATUSES = (
    "('insufficient', 'pending', 'fired', 'passed', 'failed', 'not_identifiable', 'unavailable')"
)
ROLES = "('primary', 'guardrail', 'stop', 'rollback', 'data_quality', 'limit')"
FENCE_SQLSTATE = "UF001"

UPGRADE = [
    """
    CREATE TABLE evaluator_leases (
        name        text        NOT NULL,
        holder      text        NOT NULL,
        generation  bigint      NOT NULL,
        acquired_at timestamptz NOT NULL,
        renewed_at  timestamptz NOT NULL,
        expires_at  timestamptz NOT NULL,
        CONSTRAINT evaluator_leases_pkey PRIMARY KEY (name),
        CONSTRAINT evaluator_leases_generation CHECK (generation >= 1)
    )
    """,
    f"""
    CREATE TABLE evaluations (
        evaluation_id bigint GENERATED ALWAYS AS IDENTITY,
        protocol_id   text             NOT NULL,
        version       integer          NOT NULL,
        criterion     text             NOT NULL,
        role          text             NOT NULL,
        metric        text             NOT NULL,
        status        text             NOT NULL,
        value         double precision,
        bound         double precision,
        threshold     double precision NOT NULL,
        lower_bound   double precision,
        upper_bound   double precision,
        n             bigint           NOT NULL,
        alpha         double precision NOT NULL,
        method        text             NOT NULL,
        note          text             NOT NULL,
        evaluated_at  timestamptz      NOT NULL DEFAULT now(),
        holder        text             NOT NULL,
        generation    bigint           NOT NULL,
        CONSTRAINT evaluations_pkey PRIMARY KEY (evaluation_id),
        CONSTRAINT evaluations_version_fkey FOREIGN KEY (protocol_id, version)
            REFERENCES protocol_versions (protocol_id, version),
        CONSTRAINT evaluations_status CHECK (status IN {STATUSES}),
        CONSTRAINT evaluations_role CHECK (role IN {ROLES})
    )
    """,
    "CREATE INDEX evaluations_by_experiment ON evaluations (protocol_id, version, evaluated_at)",
    """
    CREATE TABLE evidence_snapshots (
        protocol_id    text        NOT NULL,
        version        integer     NOT NULL,
        seq            integer     NOT NULL,
        content_sha256 text        NOT NULL,
        state          text        NOT NULL,
        summary        jsonb       NOT NULL,
        markdown       text        NOT NULL,
        html           text        NOT NULL,
        created_at     timestamptz NOT NULL DEFAULT now(),
        holder         text        NOT NULL,
        generation     bigint      NOT NULL,
        CONSTRAINT evidence_snapshots_pkey PRIMARY KEY (protocol_id, version, seq),
        CONSTRAINT evidence_snapshots_event_fkey FOREIGN KEY (protocol_id, version, seq)
            REFERENCES protocol_events (protocol_id, version, seq)
    )
    """,
    f"""
    CREATE FUNCTION understudy_fenced_row() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT EXISTS (
            SELECT 1 FROM evaluator_leases l
             WHERE l.name = 'evaluator' AND l.holder = NEW.holder
               AND l.generation = NEW.generation AND l.expires_at > clock_timestamp()
        ) THEN
            RAISE EXCEPTION 'evaluator fenced: % generation % does not hold the lease',
                NEW.holder, NEW.generation USING ERRCODE = '{FENCE_SQLSTATE}';
        END IF;
        RETURN NEW;
    END
    $$
    """,
    f"""
    CREATE FUNCTION understudy_fenced_verdict() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        lease evaluator_leases%ROWTYPE;
    BEGIN
        IF NEW.actor_role <> 'system' THEN
            RETURN NEW;
        END IF;
        SELECT * INTO lease FROM evaluator_leases WHERE name = 'evaluator' FOR SHARE;
        IF NOT FOUND THEN
            RETURN NEW;
        END IF;
        PERFORM set_config('idle_in_transaction_session_timeout', '5000', true);
        IF NEW.evidence -> 'lease' ->> 'holder' IS DISTINCT FROM lease.holder
           OR (NEW.evidence -> 'lease' ->> 'generation')::bigint IS DISTINCT FROM lease.generation
           OR lease.expires_at <= clock_timestamp() THEN
            RAISE EXCEPTION
                'evaluator fenced: verdict from % generation %, lease is % generation % until %',
                NEW.evidence -> 'lease' ->> 'holder', NEW.evidence -> 'lease' ->> 'generation',
                lease.holder, lease.generation, lease.expires_at
                USING ERRCODE = '{FENCE_SQLSTATE}';
        END IF;
        RETURN NEW;
    END
    $$
    """,
    """
    CREATE TRIGGER protocol_events_fenced BEFORE INSERT ON protocol_events
        FOR EACH ROW EXECUTE FUNCTION understudy_fenced_verdict()
    """,
]

for _table in ("evaluations", "evidence_snapshots"):
    UPGRADE += [
        f"""
        CREATE TRIGGER {_table}_fenced BEFORE INSERT ON {_table}
            FOR EACH ROW EXECUTE FUNCTION understudy_fenced_row()
        """,
        f"""
        CREATE TRIGGER {_table}_append_only BEFORE UPDATE OR DELETE ON {_table}
            FOR EACH ROW EXECUTE FUNCTION understudy_refuse_edit()
        """,
        f"""
        CREATE TRIGGER {_table}_no_truncate BEFORE TRUNCATE ON {_table}
            FOR EACH STATEMENT EXECUTE FUNCTION understudy_refuse_edit()
        """,
    ]

DOWNGRADE = [
    "DROP TRIGGER protocol_events_fenced ON protocol_events",
    "DROP TABLE evidence_snapshots",
    "DROP TABLE evaluations",
    "DROP TABLE evaluator_leases",
    "DROP FUNCTION understudy_fenced_verdict()",
    "DROP FUNCTION understudy_fenced_row()",
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
