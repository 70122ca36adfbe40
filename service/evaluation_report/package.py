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
protocol evidence package (``service.evidence.package``).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from service.evaluation_report.figures import all_figures
from service.evaluation_report.limitations import ASSUMPTIONS, limitations
from service.evaluation_report.ope_run import SLICE_TITLES, OpeReport, Provenance
from service.evaluation_report.sections import ReportSection
from service.evaluation_report.summary import (
    RESULT_HEAD,
    fmt,
    interval_text,
    report_json,
    result_rows,
)
from service.evidence.package import html_table, md_table
from service.ope import Estimate

PROVENANCE_NOTE = {
    Provenance.SIMULATED: "simulated traffic and outcomes",
    Provenance.SHADOW_LOGGED: "production traffic; candidates never acted (off-policy)",
    Provenance.ONLINE_BOUNDED: "a bound from an online protocol in which the candidate acted",
}
SLICE_HEAD = ["policy", "slice", "label", "value", "interval", "n", "ESS", "provenance"]
ONLINE_SECTION = "online_bounded"
"""Key of the section that carries online-bounded numbers (``online_section``)."""
DIFF_HEAD = ["policy", "estimator", "policy − production", "n", "provenance", "verdict"]


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


def _facts(report: OpeReport, source: str, created_at: float) -> list[tuple[str, str]]:
    return [
        ("source", source),
        ("created", datetime.fromtimestamp(created_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("reward", report.reward.value),
        ("joined rounds read", str(report.rounds)),
        ("interval level", f"{report.level:.0%} (normal)"),
        ("provenance", f"{report.provenance.value}: {PROVENANCE_NOTE[report.provenance]}"),
    ]


def _diff_rows(report: OpeReport) -> list[list[str]]:
    return [
        [
            p.label,
            p.primary.value,
            interval_text(p.vs_production),
            str(p.n),
            p.provenance.value,
            p.verdict,
        ]
        for p in report.policies
    ]


def _slice_rows(report: OpeReport, dimension: str) -> list[list[str]]:
    rows = []
    name = SLICE_TITLES.get(dimension, dimension)
    for p in report.policies:
        for label, r in sorted(p.slices.get(dimension, {}).items()):
            if isinstance(r, Estimate):
                cells = [fmt(r.value), interval_text(r.interval), str(r.n)]
            else:
                cells = ["not identifiable", "—", str(r.diagnostics.n)]
            rows.append(
                [p.label, name, label, *cells, fmt(r.diagnostics.ess, 3), p.provenance.value]
            )
    return rows


def _dimensions(report: OpeReport) -> list[str]:
    """Slice dimensions present, in `SLICE_TITLES` order, then any others."""
    present = {dim for p in report.policies for dim in p.slices}
    return [d for d in SLICE_TITLES if d in present] + sorted(present - set(SLICE_TITLES))


def _sections(report: OpeReport) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, head, rows) of every table; a table with no rows is left out."""
    tables = [
        ("Estimates per policy", RESULT_HEAD, result_rows(report)),
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


def build_ope_package(
    report: OpeReport,
    *,
    source: str,
    created_at: float | None = None,
    sections: Sequence[ReportSection] = (),
) -> OpePackage:
    """The package of `report`, read from `source` (e.g. the database and the filter),
    with the extra `sections` laid out after the OPE tables, in the order given."""
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
        "limitations": findings,
        "assumptions": list(ASSUMPTIONS),
        "figures": sorted(figures),
        "sections": {s.key: {"title": s.title, **s.results} for s in sections},
    }
    facts = _facts(report, source, when)
    tables = _sections(report)
    return OpePackage(
        results=results,
        markdown=_markdown(facts, tables, own, sections, findings),
        html=_html(facts, tables, own, sections, findings),
        figures=figures,
    )


TITLE = "Off-policy evaluation evidence"


def _markdown(
    facts: list[tuple[str, str]],
    sections: list[tuple[str, list[str], list[list[str]]]],
    figures: Mapping[str, bytes],
    extra: Sequence[ReportSection],
    findings: list[str],
) -> str:
    lines = [f"# {TITLE}", ""]
    lines += [f"- **{k}**: {v}" for k, v in facts]
    for title, head, rows in sections:
        lines += ["", f"## {title}", "", *md_table(head, rows)]
    lines += ["", "## Figures", ""]
    lines += [f"![{name}](figures/{name})" for name in sorted(figures)]
    for s in extra:
        lines += ["", f"## {s.title}", "", s.markdown.rstrip()]
    lines += ["", "## Known limitations and assumptions", "", "### Found in this data", ""]
    lines += [f"- {f}" for f in findings]
    lines += ["", "### Assumed throughout", ""]
    lines += [f"- {a}" for a in ASSUMPTIONS]
    return "\n".join(lines) + "\n"


def _html(
    facts: list[tuple[str, str]],
    sections: list[tuple[str, list[str], list[list[str]]]],
    figures: Mapping[str, bytes],
    extra: Sequence[ReportSection],
    findings: list[str],
) -> str:
    facts_html = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in facts)
    tables = "".join(
        f"<h2>{html.escape(title)}</h2>{html_table(head, rows)}" for title, head, rows in sections
    )
    images = "".join(
        f'<figure><img alt="{html.escape(n)}" src="figures/{html.escape(n)}"/>'
        f"<figcaption>{html.escape(n)}</figcaption></figure>"
        for n in sorted(figures)
    )
    bodies = "".join(f"<h2>{html.escape(s.title)}</h2>{s.html}" for s in extra)
    found = "".join(f"<li>{html.escape(f)}</li>" for f in findings)
    assumed = "".join(f"<li>{html.escape(a)}</li>" for a in ASSUMPTIONS)
    style = (
        "body{font-family:sans-serif;max-width:70em;margin:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}"
        "img{max-width:100%}"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{TITLE}</title><style>{style}</style></head><body>"
        f"<h1>{TITLE}</h1><ul>{facts_html}</ul>{tables}"
        f"<h2>Figures</h2>{images}{bodies}"
        "<h2>Known limitations and assumptions</h2>"
        f"<h3>Found in this data</h3><ul>{found}</ul>"
        f"<h3>Assumed throughout</h3><ul>{assumed}</ul></body></html>"
    )
