"""The OPE evidence package: what `understudy evidence` writes.

Layout (the folder is self-contained: no network resources, figures by
relative path so a reviewer can open any file on its own)::

    <dir>/index.html        the report, figures referenced as figures/*.png
    <dir>/report.md         the same in Markdown
    <dir>/results.json      every number with its provenance (summary.FORMAT)
    <dir>/figures/*.png     estimates with intervals, per slice, weights, and each
                            extra section's figures

Extra sections (failure modes, calibration, drift, online-bounded numbers:
`ReportSection`, built by their own modules) are laid out the same way each:
a heading and the section's body after the OPE tables, its figures under
``figures/``, its numbers under ``results.json["sections"][key]``, its
limitations merged into "known limitations and assumptions" under the
section's title. Tables and Markdown/HTML helpers are shared with the
protocol evidence package (``service.reports.protocol.package``).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.ope import Estimate
from service.reports.ope import decision
from service.reports.ope.decision import TimeRange
from service.reports.ope.figures import all_figures
from service.reports.ope.limitations import ASSUMPTIONS, limitations
from service.reports.ope.marks import THIN_ESS, range_of
from service.reports.ope.ope_run import SLICE_TITLES, OpeReport, Provenance
from service.reports.ope.sections import ReportSection
from service.reports.ope.summary import (
    RESULT_HEAD,
    difference_mark,
    estimate_cells,
    fmt,
    interval_text,
    report_json,
    result_table,
)
from service.reports.protocol.tables import TABLE_STYLE, Cell, TableCell, html_table, md_table

PROVENANCE_NOTE = {
    Provenance.SIMULATED: "simulated traffic and outcomes",
    Provenance.SHADOW_LOGGED: "production traffic; candidates never acted (off-policy)",
    Provenance.ONLINE_BOUNDED: "a bound from an online protocol in which the candidate acted",
}
SLICE_HEAD = ["policy", "label", "value", "interval", "n", "ESS", "provenance", "marks"]
"""The slice dimension is the table's title, not a column."""
ONLINE_SECTION = "online_bounded"
"""Key of the section that carries online-bounded numbers (``online_section``)."""
DIFF_HEAD = ["policy", "estimator", "policy − production", "n", "provenance", "verdict", "marks"]
ESTIMATES_FIGURE = "estimates.png"
"""Shown in the decision summary; every other figure under "Figures"."""
Table = tuple[str, list[str], list[list[TableCell]]]


@dataclass(frozen=True, eq=False)
class OpePackage:
    """A built package; `figures` maps a file name to PNG bytes."""

    results: Mapping[str, Any]
    markdown: str
    html: str
    figures: Mapping[str, bytes]

    def write(self, directory: Path) -> Path:
        """Lay the package out under `directory` (module docstring); returns ``index.html``."""
        (directory / "figures").mkdir(parents=True, exist_ok=True)
        for name, png in self.figures.items():
            (directory / "figures" / name).write_bytes(png)
        (directory / "results.json").write_text(json.dumps(self.results, indent=2))
        (directory / "report.md").write_text(self.markdown)
        path = directory / "index.html"
        path.write_text(self.html)
        return path


def _facts(
    report: OpeReport, source: str, created_at: float, span: TimeRange | None
) -> list[tuple[str, str]]:
    reward = range_of(report.reward)
    return [
        ("data", "requests received " + (span.text() if span else "(time range not given)")),
        ("source", source),
        ("created", datetime.fromtimestamp(created_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("reward", f"{report.reward.value}, range {reward.text()}"),
        ("joined rounds read", str(report.rounds)),
        ("interval level", f"{report.level:.0%} (estimates: normal; each verdict names its own)"),
        ("provenance", f"{report.provenance.value}: {PROVENANCE_NOTE[report.provenance]}"),
        (
            "marks",
            f"greyed, value in parentheses: outside the reward's range, or effective "
            f"sample size below {THIN_ESS:g} (too thin); intervals shown clipped to the range",
        ),
    ]


def _diff_rows(report: OpeReport) -> list[list[TableCell]]:
    reward = range_of(report.reward)
    rows: list[list[TableCell]] = []
    for p in report.policies:
        m = difference_mark(p, reward)
        cell: TableCell = interval_text(p.vs_production)
        if m is not None and not m.plain:
            cell = Cell(m.interval_text(), m.note)
        note = "" if m is None else m.note
        rows.append([p.label, p.primary.value, cell, str(p.n), p.provenance.value, p.verdict, note])
    return rows


def _slice_rows(report: OpeReport, dimension: str) -> list[list[TableCell]]:
    rows: list[list[TableCell]] = []
    reward = range_of(report.reward)
    for p in report.policies:
        for label, r in sorted(p.slices.get(dimension, {}).items()):
            value, interval, note = estimate_cells(r, reward)
            n = r.n if isinstance(r, Estimate) else r.diagnostics.n
            ess = fmt(r.diagnostics.ess, 3)
            tag = p.provenance.value
            rows.append([p.label, label, value, interval, str(n), ess, tag, note])
    return rows


def _dimensions(report: OpeReport) -> list[str]:
    """Slice dimensions present, in `SLICE_TITLES` order, then any others."""
    present = {dim for p in report.policies for dim in p.slices}
    return [d for d in SLICE_TITLES if d in present] + sorted(present - set(SLICE_TITLES))


def _sections(report: OpeReport) -> list[Table]:
    """(title, head, rows) of every full table; a table with no rows is left out."""
    tables: list[Table] = [
        ("Estimates per policy", [*RESULT_HEAD, "marks"], result_table(report)),
        ("Difference to production (paired, same rounds)", DIFF_HEAD, _diff_rows(report)),
    ]
    tables += [
        (f"Estimates per {SLICE_TITLES.get(d, d)}", SLICE_HEAD, _slice_rows(report, d))
        for d in _dimensions(report)
    ]
    return [t for t in tables if t[2]]


def _check_sections(sections: Sequence[ReportSection], figures: Mapping[str, bytes]) -> None:
    keys = [s.key for s in sections]
    if len(set(keys)) != len(keys):
        raise ValueError(f"section keys must be unique, got {keys}")
    names = list(figures) + [n for s in sections for n in s.figures]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise ValueError(f"figure names used twice: {clash}")


@dataclass(frozen=True, eq=False)
class _Page:
    """Everything the Markdown and the HTML lay out, in page order."""

    facts: list[tuple[str, str]]
    production: str
    general: list[str]
    head: list[str]
    decisions: list[list[TableCell]]
    binding: list[tuple[str, str, list[str]]]
    tables: list[Table]
    figures: list[str]
    extra: Sequence[ReportSection]
    findings: list[str]


def _production_line(report: OpeReport) -> str:
    if report.production_value is None:
        return "Production: no observed reward in this window."
    n = report.production.n if report.production else 0
    return (
        f"Production (observed, on-policy): {fmt(report.production_value)} "
        f"{interval_text(report.production)} over {n} rounds; the dashed line in the plot."
    )


def build_ope_package(
    report: OpeReport,
    *,
    source: str,
    created_at: float | None = None,
    sections: Sequence[ReportSection] = (),
    span: TimeRange | None = None,
) -> OpePackage:
    """The package of `report`, read from `source` (e.g. the database and the filter),
    with the extra `sections` laid out after the OPE tables, in the order given.

    `span` is the time range of the data read (``decision.time_range(log.received_at)``),
    shown in the header; without it the header says it was not given.
    """
    when = datetime.now(UTC).timestamp() if created_at is None else created_at
    own = all_figures(report)
    _check_sections(sections, own)
    figures = {**own, **{n: png for s in sections for n, png in s.figures.items()}}
    online = any(s.key == ONLINE_SECTION for s in sections)
    findings = limitations(report, online_bounded=online)
    findings += [f"{s.title}: {text}" for s in sections for text in s.limitations]
    results = {
        **report_json(report),
        "source": source,
        "created_at": when,
        "time_range": None if span is None else {"first": span.first, "last": span.last},
        "limitations": findings,
        "assumptions": list(ASSUMPTIONS),
        "figures": sorted(figures),
        "sections": {s.key: {"title": s.title, **s.results} for s in sections},
    }
    page = _Page(
        facts=_facts(report, source, when, span),
        production=_production_line(report),
        general=decision.general_findings(report),
        head=decision.head(report),
        decisions=decision.decision_rows(report),
        binding=[(p.label, p.verdict, decision.binding(report, p)) for p in report.policies],
        tables=_sections(report),
        figures=sorted(n for n in own if n != ESTIMATES_FIGURE),
        extra=sections,
        findings=findings,
    )
    return OpePackage(results=results, markdown=_markdown(page), html=_html(page), figures=figures)


TITLE = "Off-policy evaluation evidence"
NO_POLICY = "No candidate policy was logged in this window: there is nothing to decide on."
FULL_TABLES = "Full tables"


def _markdown(page: _Page) -> str:
    lines = [f"# {TITLE}", ""]
    lines += [f"- **{k}**: {v}" for k, v in page.facts]
    lines += ["", f"## {decision.TITLE}", "", page.production, ""]
    lines += [f"- {g}" for g in page.general]
    lines += ["", *(md_table(page.head, page.decisions) if page.decisions else [NO_POLICY])]
    lines += [""]
    lines += [f"![{ESTIMATES_FIGURE}](figures/{ESTIMATES_FIGURE})"]
    lines += ["", "### What binds each verdict"]
    for label, verdict, found in page.binding:
        lines += ["", f"**{label}**: {verdict}", ""]
        lines += [f"- {f}" for f in found] or ["- nothing beyond the assumptions below"]
    lines += ["", f"## {FULL_TABLES}"]
    for title, head, rows in page.tables:
        lines += ["", f"### {title}", "", *md_table(head, rows)]
    lines += ["", "## Figures", ""]
    lines += [f"![{name}](figures/{name})" for name in page.figures]
    for s in page.extra:
        lines += ["", f"## {s.title}", "", s.markdown.rstrip()]
    lines += ["", "## Known limitations and assumptions", "", "### Found in this data", ""]
    lines += [f"- {f}" for f in page.findings]
    lines += ["", "### Assumed throughout", ""]
    lines += [f"- {a}" for a in ASSUMPTIONS]
    return "\n".join(lines) + "\n"


def _items(texts: Sequence[str]) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(t)}</li>" for t in texts) + "</ul>"


def _figure(name: str) -> str:
    n = html.escape(name)
    return f'<figure><img alt="{n}" src="figures/{n}"/><figcaption>{n}</figcaption></figure>'


STYLE = (
    "*{box-sizing:border-box}body{font-family:sans-serif;max-width:80em;margin:auto;padding:0 1em}"
    "table{border-collapse:collapse;margin-bottom:1em}"
    "td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top}"
    "img{max-width:100%}figure{margin:1em 0}"
    "dl.binding dt{font-weight:bold;margin-top:.5em}dl.binding dd{margin-left:1.5em}"
    "section.decision{border:2px solid #444;padding:0 1em;margin:1em 0;overflow-x:auto}"
    + TABLE_STYLE
)


def _html(page: _Page) -> str:
    facts = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in page.facts)
    binding = "".join(
        f"<dt>{html.escape(label)}: <i>{html.escape(verdict)}</i></dt><dd>"
        f"{_items(found) if found else 'nothing beyond the assumptions below'}</dd>"
        for label, verdict, found in page.binding
    )
    summary = (
        f'<section class="decision"><h2>{decision.TITLE}</h2>'
        f"<p>{html.escape(page.production)}</p>{_items(page.general)}"
        f"{html_table(page.head, page.decisions) if page.decisions else NO_POLICY}"
        f"{_figure(ESTIMATES_FIGURE)}"
        f'<h3>What binds each verdict</h3><dl class="binding">{binding}</dl></section>'
    )
    tables = "".join(f"<h3>{html.escape(t)}</h3>{html_table(h, r)}" for t, h, r in page.tables)
    images = "".join(_figure(n) for n in page.figures)
    bodies = "".join(f"<h2>{html.escape(s.title)}</h2>{s.html}" for s in page.extra)
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{TITLE}</title><style>{STYLE}</style></head><body>"
        f"<h1>{TITLE}</h1><ul>{facts}</ul>{summary}"
        f"<h2>{FULL_TABLES}</h2>{tables}"
        f"<h2>Figures</h2>{images}{bodies}"
        "<h2>Known limitations and assumptions</h2>"
        f"<h3>Found in this data</h3>{_items(page.findings)}"
        f"<h3>Assumed throughout</h3>{_items(ASSUMPTIONS)}</body></html>"
    )
