"""The "Drift" section of the evidence package: logged inputs against each policy's training data.

For every policy with a ``training_summary.json`` (`service.policies.training_summary`),
the logged requests in the filter are decoded from their stored raw payloads
(as ``understudy replay`` does), featurised again with the running feature
function, and fed in journal order through the same accumulator the live
monitor uses (`service.checks.drift.WindowAccumulator`): per feature PSI and KS
over the whole period (the top drifting features), hardware classes and
workload kinds never seen in training, the share of the policy's logged
decisions made on out-of-support inputs, and the flag rule per window of
``N`` requests, drawn over time — with the arrival check of each window (the
logged requests' ``request_time`` in journal order, as the live monitor sees
them). Numbers are shadow-logged inputs: no outcome
or off-policy weight enters them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import Engine, func, select

from service.checks.drift import (
    NO_DECISION,
    WindowAccumulator,
    WindowDrift,
    ks_pvalue,
    request_categories,
    select_rule,
)
from service.policies.batching import make_batch
from service.policies.errors import PolicyLoadError
from service.policies.manifest import MANIFEST_FILE, load_manifest
from service.policies.registry import with_manifest_families
from service.policies.training_summary import SUMMARY_FILE, TrainingReference, load_summary
from service.reports.canvas import figure, file_name, png
from service.reports.ope.decoded import read_requests
from service.reports.ope.sections import ReportSection
from service.reports.protocol.package import html_table, md_table
from service.storage.engine import unavailable_on_failure
from service.storage.log import tables as t
from service.storage.reads.ope import OpeFilter

CHUNK = 500
"""Requests decoded and featurised at a time."""
TOP_FEATURES = 8
MIN_WINDOWS = 10
"""The report's window is the largest calibrated size giving at least this many windows."""
FEATURE_HEAD = ["policy", "feature", "PSI", "KS", "KS p (iid rows)", "train min..max"]


@dataclass
class _PolicyDrift:
    summary: TrainingReference
    windows: WindowAccumulator
    whole: WindowAccumulator
    closed: list[WindowDrift] = field(default_factory=list)


def _request_ids(engine: Engine, where: OpeFilter) -> list[str]:
    """Logged request ids in the filter, in journal order (the order the scorer saw them)."""
    r = t.requests
    conditions: list[Any] = []
    if where.since is not None:
        conditions.append(r.c.received_at >= _ts(where.since))
    if where.until is not None:
        conditions.append(r.c.received_at < _ts(where.until))
    for column, value in (
        (r.c.workload_kind, where.workload_kind),
        (r.c.tenant, where.tenant),
        (r.c.model_family, where.model_family),
    ):
        if value is not None:
            conditions.append(column == value)
    query = select(r.c.request_id).where(*conditions).order_by(r.c.journal_seq, r.c.request_id)
    with unavailable_on_failure("reading logged requests for drift"), engine.connect() as conn:
        return [str(row[0]) for row in conn.execute(query)]


def _ts(seconds: float) -> Any:
    return func.to_timestamp(seconds)


def _chosen(engine: Engine, ids: Sequence[str], policies: Sequence[str]) -> dict[str, NDArray[Any]]:
    """Per policy, its logged chosen option per request (`NO_DECISION` when not logged)."""
    d = t.decisions
    where = {rid: i for i, rid in enumerate(ids)}
    out = {p: np.full(len(ids), NO_DECISION, dtype=np.int64) for p in policies}
    with unavailable_on_failure("reading chosen options for drift"), engine.connect() as conn:
        query = select(d.c.request_id, d.c.policy_name, d.c.chosen_option).where(
            d.c.request_id.in_(list(ids)), d.c.policy_name.in_(list(policies))
        )
        for rid, name, chosen in conn.execute(query):
            out[str(name)][where[str(rid)]] = int(chosen)
    return out


def training_summaries(
    policies_dir: Path, only: Sequence[str], topic: str = "Drift"
) -> tuple[dict[str, TrainingReference], list[str]]:
    """Every policy's loadable training summary (only those in `only`, when given), and a
    limitation sentence for each refused one, naming the `topic` it is missing from."""
    out: dict[str, TrainingReference] = {}
    refused: list[str] = []
    for path in sorted(policies_dir.glob(f"*/{SUMMARY_FILE}")):
        name = path.parent.name
        if only and name not in only:
            continue
        try:
            summary = load_summary(path.parent)
            manifest = path.parent / MANIFEST_FILE
            if summary is not None and manifest.is_file():
                summary = with_manifest_families(summary, load_manifest(manifest))
        except PolicyLoadError as exc:
            refused.append(f"{topic} of `{name}` is not reported: {exc.problem}.")
            continue
        if summary is not None:
            out[name] = summary
    return out, refused


def _window_size(summary: TrainingReference, n_requests: int) -> int:
    sizes = sorted(r.window_requests for r in summary.rules)
    fitting = [s for s in sizes if n_requests // s >= MIN_WINDOWS]
    return fitting[-1] if fitting else sizes[0]


def _chunks(ids: Sequence[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), CHUNK):
        yield list(ids[start : start + CHUNK])


def _accumulate(engine: Engine, ids: list[str], drift: dict[str, _PolicyDrift]) -> None:
    for chunk in _chunks(ids):
        decoded = read_requests(engine, chunk)
        requests = [decoded[rid] for rid in chunk if rid in decoded]
        if not requests:
            continue
        batch = make_batch(requests)
        cats = [request_categories(r) for r in requests]
        chosen = _chosen(engine, [r.request_id for r in requests], list(drift))
        times = np.array([r.request_time for r in requests], dtype=np.float64)
        for name, p in drift.items():
            p.closed += p.windows.feed(batch.features, batch.offsets, cats, chosen[name], times)
            p.whole.feed(batch.features, batch.offsets, cats, chosen[name], times)


def _plot(name: str, p: _PolicyDrift) -> bytes:
    """Window statistic over its threshold, arrival shift, out-of-support share, per window."""
    fig = figure(7.0, 5.6)
    top, middle, bottom = fig.subplots(3, 1, sharex=True)
    rule = p.windows.rule
    x = np.arange(1, len(p.closed) + 1)
    ratio = np.array([w.statistic / w.threshold for w in p.closed])
    flagged = np.array([w.flagged for w in p.closed], dtype=bool)
    if len(x):
        top.plot(x, ratio, marker="o", color="tab:blue", label="T / threshold")
        top.scatter(x[flagged], ratio[flagged], color="red", zorder=3, label="flagged")
        share = [w.out_of_support_decisions / max(w.decisions, 1) for w in p.closed]
        bottom.bar(x, share, color="tab:orange")
        bottom.set_ylim(0.0, max(0.05, 1.1 * max(share)))
        middle.plot(x, [w.arrival_shift for w in p.closed], marker="o", color="tab:green")
        arrival = np.array([w.arrival_flagged for w in p.closed], dtype=bool)
        shifts = np.array([w.arrival_shift for w in p.closed])
        middle.scatter(x[arrival], shifts[arrival], color="red", zorder=3)
        top.legend(fontsize=7, loc="best")  # nothing labelled to show without a window
    else:
        top.text(0.5, 0.5, "no complete window", ha="center", transform=top.transAxes)
    top.axhline(1.0, color="black", linestyle="--", linewidth=1)
    top.set_yscale("symlog", linthresh=1.0)
    top.set_ylabel("T / threshold")
    top.set_title(
        f"{name}: drift per window of {p.windows.window_requests} requests (shadow-logged inputs)",
        fontsize=10,
    )
    if rule.arrival_threshold is not None:
        for side in (-1.0, 1.0):
            middle.axhline(side * rule.arrival_threshold, color="black", linestyle="--", lw=1)
    else:
        middle.text(0.5, 0.5, "no arrival check", ha="center", transform=middle.transAxes)
    middle.set_ylabel("arrival shift\n(log, vs training)")
    bottom.set_ylabel("out-of-support\ndecision share")
    bottom.set_xlabel("window (journal order)")
    return png(fig)


def _feature_rows(name: str, w: WindowDrift, s: TrainingReference) -> list[list[str]]:
    ref = s.reference
    order = np.argsort(-np.nan_to_num(w.psi, nan=-1.0))[:TOP_FEATURES]
    return [
        [
            name,
            ref.names[f],
            f"{w.psi[f]:.4f}",
            f"{w.ks[f]:.4f}",
            f"{ks_pvalue(float(w.ks[f]), w.n_rows):.3g}",
            f"{ref.low[f]:.4g}..{ref.high[f]:.4g}",
        ]
        for f in order
    ]


def build_drift_section(
    engine: Engine, where: OpeFilter, policies_dir: Path
) -> ReportSection | None:
    """The section, or None when no policy in the filter has a training summary."""
    summaries, refused = training_summaries(policies_dir, where.policies)
    if not summaries:
        return None
    ids = _request_ids(engine, where)
    drift: dict[str, _PolicyDrift] = {}
    for name, s in summaries.items():
        size = _window_size(s, len(ids))
        rule = select_rule(s.rules, size)
        whole = WindowAccumulator(s.reference, rule, max(len(ids), rule.window_requests) + 1)
        drift[name] = _PolicyDrift(s, WindowAccumulator(s.reference, rule, size), whole)
    _accumulate(engine, ids, drift)

    results: dict[str, Any] = {"requests": len(ids), "policies": []}
    rows: list[list[str]] = []
    summary_rows: list[list[str]] = []
    figures: dict[str, bytes] = {}
    limitations = list(refused)
    for name, p in drift.items():
        period = p.whole.close()
        n_flag = sum(w.flagged for w in p.closed)
        share = period.out_of_support_decisions / period.decisions if period.decisions else math.nan
        fig = "drift-" + file_name(name)
        figures[fig] = _plot(name, p)
        if period.n_rows:
            rows += _feature_rows(name, period, p.summary)
        summary_rows.append(
            [
                name,
                str(period.n_requests),
                f"{n_flag} / {len(p.closed)} of {p.windows.window_requests}",
                _arrival_cell(p),
                f"{period.psi_max:.4f}",
                ", ".join(period.unseen_hardware) or "none",
                ", ".join(period.unseen_kinds) or "none",
                ", ".join(period.unseen_qos) or "none",
                "n/a" if math.isnan(share) else f"{share:.1%}",
            ]
        )
        results["policies"].append(
            {
                "policy": name,
                "requests": period.n_requests,
                "rows": period.n_rows,
                "window_requests": p.windows.window_requests,
                "alpha": p.windows.rule.alpha,
                "threshold": p.windows.rule.threshold,
                "arrival_center": p.windows.rule.arrival_center,
                "arrival_threshold": p.windows.rule.arrival_threshold,
                "arrival": _finite_one(period.arrival),
                "windows": [
                    {
                        "statistic": w.statistic,
                        "psi_max": w.psi_max,
                        "flagged": w.flagged,
                        "arrival": _finite_one(w.arrival),
                        "arrival_shift": _finite_one(w.arrival_shift),
                        "arrival_flagged": w.arrival_flagged,
                        "out_of_support_decisions": w.out_of_support_decisions,
                        "decisions": w.decisions,
                    }
                    for w in p.closed
                ],
                "psi": dict(zip(p.summary.reference.names, _finite(period.psi), strict=True)),
                "ks": dict(zip(p.summary.reference.names, _finite(period.ks), strict=True)),
                "unseen_hardware": list(period.unseen_hardware),
                "unseen_kinds": list(period.unseen_kinds),
                "unseen_qos": list(period.unseen_qos),
                "unseen_families": list(period.unseen_families),
                "out_of_support_decisions": period.out_of_support_decisions,
                "decisions": period.decisions,
                "figure": f"figures/{fig}",
            }
        )
        if n_flag:
            limitations.append(
                f"`{name}` saw inputs unlike its training data in {n_flag} of {len(p.closed)}"
                f" windows of {p.windows.window_requests} requests; its estimates there"
                " extrapolate beyond what it was trained on."
            )
        unseen_all = [
            *period.unseen_hardware,
            *period.unseen_kinds,
            *period.unseen_qos,
            *(f"model family {f}" for f in period.unseen_families),
        ]
        if unseen_all:
            unseen = ", ".join(unseen_all)
            limitations.append(f"`{name}` scored categories never seen in training: {unseen}.")
    head = [
        "policy",
        "requests",
        "flagged windows",
        "arrival-flagged windows",
        "PSI max (period)",
        "unseen hardware",
        "unseen kinds",
        "unseen QoS",
        "out-of-support decisions",
    ]
    intro = (
        "Logged inputs (every option's contract features) against each policy's training"
        " summary: PSI and KS per feature over the whole period, categories never seen in"
        " training, the share of decisions made on out-of-support inputs, and the calibrated"
        " flag rule per window of N requests (false-flag rate alpha under training conditions;"
        " docs/drift.md), with the arrival check: the log upper quartile of positive gaps"
        " between consecutive request times against its training median (shift in log"
        " units, negative when requests come faster; its own false-flag rate alpha)."
        " KS p-values treat rows as independent and are descriptive only."
        " Source: shadow-logged requests."
    )
    md = [intro, "", *md_table(head, summary_rows), "", "Top drifting features:", ""]
    md += md_table(FEATURE_HEAD, rows or [["-"] * len(FEATURE_HEAD)])
    md += [""] + [f"![drift of {n}](figures/drift-{file_name(n)})" for n in drift]
    body = [f"<p>{html.escape(intro)}</p>", html_table(head, summary_rows)]
    body += ["<p>Top drifting features:</p>"]
    body += [html_table(FEATURE_HEAD, rows or [["-"] * len(FEATURE_HEAD)])]
    body += [
        f'<img src="figures/drift-{html.escape(file_name(n))}" alt="drift of {html.escape(n)}">'
        for n in drift
    ]
    return ReportSection(
        key="drift",
        title="Drift of inputs against training data",
        markdown="\n".join(md) + "\n",
        html="\n".join(body),
        figures=figures,
        results=results,
        limitations=tuple(limitations),
    )


def _arrival_cell(p: _PolicyDrift) -> str:
    """Windows flagged by the arrival check, with the median shift; n/a without one."""
    rule = p.windows.rule
    if rule.arrival_threshold is None:
        return "n/a (no arrival process in training)"
    n = sum(w.arrival_flagged for w in p.closed)
    shifts = [w.arrival_shift for w in p.closed if math.isfinite(w.arrival_shift)]
    median = f", median shift {float(np.median(shifts)):+.2f}" if shifts else ""
    return f"{n} / {len(p.closed)} (band ±{rule.arrival_threshold:.2f}{median})"


def _finite_one(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _finite(values: NDArray[np.float64]) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in values]
