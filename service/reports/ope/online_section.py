"""Online-bounded numbers: what the evaluator judged for online protocols, as a package section.

An online-bounded protocol lets the candidate act on a bounded slice of
production, so its criteria are evidence of another kind than the
off-policy estimates: the candidate's own outcomes, judged with the
evaluator's (anytime-valid) bounds. The package reads the newest stored
evaluation of each criterion of every recorded online-bounded protocol
version (``EvaluationStore.latest``), tags each number `online-bounded`, and
lays them out in their own section. No such protocol: no section, and the
limitations say the package holds no online-bounded evidence.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Engine

from service.protocols.criteria import Evaluation
from service.protocols.schema import Mode
from service.reports.ope.ope_run import Provenance
from service.reports.ope.package import ONLINE_SECTION
from service.reports.ope.sections import ReportSection
from service.reports.ope.summary import fmt
from service.reports.protocol.package import html_table, md_table
from service.storage import EvaluationStore, ProtocolStore

TITLE = "Online-bounded evidence"
HEAD = [
    "protocol", "candidate", "state", "criterion", "role", "metric", "status", "value",
    "interval", "bound", "threshold", "n", "method", "evaluated", "provenance",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class OnlineBound:
    """One criterion of an online-bounded protocol version, as last evaluated."""

    protocol_id: str
    version: int
    candidate: str
    state: str
    evaluation: Evaluation
    evaluated_at: float


def read_online_bounds(engine: Engine) -> list[OnlineBound]:
    """The newest evaluation of every criterion of every online-bounded protocol version."""
    store = EvaluationStore(engine)
    out = []
    for record in ProtocolStore(engine).recorded():
        if record.mode is not Mode.ONLINE_BOUNDED:
            continue
        candidate = str(record.protocol().candidate)
        for stored in store.latest(record.protocol_id, record.version):
            out.append(
                OnlineBound(
                    protocol_id=record.protocol_id,
                    version=record.version,
                    candidate=candidate,
                    state=record.state.value,
                    evaluation=stored.evaluation,
                    evaluated_at=stored.evaluated_at,
                )
            )
    return out


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _row(b: OnlineBound) -> list[str]:
    e = b.evaluation
    interval = "—" if e.lower is None and e.upper is None else f"[{fmt(e.lower)}, {fmt(e.upper)}]"
    when = datetime.fromtimestamp(b.evaluated_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return [
        f"{b.protocol_id} v{b.version}",
        b.candidate,
        b.state,
        e.name,
        e.role.value,
        e.metric,
        e.status.value,
        fmt(e.value),
        interval,
        fmt(e.bound),
        fmt(e.threshold),
        str(e.n),
        e.method,
        when,
        Provenance.ONLINE_BOUNDED.value,
    ]


def build_online_section(bounds: list[OnlineBound]) -> ReportSection | None:
    """The section of `bounds`, or None when there are none."""
    if not bounds:
        return None
    rows = [_row(b) for b in bounds]
    note = (
        "Criteria of online-bounded protocols (the candidate acted on a bounded slice), as the "
        "evaluator last judged them; intervals are the evaluator's, not this package's."
    )
    results = {
        "bounds": [
            {
                "protocol_id": b.protocol_id,
                "version": b.version,
                "candidate": b.candidate,
                "state": b.state,
                "criterion": b.evaluation.name,
                "role": b.evaluation.role.value,
                "metric": b.evaluation.metric,
                "status": b.evaluation.status.value,
                "value": _num(b.evaluation.value),
                "lower": _num(b.evaluation.lower),
                "upper": _num(b.evaluation.upper),
                "bound": _num(b.evaluation.bound),
                "threshold": _num(b.evaluation.threshold),
                "n": b.evaluation.n,
                "alpha": b.evaluation.alpha,
                "method": b.evaluation.method,
                "note": b.evaluation.note,
                "evaluated_at": b.evaluated_at,
                "provenance": Provenance.ONLINE_BOUNDED.value,
            }
            for b in bounds
        ]
    }
    return ReportSection(
        key=ONLINE_SECTION,
        title=TITLE,
        markdown="\n".join([note, "", *md_table(HEAD, rows)]) + "\n",
        html=f"<p>{html.escape(note)}</p>{html_table(HEAD, rows)}",
        results=results,
        limitations=(
            "online-bounded numbers cover only the bounded slice each protocol let the "
            "candidate act on, over its own time window; they are not comparable number for "
            "number with the off-policy estimates above.",
        ),
    )
