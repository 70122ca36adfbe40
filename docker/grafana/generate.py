"""Generate Understudy's Grafana dashboards from typed grafanalib objects.

    python docker/grafana/generate.py           # rewrite dashboards/*.json
    python docker/grafana/generate.py --check   # fail if the committed JSON is stale

grafanalib (attrs-validated panels, targets and templates) installs cleanly
beside the service's pins, so the structure is checked when the objects are
built; the JSON in `dashboards/` is what Grafana provisions and what
tests/observability compares with this module's output. Every expression
uses only metrics defined in service/metrics.py (docs/metrics.md).
"""

# PromQL reads best unbroken, so long expression lines are allowed here.
# ruff: noqa: E501

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grafanalib import core as g  # type: ignore[import-untyped]
from grafanalib._gen import DashboardEncoder  # type: ignore[import-untyped]

HERE = Path(__file__).resolve().parent
OUT = HERE / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
WIDTH = 24

# Selectors the template variables fill in.
INST = 'instance=~"$instance"'
POL = 'policy=~"$policy"'
EXP = 'experiment=~"$experiment"'


@dataclass(frozen=True)
class Query:
    """One PromQL target and its legend."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """A time series or stat panel; `width` in Grafana's 24-column grid."""

    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    description: str = ""
    width: int = 12
    stat: bool = False


def _q(expr: str, legend: str) -> Query:
    return Query(" ".join(expr.split()), legend)


def _variable(name: str, label: str, metric: str) -> g.Template:
    return g.Template(
        name=name,
        label=label,
        query=f"label_values({metric}, {name})",
        dataSource=DATASOURCE,
        type="query",
        includeAll=True,
        multi=True,
        refresh=2,
        sort=1,
        default="$__all",
    )


def _build(panel: Panel, x: int, y: int) -> g.Panel:
    targets = [
        g.Target(expr=q.expr, legendFormat=q.legend, refId=chr(ord("A") + i), datasource=DATASOURCE)
        for i, q in enumerate(panel.queries)
    ]
    pos = g.GridPos(h=8, w=panel.width, x=x, y=y)
    if panel.stat:
        return g.Stat(
            title=panel.title,
            description=panel.description,
            dataSource=DATASOURCE,
            targets=targets,
            gridPos=pos,
            format=panel.unit,
            reduceCalc="lastNotNull",
            graphMode="area",
        )
    return g.TimeSeries(
        title=panel.title,
        description=panel.description,
        dataSource=DATASOURCE,
        targets=targets,
        gridPos=pos,
        unit=panel.unit,
        legendDisplayMode="table",
        legendCalcs=["lastNotNull", "max"],
    )


def _dashboard(
    uid: str,
    title: str,
    description: str,
    variables: Sequence[g.Template],
    rows: Sequence[tuple[str, Sequence[Panel]]],
) -> g.Dashboard:
    panels: list[g.Panel] = []
    y = 0
    for row_title, row in rows:
        panels.append(g.RowPanel(title=row_title, gridPos=g.GridPos(h=1, w=WIDTH, x=0, y=y)))
        y += 1
        x = 0
        for panel in row:
            if x + panel.width > WIDTH:
                x, y = 0, y + 8
            panels.append(_build(panel, x, y))
            x += panel.width
        y += 8
    return g.Dashboard(
        title=title,
        uid=uid,
        description=description,
        tags=["understudy"],
        timezone="utc",
        refresh="30s",
        time=g.Time("now-6h", "now"),
        templating=g.Templating(list=list(variables)),
        panels=panels,
    ).auto_panel_ids()


def _hist(q: float, metric: str, by: str, sel: str) -> str:
    return (
        f"histogram_quantile({q}, sum by ({by}, le) "
        f"(rate({metric}_bucket{{{sel}}}[$__rate_interval])))"
    )


def oncall() -> g.Dashboard:
    """Traffic, shed, latency, journal, scoring errors, quarantine, database."""
    traffic = [
        Panel(
            "Ingest by result",
            (
                _q(
                    f"sum by (kind, result) (rate(understudy_ingest_total{{{INST}}}[$__rate_interval]))",
                    "{{kind}} {{result}}",
                ),
            ),
            "reqps",
            "Every mirrored message and outcome: accepted + shed + rejected = received.",
        ),
        Panel(
            "Shed rate by replica",
            (
                _q(
                    f'sum by (instance) (rate(understudy_ingest_total{{{INST}, result="shed"}}[$__rate_interval]))',
                    "{{instance}}",
                ),
            ),
            "reqps",
            "Mirrored work dropped because the journal is full. Never back-pressure.",
        ),
        Panel(
            "Rejections by field",
            (
                _q(
                    f"sum by (transport, field) (rate(understudy_ingest_rejections_total{{{INST}}}[$__rate_interval]))",
                    "{{transport}} {{field}}",
                ),
            ),
            "reqps",
        ),
        Panel(
            "Ack latency p99 by transport",
            (
                _q(
                    _hist(0.99, "understudy_ack_latency_seconds", "transport", INST),
                    "{{transport}}",
                ),
            ),
            "s",
            "Receive to ack ready (parse, validate, journal append). Independent of scoring.",
        ),
        Panel(
            "Auth failures",
            (
                _q(
                    f"sum by (transport, reason) (rate(understudy_auth_failures_total{{{INST}}}[$__rate_interval]))",
                    "{{transport}} {{reason}}",
                ),
            ),
            "reqps",
        ),
        Panel(
            "Ready",
            (_q(f"understudy_ready{{{INST}}}", "{{instance}}"),),
            "short",
            "1 when every readiness check passes.",
            stat=True,
        ),
    ]
    journal = [
        Panel(
            "Journal fill",
            (
                _q(
                    f"understudy_journal_depth_bytes{{{INST}}} / understudy_journal_capacity_bytes{{{INST}}}",
                    "{{instance}}",
                ),
            ),
            "percentunit",
            "Shedding starts at 100%.",
        ),
        Panel(
            "Journal depth (records)",
            (_q(f"understudy_journal_depth_records{{{INST}}}", "{{instance}}"),),
        ),
    ]
    scoring = [
        Panel(
            "Policy batch latency p99",
            (
                _q(
                    _hist(
                        0.99, "understudy_policy_batch_latency_seconds", "policy", f"{INST}, {POL}"
                    ),
                    "{{policy}}",
                ),
            ),
            "s",
        ),
        Panel(
            "Decisions by policy and status",
            (
                _q(
                    f"sum by (policy, status) (rate(understudy_decisions_total{{{INST}, {POL}}}[$__rate_interval]))",
                    "{{policy}} {{status}}",
                ),
            ),
            "ops",
        ),
        Panel(
            "Policy error + timeout ratio",
            (
                _q(
                    f'sum by (policy) (rate(understudy_decisions_total{{{INST}, {POL}, status=~"error|timeout"}}[$__rate_interval]))'
                    f" / sum by (policy) (rate(understudy_decisions_total{{{INST}, {POL}}}[$__rate_interval]))",
                    "{{policy}}",
                ),
            ),
            "percentunit",
        ),
        Panel(
            "Quarantined policies",
            (
                _q(
                    f"max by (policy) (understudy_policy_quarantined{{{INST}, {POL}}})",
                    "{{policy}}",
                ),
            ),
            "short",
            "1 while the policy is quarantined (not scored); /readyz names the reason.",
        ),
        Panel(
            "Quarantine events",
            (
                _q(
                    f"sum by (policy, event) (understudy_policy_quarantine_events_total{{{INST}, {POL}}})",
                    "{{policy}} {{event}}",
                ),
            ),
        ),
        Panel(
            "Scorer micro-batch size p50",
            (_q(_hist(0.5, "understudy_scorer_batch_size", "instance", INST), "{{instance}}"),),
        ),
    ]
    database = [
        Panel(
            "Database up (health probe)",
            (_q(f"understudy_db_up{{{INST}}}", "{{instance}}"),),
            "short",
            "1 when the bounded health probe (connect + statement within 1 s) answered in the "
            "last readiness round, 0 when it failed or did not answer (down, frozen, "
            'unreachable). Write failures: "Write batches by result".',
        ),
        Panel(
            "Decision log lag (requests, records)",
            (
                _q(f"understudy_db_lag_requests{{{INST}}}", "{{instance}} requests"),
                _q(f"understudy_db_lag_records{{{INST}}}", "{{instance}} records"),
            ),
            "short",
            "Requests (and outcome reports) journaled and acked but not yet in the decision "
            "log, and the journal records holding them: a batch of up to 1,024 requests is "
            "one record.",
        ),
        Panel(
            "Decision log lag (age of the oldest unlogged record)",
            (_q(f"understudy_db_lag_seconds{{{INST}}}", "{{instance}}"),),
            "s",
            "How long ago the oldest acked record not yet logged was journaled; "
            "UnderstudyDatabaseLag fires above 60 s for 10 minutes.",
        ),
        Panel(
            "Write batches by result",
            (
                _q(
                    f"sum by (result) (rate(understudy_db_write_batches_total{{{INST}}}[$__rate_interval]))",
                    "{{result}}",
                ),
            ),
            "ops",
        ),
        Panel(
            "Batch commit latency p99",
            (
                _q(
                    _hist(0.99, "understudy_db_write_latency_seconds", "instance", INST),
                    "{{instance}}",
                ),
            ),
            "s",
        ),
        Panel(
            "Rows inserted by table",
            (
                _q(
                    f"sum by (table) (rate(understudy_db_rows_inserted_total{{{INST}}}[$__rate_interval]))",
                    "{{table}}",
                ),
            ),
            "rowsps",
        ),
        Panel(
            "Tamper-evidence sealing lag",
            (
                _q(
                    f"max by (instance) (understudy_chain_seal_lag_seconds{{{INST}}})",
                    "{{instance}}",
                ),
            ),
            "s",
            "Age of the oldest logged decision not yet hash-chained and anchored (docs/tamper_evidence.md).",
        ),
        Panel(
            "Rows sealed",
            (
                _q(
                    f"sum by (instance) (rate(understudy_chain_sealed_rows_total{{{INST}}}[$__rate_interval]))",
                    "{{instance}} sealed",
                ),
                _q(
                    f"sum by (instance) (rate(understudy_chain_seal_errors_total{{{INST}}}[$__rate_interval]))",
                    "{{instance}} errors",
                ),
            ),
            "ops",
        ),
        Panel(
            "Dead letters",
            (
                _q(
                    f"sum by (instance, kind) (understudy_dead_letters_total{{{INST}}})",
                    "{{instance}} {{kind}}",
                ),
            ),
            "short",
            "Records the decision log refused alone, in <data_dir>/dead-letter/.",
        ),
    ]
    outcomes = [
        Panel(
            "Outcome join events",
            (
                _q(
                    f"sum by (state) (rate(understudy_outcomes_total{{{INST}}}[$__rate_interval]))",
                    "{{state}}",
                ),
            ),
            "ops",
        ),
        Panel(
            "Outcome join lag p90",
            (_q(_hist(0.9, "understudy_outcome_delay_seconds", "instance", INST), "{{instance}}"),),
            "s",
            "Runtime's observed_at minus request_time of joined outcomes.",
        ),
    ]
    return _dashboard(
        "understudy-oncall",
        "Understudy / On-call overview",
        "Ingest, journal, scoring, quarantine and decision-log health per replica.",
        [
            _variable("instance", "replica", "understudy_ready"),
            _variable("policy", "policy", "understudy_decisions_total"),
        ],
        [
            ("Traffic", traffic),
            ("Journal", journal),
            ("Scoring and quarantine", scoring),
            ("Decision log", database),
            ("Outcomes", outcomes),
        ],
    )


def experiments() -> g.Dashboard:
    """Per experiment: criteria over time, status, transitions; agreement per policy."""
    by = "experiment, criterion"
    criteria = [
        Panel(
            "Criterion value, bound and threshold",
            (
                _q(
                    f"max by ({by}) (understudy_experiment_criterion_value{{{EXP}}})",
                    "{{experiment}} {{criterion}} value",
                ),
                _q(
                    f"max by ({by}) (understudy_experiment_criterion_bound{{{EXP}}})",
                    "{{experiment}} {{criterion}} bound",
                ),
                _q(
                    f"max by ({by}) (understudy_experiment_criterion_threshold{{{EXP}}})",
                    "{{experiment}} {{criterion}} threshold",
                ),
            ),
            "short",
            "A criterion fires when its anytime-valid bound crosses the threshold (docs/evaluator.md).",
            width=24,
        ),
        Panel(
            "Criterion status",
            (
                _q(
                    f"max by ({by}, status) (understudy_experiment_criterion_status{{{EXP}}}) == 1",
                    "{{experiment}} {{criterion}} {{status}}",
                ),
            ),
        ),
        Panel(
            "Samples per criterion",
            (
                _q(
                    f"max by ({by}) (understudy_experiment_criterion_samples{{{EXP}}})",
                    "{{experiment}} {{criterion}}",
                ),
            ),
        ),
        Panel(
            "Transitions",
            (
                _q(
                    f"sum by (experiment, action, criterion) (understudy_experiment_transitions_total{{{EXP}}})",
                    "{{experiment}} {{action}} {{criterion}}",
                ),
            ),
            "short",
            "Verdicts the evaluator applied (start, stop, complete, inconclusive, signal-rollback).",
        ),
        Panel(
            "Rollback signalled",
            (
                _q(
                    f"max by (experiment) (understudy_experiment_rollback_signalled{{{EXP}}})",
                    "{{experiment}}",
                ),
            ),
            "short",
            "A signal for Runtime and Safety; Understudy never acts.",
        ),
    ]
    agreement = [
        Panel(
            "Agreement with production",
            (
                _q(
                    f'sum by (policy) (rate(understudy_production_agreement_total{{{INST}, {POL}, agrees="true"}}[$__rate_interval]))'
                    f" / sum by (policy) (rate(understudy_production_agreement_total{{{INST}, {POL}}}[$__rate_interval]))",
                    "{{policy}}",
                ),
            ),
            "percentunit",
        ),
        Panel(
            "Raw favourite infeasible",
            (
                _q(
                    f"sum by (policy) (rate(understudy_raw_favourite_infeasible_total{{{INST}, {POL}}}[$__rate_interval]))"
                    f" / sum by (policy) (rate(understudy_decisions_total{{{INST}, {POL}}}[$__rate_interval]))",
                    "{{policy}}",
                ),
            ),
            "percentunit",
        ),
    ]
    model_health = [
        Panel(
            "Drift: largest feature PSI",
            (_q(f"max by (policy) (understudy_drift_psi_max{{{INST}, {POL}}})", "{{policy}}"),),
            "short",
            "Largest per-feature PSI of the last closed window against the policy's training summary (docs/drift.md). Above ~0.25 is a large shift.",
            width=8,
        ),
        Panel(
            "Drift flagged",
            (_q(f"max by (policy) (understudy_drift_flagged{{{INST}, {POL}}})", "{{policy}}"),),
            "short",
            "1 when the last closed window failed the drift test (false-flag rate controlled at 5%).",
            width=8,
        ),
        Panel(
            "Decisions on out-of-support inputs",
            (
                _q(
                    f"sum by (policy) (rate(understudy_drift_out_of_support_decisions_total{{{INST}, {POL}}}[$__rate_interval]))",
                    "{{policy}}",
                ),
            ),
            "ops",
            "Inputs outside what the policy was trained on: its choices there are extrapolation.",
            width=8,
        ),
        Panel(
            "Drift: arrival-rate shift",
            (
                _q(
                    f"max by (policy) (understudy_drift_arrival_shift{{{INST}, {POL}}})",
                    "{{policy}}",
                ),
            ),
            "short",
            "Log upper-quartile gap between requests in Runtime's clock minus its training median; negative = faster arrivals (docs/drift.md).",
            width=8,
        ),
        Panel(
            "Outcome drift: throughput shift by hardware class",
            (
                _q(
                    f"max by (policy, hardware) (understudy_drift_outcome_shift{{{INST}, {POL}}})",
                    "{{policy}} {{hardware}}",
                ),
            ),
            "short",
            "Median log throughput of placed jobs per hardware class minus the training median of their cell; -0.69 = half speed (docs/drift.md, Outcome drift).",
            width=8,
        ),
        Panel(
            "Calibration: interval coverage",
            (
                _q(
                    f"max by (policy, level) (understudy_calibration_coverage{{{INST}, {POL}}})",
                    "{{policy}} nominal {{level}}",
                ),
            ),
            "percentunit",
            "Observed coverage of the predictor's central intervals on joined outcomes; should sit at the nominal level (docs/calibration.md).",
            width=8,
        ),
        Panel(
            "Calibration flagged",
            (
                _q(
                    f"max by (policy) (understudy_calibration_flagged{{{INST}, {POL}}})",
                    "{{policy}}",
                ),
            ),
            "short",
            "1 when the last window's coverage test rejected calibration.",
            width=8,
        ),
        Panel(
            "Outcomes in the calibration window",
            (
                _q(
                    f"max by (policy) (understudy_calibration_outcomes{{{INST}, {POL}}})",
                    "{{policy}}",
                ),
            ),
            "short",
            width=8,
        ),
    ]
    evaluator = [
        Panel(
            "Evaluator leader",
            (_q(f"understudy_evaluator_leader{{{INST}}}", "{{instance}}"),),
            "short",
            "Exactly one replica should hold the lease.",
        ),
        Panel(
            "Evaluator ticks by result",
            (
                _q(
                    f"sum by (instance, result) (rate(understudy_evaluator_ticks_total{{{INST}}}[$__rate_interval]))",
                    "{{instance}} {{result}}",
                ),
            ),
            "ops",
        ),
    ]
    return _dashboard(
        "understudy-experiments",
        "Understudy / Experiments",
        "Predeclared protocols: each criterion against its threshold, verdicts, and how "
        "candidates agree with production.",
        [
            _variable("experiment", "experiment", "understudy_experiment_criterion_value"),
            _variable("policy", "policy", "understudy_decisions_total"),
            _variable("instance", "replica", "understudy_ready"),
        ],
        [
            ("Criteria", criteria),
            ("Policies vs production", agreement),
            ("Model health: drift and calibration", model_health),
            ("Evaluator", evaluator),
        ],
    )


def render(dashboard: g.Dashboard) -> str:
    """The dashboard as provisioned JSON (stable key order, trailing newline)."""
    data = json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder))
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def dashboards() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {"oncall.json": render(oncall()), "experiments.json": render(experiments())}


def main(argv: Sequence[str]) -> int:
    stale = []
    for name, text in dashboards().items():
        path = OUT / name
        if "--check" in argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run python docker/grafana/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
