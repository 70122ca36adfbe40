"""Reviewer role hardening: no advisory-lock or large-object powers, guarded timeouts.

docs/reviewer.md, "What makes it read-only".

What the read-only ``understudy_reviewer`` role (0004) could still do, and what
this revision takes away:

- **advisory locks.** ``pg_advisory_*`` / ``pg_try_advisory_*`` are executable
  by PUBLIC, so the reviewer could take the sealer's lock and stop sealing.
  EXECUTE on every advisory-lock function is revoked from PUBLIC — a per-database
  ACL — and granted back to the migrating role (the service's, which the
  sealer, ``log verify`` and ``understudy_ensure_partitions`` need; a superuser
  needs no grant). Another service role: ``GRANT EXECUTE`` on them to it (see
  docs/reviewer.md).
- **large objects.** After ``SET default_transaction_read_only = off`` the
  reviewer could ``lo_create`` (large objects are not tables; table privileges
  do not cover them). EXECUTE on every ``lo_*`` function (and ``loread``,
  ``lowrite``) is revoked from PUBLIC; the service uses none.
- **timeouts.** The role's defaults gain ``idle_in_transaction_session_timeout``
  and, on PostgreSQL 17+, ``transaction_timeout``. A role may always change its
  own defaults and session settings, so these are courtesy limits; the
  service's reviewer guard (``service/storage/reviewer/guard.py``) ends
  reviewer sessions over the limit and puts changed defaults back.
- **the access log** gets ``status``: the HTTP status the query was answered
  with (null on rows written before this revision), and two outcomes:
  ``timeout`` (the read ran past its statement timeout) and ``failed`` (an
  unexpected error, a 500).

Function ACLs need ownership of the catalog functions (a superuser): a
migrating role without it migrates anyway and warns; an administrator then
runs the REVOKE statements of docs/reviewer.md.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

ROLE = "understudy_reviewer"
OUTCOMES = "('ok', 'rejected', 'not_found', 'denied', 'error', 'timeout', 'failed')"
OLD_OUTCOMES = "('ok', 'rejected', 'not_found', 'denied', 'error')"

# Every advisory-lock and large-object function of pg_catalog, with its signature.
_FUNCTIONS = """
    SELECT p.oid::regprocedure AS fn,
           p.proname LIKE 'pg\\_%advisory%' AS advisory
      FROM pg_proc p
     WHERE p.pronamespace = 'pg_catalog'::regnamespace
       AND (p.proname LIKE 'pg\\_advisory\\_%' OR p.proname LIKE 'pg\\_try\\_advisory\\_%'
            OR p.proname LIKE 'lo\\_%' OR p.proname IN ('loread', 'lowrite'))
"""

REVOKE = f"""
DO $$
DECLARE
    f record;
    super boolean := (SELECT rolsuper FROM pg_roles WHERE rolname = current_user);
BEGIN
    FOR f IN {_FUNCTIONS} LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f.fn);
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM {ROLE}', f.fn);
        IF f.advisory AND NOT super THEN
            EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f.fn, current_user);
        END IF;
    END LOOP;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE WARNING 'could not revoke advisory-lock and large-object functions from PUBLIC (%);'
        ' see docs/reviewer.md', SQLERRM;
END
$$
"""

REGRANT = f"""
DO $$
DECLARE
    f record;
BEGIN
    FOR f IN {_FUNCTIONS} LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', f.fn);
    END LOOP;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE WARNING 'could not grant the functions back to PUBLIC (%)', SQLERRM;
END
$$
"""

TIMEOUTS = f"""
DO $$
BEGIN
    ALTER ROLE {ROLE} SET idle_in_transaction_session_timeout = '60s';
    IF current_setting('server_version_num')::int >= 170000 THEN
        ALTER ROLE {ROLE} SET transaction_timeout = '5min';
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE WARNING 'could not configure {ROLE} (%); see docs/reviewer.md', SQLERRM;
END
$$
"""

NO_TIMEOUTS = f"""
DO $$
BEGIN
    ALTER ROLE {ROLE} RESET idle_in_transaction_session_timeout;
    IF current_setting('server_version_num')::int >= 170000 THEN
        ALTER ROLE {ROLE} RESET transaction_timeout;
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE WARNING 'could not reset {ROLE} (%)', SQLERRM;
END
$$
"""

UPGRADE = [
    REVOKE,
    TIMEOUTS,
    "ALTER TABLE reviewer_access_log ADD COLUMN status smallint",
    "ALTER TABLE reviewer_access_log ADD CONSTRAINT reviewer_access_log_status"
    " CHECK (status BETWEEN 100 AND 599)",
    "ALTER TABLE reviewer_access_log DROP CONSTRAINT reviewer_access_log_outcome",
    "ALTER TABLE reviewer_access_log ADD CONSTRAINT reviewer_access_log_outcome"
    f" CHECK (outcome IN {OUTCOMES})",
]

# The log is append-only (no UPDATE/DELETE): rows with the new outcomes stay, so the old
# constraint comes back NOT VALID (checked on new rows only).
DOWNGRADE = [
    "ALTER TABLE reviewer_access_log DROP CONSTRAINT reviewer_access_log_outcome",
    "ALTER TABLE reviewer_access_log ADD CONSTRAINT reviewer_access_log_outcome"
    f" CHECK (outcome IN {OLD_OUTCOMES}) NOT VALID",
    "ALTER TABLE reviewer_access_log DROP CONSTRAINT reviewer_access_log_status",
    "ALTER TABLE reviewer_access_log DROP COLUMN status",
    NO_TIMEOUTS,
    REGRANT,
]


def upgrade() -> None:
    for statement in UPGRADE:
        op.execute(statement)


def downgrade() -> None:
    for statement in DOWNGRADE:
        op.execute(statement)
