"""The "Calibration" section of the evidence package: predictors against joined outcomes.

For each policy that logged a predictor's quantiles, on the rows where its
prediction met an outcome (its chosen option was production's,
``service.storage.reads.calibration``): coverage per level with exact
binomial intervals, coverage per slice (workload kind, model family, tenant,
hardware class of the chosen option, hour of receipt), the flag rule on the
whole period and per hour, a PIT histogram and a reliability plot
(``service.checks.calibration``). Numbers are shadow-logged: the outcomes are of
production's placements, which the predictor's policy happened to choose too.
"""

from __future__ import annotations

import html
import math
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError
from numpy.typing import NDArray
from sqlalchemy import Engine

from service.checks.calibration import MIN_OUTCOMES, CalibrationReport, by_slice, calibrate
from service.contract import InvalidInput
from service.policies.errors import PolicyLoadError
from service.policies.manifest import MANIFEST_FILE, load_manifest
from service.reports.canvas import figure, file_name, png
from service.reports.ope.sections import ReportSection
from service.reports.protocol.package import html_table, md_table
from service.storage.log.payload import decode_request
from service.storage.reads.calibration import CalibrationRows, read_calibration
from service.storage.reads.ope import OpeFilter

TIME_WINDOW_S = 3600.0
"""Width of the time-window slice (hour of receipt)."""
COVERAGE_HEAD = ["policy", "level", "ends", "covered / n", "coverage", "95% interval", "p-value"]
SLICE_HEAD = ["policy", "slice", "value", "n", "50%", "80%", "90%", "flagged"]


def _hardware(rows: CalibrationRows) -> NDArray[np.str_]:
    """The hardware class of the chosen option's first node, "unknown" if not decodable."""
    out = []
    for payload, option in zip(rows.payload or [], rows.chosen_option, strict=False):
        try:
            request = decode_request(payload)
            node = int(request.options.nodes_of(int(option))[0])
            out.append(request.state.hardware_of(node).name)
        except (DecodeError, InvalidInput, IndexError):
            out.append("unknown")
    return np.array(out if out else ["unknown"] * rows.n, dtype=np.str_)


def pit_png(label: str, report: CalibrationReport) -> bytes:
    """PIT histogram with the uniform line."""
    fig = figure(6.0, 3.4)
    ax = fig.subplots()
    h = report.pit
    width = np.diff(h.edges)
    ax.bar(h.edges[:-1], h.counts, width=width, align="edge", edgecolor="black", alpha=0.7)
    ax.axhline(report.n / len(h.counts), color="black", linestyle="--", label="uniform")
    ax.set_xlabel("PIT (predictive CDF at the outcome)")
    ax.set_ylabel("outcomes")
    ax.set_title(f"{label}: PIT, n={report.n}, chi-square p={h.p_value:.2g}", fontsize=9)
    ax.legend(fontsize=7)
    return png(fig)


def reliability_png(label: str, report: CalibrationReport) -> bytes:
    """Observed vs predicted median per bin of the predicted median (log-log), with coverage."""
    fig = figure(6.0, 3.8)
    ax = fig.subplots()
    r = report.reliability
    if len(r.n):
        ax.loglog(r.predicted, r.observed, "o-", label="observed median")
        lo, hi = float(np.min(r.predicted)), float(np.max(r.predicted))
        ax.plot([lo, hi], [lo, hi], "k--", linewidth=1, label="calibrated")
        for x, y, c in zip(r.predicted, r.observed, r.coverage, strict=True):
            ax.annotate(f"{c:.0%}", (x, y), fontsize=6, textcoords="offset points", xytext=(3, 3))
        ax.legend(fontsize=7)
    ax.set_xlabel("predicted median (bin)")
    ax.set_ylabel("observed median")
    ax.set_title(f"{label}: reliability (labels: widest-interval coverage)", fontsize=9)
    return png(fig)


def _pct(x: float) -> str:
    return "—" if not math.isfinite(x) else f"{x:.1%}"


def _slices(rows: CalibrationRows, hardware: NDArray[np.str_]) -> dict[str, Any]:
    hours = (np.floor(rows.received_at / TIME_WINDOW_S) * TIME_WINDOW_S).astype(np.int64)
    return {
        "workload kind": rows.workload_kind,
        "model family": rows.model_family,
        "tenant": rows.tenant,
        "hardware class": hardware,
        "time window": hours,
    }


def _policy(rows: CalibrationRows) -> tuple[dict[str, Any], list[list[str]], list[list[str]]]:
    whole = calibrate(rows.taus, rows.quantiles, rows.outcome)
    label = f"{rows.policy}@{rows.version}"
    cov_rows = [
        [
            label,
            f"{c.level:g}",
            "logged" if c.exact else "implied",
            f"{c.covered} / {c.n}",
            _pct(c.observed),
            "—" if c.interval is None else f"[{c.interval.lower:.1%}, {c.interval.upper:.1%}]",
            f"{c.p_value:.2g}",
        ]
        for c in whole.coverage
    ]
    slice_rows: list[list[str]] = []
    slices: dict[str, dict[str, Any]] = {}
    for kind, keys in _slices(rows, _hardware(rows)).items():
        per: dict[Hashable, CalibrationReport] = by_slice(
            keys, rows.taus, rows.quantiles, rows.outcome
        )
        slices[kind] = {str(k): _summary(r) for k, r in per.items()}
        for value, r in per.items():
            slice_rows.append(
                [label, kind, str(value), str(r.n)]
                + [_pct(c.observed) for c in r.coverage]
                + ["yes" if r.flag.flagged else "no"]
            )
    result = {"policy": rows.policy, "version": rows.version, **_summary(whole)}
    result["unmatched"] = rows.unmatched
    result["slices"] = slices
    return result, cov_rows, slice_rows


def _summary(r: CalibrationReport) -> dict[str, Any]:
    def num(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {
        "n": r.n,
        "coverage": {
            f"{c.level:g}": {
                "covered": c.covered,
                "observed": num(c.observed),
                "interval": None
                if c.interval is None
                else [c.interval.lower, c.interval.upper, c.interval.level],
                "p_value": num(c.p_value),
                "ends": "logged" if c.exact else "implied",
            }
            for c in r.coverage
        },
        "pit_counts": r.pit.counts.tolist(),
        "pit_uniformity_p": num(r.pit.p_value),
        "flagged": r.flag.flagged,
        "flag_reason": r.flag.reason,
        "provenance": "shadow-logged",
    }


def build_calibration_section(
    engine: Engine, where: OpeFilter, policies_dir: Path
) -> ReportSection | None:
    """The section, or None when no policy logged a prediction that met an outcome.

    `policies_dir` names each policy's predictor from its manifest, when present.
    """
    read = [r for r in read_calibration(engine, where, with_payload=True) if r.n or r.unmatched]
    if not read:
        return None
    predictors = _predictor_names(policies_dir)
    results: list[dict[str, Any]] = []
    coverage_rows: list[list[str]] = []
    slice_rows: list[list[str]] = []
    figures: dict[str, bytes] = {}
    limitations: list[str] = []
    for rows in read:
        label = f"{rows.policy}@{rows.version}"
        if rows.n == 0:
            limitations.append(
                f"Calibration of {label}: none of its {rows.unmatched} joined predictions was "
                "for the option production took, so nothing is measured."
            )
            continue
        result, cov, sl = _policy(rows)
        result["predictor"] = predictors.get(rows.policy)
        results.append(result)
        coverage_rows += cov
        slice_rows += sl
        whole = calibrate(rows.taus, rows.quantiles, rows.outcome)
        figures[f"calibration-pit-{file_name(label)}"] = pit_png(label, whole)
        figures[f"calibration-reliability-{file_name(label)}"] = reliability_png(label, whole)
        if rows.n < MIN_OUTCOMES:
            limitations.append(
                f"Calibration of {label}: only {rows.n} matched outcomes (< {MIN_OUTCOMES}); "
                "it is not tested."
            )
        if whole.flag.flagged:
            limitations.append(f"Calibration of {label} is flagged: {whole.flag.reason}.")
    limitations.append(
        "Calibration is measured only where a policy's chosen option was production's "
        "(the only outcomes observed); predictions on other options are never checked."
    )
    limitations.append(
        "The 50% and 90% intervals are implied by the logged 10/50/90% quantiles (split "
        "log-normal between them); only the 80% interval is the predictor's own."
    )
    return ReportSection(
        key="calibration",
        title="Calibration of predictors",
        markdown=_markdown(coverage_rows, slice_rows, figures),
        html=_html(coverage_rows, slice_rows, figures),
        figures=figures,
        results={"policies": results, "time_window_s": TIME_WINDOW_S},
        limitations=tuple(limitations),
    )


def _predictor_names(policies_dir: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted(policies_dir.glob(f"*/{MANIFEST_FILE}")):
        try:
            m = load_manifest(path)
        except PolicyLoadError:
            continue
        if m.predictor is not None:
            out[m.name] = m.predictor
        elif m.planning is not None:
            out[m.name] = f"{m.name} (planner's own predictor)"
    return out


INTRO = (
    "Coverage of each predictor policy's central intervals on the outcomes of the options "
    "it chose when production chose the same (shadow-logged). `logged` ends are the "
    "predictor's own quantiles; `implied` ends are interpolated between them. A flag means "
    "Holm's procedure rejected calibration at one of the logged levels (docs/calibration.md)."
)


def _markdown(cov: list[list[str]], sl: list[list[str]], figures: dict[str, bytes]) -> str:
    lines = [INTRO, "", *md_table(COVERAGE_HEAD, cov), "", "Per slice:", ""]
    lines += md_table(SLICE_HEAD, sl)
    lines += [""] + [f"![{name}](figures/{name})" for name in figures]
    return "\n".join(lines) + "\n"


def _html(cov: list[list[str]], sl: list[list[str]], figures: dict[str, bytes]) -> str:
    images = "".join(
        f'<img src="figures/{html.escape(name)}" alt="{html.escape(name)}">' for name in figures
    )
    return (
        f"<p>{html.escape(INTRO)}</p>{html_table(COVERAGE_HEAD, cov)}"
        f"<p>Per slice:</p>{html_table(SLICE_HEAD, sl)}{images}"
    )
