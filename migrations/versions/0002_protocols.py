"""Experiment protocols: recorded versions with their content hash, and append-only events.

Written by hand, like 0001, because the guarantees live in PostgreSQL itself,
not only in the code that writes (``service/storage/stores/protocol.py`` mirrors
the tables as SQLAlchemy Core; a test compares the two):

- ``protocol_events`` is append-only: UPDATE, DELETE and TRUNCATE are refused
  by triggers, so the timeline a safety reviewer reads was never edited.
- ``protocol_versions`` is locked: only ``state``, ``seq``, ``updated_at`` and
  ``started_at`` may change, only one step at a time (``seq`` + 1), only when
  the event with that sequence number and target state exists, and an
  online-bounded version enters ``running`` only if an ``approve`` event exists.
- An ``approve`` event must carry the ``safety`` role, a verdict (``complete``,
  ``inconclusive``) the evaluator's ``system`` role.

Revision ID: 0002
Revises: 0001
Create Date: 2026-05-12
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

STATES = (
    "('draft', 'approved', 'running', 'rollback-signalled', 'stopped', 'completed', 'inconclusive')"
)
ACTIONS = "('submit', 'approve', 'start', 'stop', 'complete', 'inconclusive', 'signal-rollback')"
ROLES = "('runtime', 'reviewer', 'safety', 'admin', 'system')"

UPGRADE = [
    """
    CREATE TABLE protocols (
        protocol_id       text        NOT NULL,
        first_recorded_at timestamptz NOT NULL DEFAULT now(),
        first_recorded_by text        NOT NULL,
        CONSTRAINT protocols_pkey PRIMARY KEY (protocol_id)
    )
    """,
    f"""
    CREATE TABLE protocol_versions (
        protocol_id       text        NOT NULL,
        version           integer     NOT NULL,
        content_sha256    text        NOT NULL,
        document          jsonb       NOT NULL,
        mode              text        NOT NULL,
        owners            text[]      NOT NULL,
        candidate_policy  text        NOT NULL,
        candidate_version text        NOT NULL,
        candidate_sha256  text,
        submitted_by      text        NOT NULL,
        state             text        NOT NULL,
        seq               integer     NOT NULL,
        recorded_at       timestamptz NOT NULL DEFAULT now(),
        updated_at        timestamptz NOT NULL DEFAULT now(),
        started_at        timestamptz,
        CONSTRAINT protocol_versions_pkey PRIMARY KEY (protocol_id, version),
        CONSTRAINT protocol_versions_protocol_fkey FOREIGN KEY (protocol_id)
            REFERENCES protocols (protocol_id),
        CONSTRAINT protocol_versions_version CHECK (version >= 1),
        CONSTRAINT protocol_versions_seq CHECK (seq >= 1),
        CONSTRAINT protocol_versions_hash CHECK (content_sha256 ~ '^[0-9a-f]{{64}}$'),
        CONSTRAINT protocol_versions_mode CHECK (mode IN ('shadow', 'online-bounded')),
        CONSTRAINT protocol_versions_state CHECK (state IN {STATES})
    )
    """,
    "CREATE INDEX protocol_versions_by_state ON protocol_versions (state)",
    f"""
    CREATE TABLE protocol_events (
        protocol_id    text        NOT NULL,
        version        integer     NOT NULL,
        seq            integer     NOT NULL,
        action         text        NOT NULL,
        from_state     text,
        to_state       text        NOT NULL,
        actor          text        NOT NULL,
        actor_role     text        NOT NULL,
        reason         text        NOT NULL,
        evidence       jsonb       NOT NULL,
        criterion      text,
        content_sha256 text        NOT NULL,
        at             timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT protocol_events_pkey PRIMARY KEY (protocol_id, version, seq),
        CONSTRAINT protocol_events_version_fkey FOREIGN KEY (protocol_id, version)
            REFERENCES protocol_versions (protocol_id, version),
        CONSTRAINT protocol_events_action CHECK (action IN {ACTIONS}),
        CONSTRAINT protocol_events_states CHECK (
            (from_state IS NULL OR from_state IN {STATES}) AND to_state IN {STATES}
        ),
        CONSTRAINT protocol_events_role CHECK (actor_role IN {ROLES}),
        CONSTRAINT protocol_events_approval_by_safety CHECK (
            action <> 'approve' OR actor_role = 'safety'
        ),
        CONSTRAINT protocol_events_verdict_by_system CHECK (
            action NOT IN ('complete', 'inconclusive') OR actor_role = 'system'
        )
    )
    """,
    "CREATE INDEX protocol_events_at ON protocol_events (at)",
    """
    CREATE FUNCTION understudy_refuse_edit() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP;
    END
    $$
    """,
    """
    CREATE FUNCTION understudy_protocol_version_guard() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF (NEW.protocol_id, NEW.version, NEW.content_sha256, NEW.document, NEW.mode,
            NEW.owners, NEW.candidate_policy, NEW.candidate_version, NEW.candidate_sha256,
            NEW.submitted_by, NEW.recorded_at)
           IS DISTINCT FROM
           (OLD.protocol_id, OLD.version, OLD.content_sha256, OLD.document, OLD.mode,
            OLD.owners, OLD.candidate_policy, OLD.candidate_version, OLD.candidate_sha256,
            OLD.submitted_by, OLD.recorded_at) THEN
            RAISE EXCEPTION 'protocol % version % is locked: only its state may change',
                OLD.protocol_id, OLD.version;
        END IF;
        IF NEW.seq <> OLD.seq + 1 THEN
            RAISE EXCEPTION 'protocol % version %: state moves one event at a time (seq % -> %)',
                OLD.protocol_id, OLD.version, OLD.seq, NEW.seq;
        END IF;
        IF NOT EXISTS (
            SELECT 1 FROM protocol_events e
             WHERE e.protocol_id = NEW.protocol_id AND e.version = NEW.version
               AND e.seq = NEW.seq AND e.to_state = NEW.state
               AND e.from_state IS NOT DISTINCT FROM OLD.state
        ) THEN
            RAISE EXCEPTION 'protocol % version %: no event % records % -> %',
                OLD.protocol_id, OLD.version, NEW.seq, OLD.state, NEW.state;
        END IF;
        IF NEW.state = 'running' AND NEW.mode = 'online-bounded' AND NOT EXISTS (
            SELECT 1 FROM protocol_events e
             WHERE e.protocol_id = NEW.protocol_id AND e.version = NEW.version
               AND e.action = 'approve'
        ) THEN
            RAISE EXCEPTION 'protocol % version % is online-bounded and not approved',
                OLD.protocol_id, OLD.version;
        END IF;
        RETURN NEW;
    END
    $$
    """,
    """
    CREATE TRIGGER protocol_versions_locked BEFORE UPDATE ON protocol_versions
        FOR EACH ROW EXECUTE FUNCTION understudy_protocol_version_guard()
    """,
]

for _table in ("protocols", "protocol_versions", "protocol_events"):
    _ops = "DELETE" if _table == "protocol_versions" else "UPDATE OR DELETE"
    UPGRADE += [
        f"""
        CREATE TRIGGER {_table}_append_only BEFORE {_ops} ON {_table}
            FOR EACH ROW EXECUTE FUNCTION understudy_refuse_edit()
        """,
        f"""
        CREATE TRIGGER {_table}_no_truncate BEFORE TRUNCATE ON {_table}
            FOR EACH STATEMENT EXECUTE FUNCTION understudy_refuse_edit()
        """,
    ]

DOWNGRADE = [
    "DROP TABLE protocol_events",
    "DROP TABLE protocol_versions",
    "DROP TABLE protocols",
    "DROP FUNCTION understudy_protocol_version_guard()",
    "DROP FUNCTION understudy_refuse_edit()",
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
