"""The decision-log views show the logged feasibility: per decision its request's, per option why.

- ``reviewer_decisions`` (and ``reviewer_disagreements``, its ``SELECT *``) gain
  the request's ``qos_class``, ``feasibility_version`` and ``feasibility_bits``
  (migration 0010), appended after the existing columns.
- ``reviewer_option_feasibility``: one row per option of every request whose
  bits were logged — ``option``, its ``bits`` (bit i = signal i of the row's
  version), ``feasible`` and ``signals`` (the names, in bit order; null for a
  version this revision does not name). Rows logged before 0010 have no bits
  and no rows here (replay and the reviewer API recompute them).

The names below are frozen here as each version defined them (a later version
adds its own line; `service.storage.log.masks.SIGNALS_BY_VERSION` is the code's
copy, and a test holds the two equal).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

ROLE = "understudy_reviewer"
SIGNALS = {
    "feasibility-v1": (
        "capacity",
        "accelerator_memory",
        "hardware_compatibility",
        "affinity",
        "anti_affinity",
        "quota",
        "drain",
    ),
    "feasibility-v2": (
        "accelerator_count",
        "accelerator_share",
        "accelerator_memory",
        "cpu",
        "memory",
        "hardware_compatibility",
        "affinity",
        "anti_affinity",
        "quota",
        "drain",
    ),
}
_VALUES = ", ".join(
    f"('{version}', {bit}, '{name}')"
    for version, names in SIGNALS.items()
    for bit, name in enumerate(names)
)
_KNOWN = ", ".join(f"'{v}'" for v in SIGNALS)

_DECISIONS_0004 = """
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
           o.completion_time_s, o.slo_met, o.failure, o.join_state{extra}
      FROM decisions d
      JOIN requests r ON r.request_id = d.request_id AND r.request_time = d.request_time
      LEFT JOIN outcomes o ON o.request_id = d.request_id AND o.request_time = d.request_time
"""
_EXTRA = ",\n           r.qos_class, r.feasibility_version, r.feasibility_bits"

OPTION_FEASIBILITY = f"""
    CREATE VIEW reviewer_option_feasibility AS
    SELECT r.request_id, r.request_time, r.feasibility_version, o.option, m.bits,
           m.bits = 0 AS feasible,
           CASE WHEN r.feasibility_version IN ({_KNOWN}) THEN
               ARRAY(SELECT s.name FROM (VALUES {_VALUES}) AS s(version, bit, name)
                      WHERE s.version = r.feasibility_version AND (m.bits >> s.bit) & 1 = 1
                      ORDER BY s.bit)
           END AS signals
      FROM requests r
      CROSS JOIN LATERAL generate_series(0, octet_length(r.feasibility_bits) / 2 - 1) AS o(option)
      CROSS JOIN LATERAL (
          SELECT get_byte(r.feasibility_bits, 2 * o.option)
                 | (get_byte(r.feasibility_bits, 2 * o.option + 1) << 8) AS bits) AS m
     WHERE r.feasibility_bits IS NOT NULL
"""


def upgrade() -> None:
    op.execute(
        "CREATE OR REPLACE VIEW reviewer_decisions AS" + _DECISIONS_0004.format(extra=_EXTRA)
    )
    op.execute(
        "CREATE OR REPLACE VIEW reviewer_disagreements AS "
        "SELECT * FROM reviewer_decisions WHERE agrees_with_production IS FALSE"
    )
    op.execute(OPTION_FEASIBILITY)
    op.execute(f"GRANT SELECT ON reviewer_option_feasibility TO {ROLE}")


def downgrade() -> None:
    op.execute("DROP VIEW reviewer_option_feasibility")
    op.execute("DROP VIEW reviewer_disagreements")
    op.execute("DROP VIEW reviewer_decisions")
    op.execute("CREATE VIEW reviewer_decisions AS" + _DECISIONS_0004.format(extra=""))
    op.execute(
        "CREATE VIEW reviewer_disagreements AS "
        "SELECT * FROM reviewer_decisions WHERE agrees_with_production IS FALSE"
    )
    op.execute(f"GRANT SELECT ON reviewer_decisions, reviewer_disagreements TO {ROLE}")
