"""An evidence package: what a safety reviewer reads to judge one experiment.

It holds the locked protocol and its content hash, the event timeline (who
moved the experiment, when, why, with which criterion), each criterion's
latest evaluation (value, bound, threshold, status) and its trajectory plot.
`build_package` is pure (inputs in, text and PNG bytes out); the evaluator
stores a snapshot for every verdict it records, and `write` lays a package
out as files::

    <dir>/evidence.md       Markdown, figures referenced as figures/<criterion>.png
    <dir>/evidence.html     one self-contained page (figures inlined)
    <dir>/summary.json      the machine-readable summary
    <dir>/figures/*.png
"""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from service.protocols import ProtocolEvent, RecordedProtocol
from service.protocols.criteria import Evaluation
from service.reports.protocol.plots import trajectory_png
from service.reports.protocol.tables import TABLE_STYLE, html_table, md_table

__all__ = ["FORMAT", "EvidencePackage", "Judged", "build_package", "html_table", "md_table"]

FORMAT = "understudy-evidence/v1"


class Judged(Protocol):
    """A stored evaluation: the judgement and when it was made (Unix seconds)."""

    @property
    def evaluation(self) -> Evaluation: ...
    @property
    def evaluated_at(self) -> float: ...


@dataclass(frozen=True, eq=False)
class EvidencePackage:
    """A built package; `figures` maps a file name to PNG bytes."""

    summary: Mapping[str, Any]
    markdown: str
    html: str
    figures: Mapping[str, bytes]

    def write(self, directory: Path) -> Path:
        """Lay the package out under `directory` (module docstring); returns the Markdown path."""
        (directory / "figures").mkdir(parents=True, exist_ok=True)
        for name, png in self.figures.items():
            (directory / "figures" / name).write_bytes(png)
        (directory / "evidence.html").write_text(self.html)
        (directory / "summary.json").write_text(json.dumps(self.summary, indent=2, default=str))
        path = directory / "evidence.md"
        path.write_text(self.markdown)
        return path


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def _file(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) + ".png"


def _latest(history: Sequence[Judged]) -> dict[str, Judged]:
    out: dict[str, Judged] = {}
    for h in history:
        out[h.evaluation.name] = h
    return out


def build_package(
    record: RecordedProtocol, events: Sequence[ProtocolEvent], history: Sequence[Judged]
) -> EvidencePackage:
    """The package of `record` with its `events` and stored evaluations (oldest first)."""
    latest = _latest(history)
    verdict = next((e for e in reversed(events) if e.actor_role == "system"), None)
    figures: dict[str, bytes] = {}
    for name in latest:
        points = [(h.evaluated_at, h.evaluation) for h in history if h.evaluation.name == name]
        if any(e.value is not None for _, e in points):
            figures[_file(name)] = trajectory_png(name, points, verdict.at if verdict else None)
    summary = {
        "format": FORMAT,
        "protocol_id": record.protocol_id,
        "version": record.version,
        "content_sha256": record.content_sha256,
        "state": record.state.value,
        "mode": record.mode.value,
        "started_at": record.started_at,
        "verdict": None
        if verdict is None
        else {
            "action": verdict.action.value,
            "criterion": verdict.criterion,
            "reason": verdict.reason,
            "seq": verdict.seq,
            "at": verdict.at,
            "lease": dict(verdict.evidence.get("lease", {})),
        },
        "criteria": {n: h.evaluation.summary() for n, h in latest.items()},
        "events": len(events),
        "figures": sorted(figures),
    }
    return EvidencePackage(
        summary=summary,
        markdown=_markdown(record, events, latest, figures, verdict),
        html=_html(record, events, latest, figures, verdict),
        figures=figures,
    )


def _title(record: RecordedProtocol) -> str:
    title = str(record.document.get("title") or record.protocol_id)
    return f"{title} (`{record.protocol_id}` v{record.version})"


def _html_title(record: RecordedProtocol) -> str:
    """`_title` with its Markdown code span as ``<code>`` (a browser shows backticks)."""
    title = html.escape(str(record.document.get("title") or record.protocol_id))
    return f"{title} (<code>{html.escape(record.protocol_id)}</code> v{record.version})"


def _facts(record: RecordedProtocol, verdict: ProtocolEvent | None) -> list[tuple[str, str]]:
    facts = [
        ("content sha256", record.content_sha256),
        ("mode", record.mode.value),
        ("state", record.state.value),
        ("started", _when(record.started_at) if record.started_at else "—"),
        ("hypothesis", str(record.document.get("hypothesis", "")).strip()),
    ]
    if verdict is not None:
        facts.append(("verdict", f"{verdict.action.value} on `{verdict.criterion}`"))
        facts.append(("why", verdict.reason))
    return facts


def _timeline(events: Sequence[ProtocolEvent]) -> list[list[str]]:
    return [
        [
            str(e.seq),
            _when(e.at),
            e.action.value,
            f"{e.from_state.value if e.from_state else '—'} → {e.to_state.value}",
            f"{e.actor} ({e.actor_role})",
            e.criterion or "",
            e.reason,
        ]
        for e in events
    ]


TIMELINE = ["seq", "at", "action", "state", "actor", "criterion", "reason"]
CRITERIA = ["criterion", "role", "metric", "status", "value", "bound", "threshold", "n", "alpha"]


def _criteria(latest: Mapping[str, Judged]) -> list[list[str]]:
    return [
        [
            n,
            e.role.value,
            e.metric,
            e.status.value,
            _fmt(e.value),
            _fmt(e.bound),
            _fmt(e.threshold),
            str(e.n),
            _fmt(e.alpha),
        ]
        for n, e in ((n, h.evaluation) for n, h in latest.items())
    ]


def _markdown(
    record: RecordedProtocol,
    events: Sequence[ProtocolEvent],
    latest: Mapping[str, Judged],
    figures: Mapping[str, bytes],
    verdict: ProtocolEvent | None,
) -> str:
    lines = [f"# Evidence: {_title(record)}", ""]
    lines += [f"- **{k}**: {v}" for k, v in _facts(record, verdict)]
    lines += ["", "## Event timeline", "", *md_table(TIMELINE, _timeline(events))]
    lines += [
        "",
        "## Criteria (latest evaluation)",
        "",
        *md_table(CRITERIA, _criteria(latest)),
    ]
    lines += ["", "## Trajectories", ""]
    lines += [f"![{name}](figures/{name})" for name in sorted(figures)] or ["(no numbers yet)"]
    doc = json.dumps(record.document, indent=2, sort_keys=True)
    lines += ["", "## Protocol (the locked document)", "", "```json", doc, "```", ""]
    return "\n".join(lines)


def _html(
    record: RecordedProtocol,
    events: Sequence[ProtocolEvent],
    latest: Mapping[str, Judged],
    figures: Mapping[str, bytes],
    verdict: ProtocolEvent | None,
) -> str:
    facts = "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(v.replace('`', ''))}</li>"
        for k, v in _facts(record, verdict)
    )
    images = "".join(
        f'<figure><img alt="{html.escape(n)}" src="data:image/png;base64,'
        f'{base64.b64encode(png).decode()}"/><figcaption>{html.escape(n)}</figcaption></figure>'
        for n, png in sorted(figures.items())
    )
    doc = html.escape(json.dumps(record.document, indent=2, sort_keys=True))
    style = (
        "body{font-family:sans-serif;max-width:60em;margin:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}" + TABLE_STYLE
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>Evidence {html.escape(record.protocol_id)} v{record.version}</title>"
        f"<style>{style}</style></head><body>"
        f"<h1>Evidence: {_html_title(record)}</h1><ul>{facts}</ul>"
        f"<h2>Event timeline</h2>{html_table(TIMELINE, _timeline(events))}"
        f"<h2>Criteria (latest evaluation)</h2>{html_table(CRITERIA, _criteria(latest))}"
        f"<h2>Trajectories</h2>{images or '<p>(no numbers yet)</p>'}"
        f"<h2>Protocol (the locked document)</h2><pre>{doc}</pre></body></html>"
    )
